"""ModelRunner: executes one scheduler plan on a BatchDecoder's model and paged KV cache.

NOTE [one pass per plan]: the plan's one-token rows go through the family's decode step in one
call (``BatchDecoder.decode``: the weights read once for every row, each row's logits as
``model.generate`` alone computes them, NOTE [batched = alone]): decode steps, and a prompt's
last token after its cached prefix (a repeated prompt computes only that one, NOTE [partial
block] in kael.models._kv_blocks), whose logits the decode step computes to the same bits as
``model.run_layer`` does one token (tests/engine/test_runner_rows.py), so a new request joins the
step's one product instead of a pass of its own; its other rows (prefill chunks, resumed requests, k tokens to verify) go layer by layer
together, each row through ``model.run_layer`` alone over its own positions (NOTE [batched
prefill] in kael.models._batched), in plan order, so a row reusing blocks that an earlier
row of the same plan fills reads them after they are written (NOTE [kv allocation]). The
last positions that need logits share one LM-head product; a row with ``all_logits`` gets
every position's. A chunk that does not reach its request's end needs no logits at all.

NOTE [drafts in the decode step]: where the decoder's step takes positions (``BatchDecoder.takes_entries``:
GPT-2's, Llama's and most families' direct steps), a row verifying drafts joins the decode product as
one entry per token (``decode_entries``, NOTE [entries at positions] in kael.models._steps): one pass of
kernel calls for the whole step, where ``model.run_layer`` per verifying row costs a pass of frontend
calls each (on a small model, several plain steps' time, which ate what the drafts saved). Each
entry's logits have the bits of its token decoded alone, so verification stays exact.

NOTE [runner isolation]: a failure of the layer-by-layer group runs each of its rows again
alone (nothing was committed; their slots are simply written again), so only the row that
fails is reported, in ``StepLogits.errors``; a failure of the decode step, the one product
all its rows share, is every decode row's. The caller releases a failed row without caching
its blocks (their keys and values may be half written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .. import _dtype as dt
from ..autograd import no_grad
from ..ops import cat, narrow, select, tensor, view
from .scheduler import SchedulerOutput

if TYPE_CHECKING:
    from ..models import BatchDecoder

__all__ = ["ModelRunner", "Runner", "StepLogits", "isolate_rows"]


class StepLogits:
    """A plan's logits, by plan row: ``row(i)`` is [V] (its last position), [n, V] (``all_logits``)
    or None (a chunk that does not reach its request's end). ``decode`` and ``extend`` hold the
    batched tensors, [rows, V] each, with ``decode_index``/``extend_index`` mapping plan rows
    into them (for one argmax over a whole batch)."""

    def __init__(self, n: int) -> None:
        self._rows: list[Any] = [None] * n
        self.batches: list[tuple[Any, list[int]]] = []
        """(logits [k, V], the plan rows of its k rows) for each batched product."""
        self.errors: dict[int, BaseException] = {}
        """Plan rows whose pass failed (NOTE [runner isolation]), with the error."""
        self.decode_rows = 0
        """Rows of the step's decode product (a batch-size statistic)."""

    def row(self, i: int) -> Any:
        """Plan row ``i``'s logits (see the class)."""
        return self._rows[i]

    def set(self, i: int, logits: Any) -> None:
        """Plan row ``i``'s logits are ``logits`` (a runner's answer)."""
        self._rows[i] = logits

    def __len__(self) -> int:
        return len(self._rows)


def isolate_rows(rows: list[int], run: Callable[[list[int]], None], errors: dict[int, BaseException]) -> None:
    """``run(rows)`` (plan rows that share a pass); if it raises, each row alone, so that only the
    rows that fail by themselves land in ``errors`` (NOTE [runner isolation])."""
    try:
        run(rows)
    except Exception as exc:
        if len(rows) == 1:
            errors[rows[0]] = exc
            return
        for i in rows:  # each alone, to find whose it was
            try:
                run([i])
            except Exception as alone:
                errors[i] = alone


class Runner(Protocol):
    """What ``EngineCore`` asks of a runner: ``execute`` a plan; pick tokens from its logits
    (``greedy``: every row of one batched product at once; ``sample``: one row as
    ``model.generate`` draws it, the ``temperature``/``top_k`` fast path)."""

    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward pass over the plan's rows; their logits."""

    def greedy(self, batch: Any) -> list[int]:
        """Every row's argmax from one batched product's logits."""

    def sample(self, logits: Any, temperature: float, top_k: int, generator: Any) -> int:
        """A token from one row's logits (temperature and top_k only)."""


class ModelRunner:
    """Runs plans on ``decoder`` (NOTE [one pass per plan]). Not thread safe: one thread drives it."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.model = decoder.model
        self.cache = decoder.cache

    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward pass over the plan's rows; their logits (``StepLogits``)."""
        out = StepLogits(len(plan.rows))
        decode = [i for i, r in enumerate(plan.rows) if r.n == 1 and not r.all_logits]
        verify = [i for i, r in enumerate(plan.rows) if r.drafts and r.all_logits] if self.decoder.takes_entries else []
        extend = [i for i in range(len(plan.rows)) if i not in set(decode) | set(verify)]
        if extend:
            isolate_rows(extend, lambda which: self._extend(plan, which, out), out.errors)
        if decode or verify:
            rows = [plan.rows[i] for i in decode]
            out.decode_rows = len(rows)
            try:
                if verify:  # NOTE [drafts in the decode step]
                    checks = [plan.rows[i] for i in verify]
                    need = len(rows) + sum(r.n for r in checks)
                    if need > self.cache.step_rows:  # a step built for fewer entries (EngineCore.on sizes it)
                        self.decoder.allow_drafts(-(-need // self.decoder.rows) - 1)
                    logits = self.decoder.decode_entries(
                        [r.row for r in rows] + [r.row for r in checks for _ in r.tokens],
                        [r.tokens[0] for r in rows] + [t for r in checks for t in r.tokens],
                        [r.start for r in rows] + [r.start + j for r in checks for j in range(r.n)],
                    )
                else:
                    logits = self.decoder.decode([r.row for r in rows], [r.tokens[0] for r in rows])
            except Exception as exc:
                out.errors.update((i, exc) for i in decode + verify)
                return out
            if decode:
                out.batches.append((narrow(logits, 0, 0, len(decode)) if verify else logits, decode))
            for j, i in enumerate(decode):
                out.set(i, select(logits, 0, j))
            at = len(decode)
            for i in verify:
                n = plan.rows[i].n
                out.set(i, narrow(logits, 0, at, n))
                at += n
        return out

    def greedy(self, batch: Any) -> list[int]:
        """Each row's argmax from one product's logits [k, V] (``BatchDecoder.greedy``)."""
        return self.decoder.greedy(batch)

    def sample(self, logits: Any, temperature: float, top_k: int, generator: Any) -> int:
        """A token from one row's logits as ``model.generate`` draws it (``BatchDecoder.sample``)."""
        return self.decoder.sample(logits, temperature, top_k, generator)

    def _extend(self, plan: SchedulerOutput, which: list[int], out: StepLogits) -> None:
        model, cache = self.model, self.cache
        rows = [plan.rows[i] for i in which]
        with no_grad():
            steps = [cache.step([r.row], r.n) for r in rows]
            xs: list[Any] = [
                model.embed(tensor([list(r.tokens)], dtype=dt.int64, device=model.device), st.starts)
                for r, st in zip(rows, steps)
            ]
            for layer in range(model.num_layers):
                xs = [model.run_layer(layer, x, st) for x, st in zip(xs, steps)]
            lasts = [
                (i, narrow(x, 1, r.n - 1, 1)) for i, r, x in zip(which, rows, xs) if r.samples and not r.all_logits
            ]
            alls = [(i, x, r.n) for i, r, x in zip(which, rows, xs) if r.samples and r.all_logits]
            head = None
            if lasts:
                head = model.run_head(lasts[0][1] if len(lasts) == 1 else cat([x for _, x in lasts], 0))
            fulls = [(i, view(model.run_head(x), n, self.decoder.vocab_size)) for i, x, n in alls]
        for st in steps:
            st.commit()
        if head is not None:
            logits = view(head, len(lasts), self.decoder.vocab_size)
            out.batches.append((logits, [i for i, _ in lasts]))
            for j, (i, _) in enumerate(lasts):
                out.set(i, select(logits, 0, j))
        for i, full in fulls:
            out.set(i, full)
