"""ModelRunner: executes one scheduler plan on a BatchDecoder's model and paged KV cache.

NOTE [one pass per plan]: the plan's decode rows (one token past the prefill) go through the
family's decode step in one call (``BatchDecoder.decode``: the weights read once for every
row, each row's logits as ``model.generate`` alone computes them, NOTE [batched = alone]);
its other rows (prefill chunks, resumed requests, k tokens to verify) go layer by layer
together, each row through ``model.run_layer`` alone over its own positions (NOTE [batched
prefill] in kael.models._batched), in plan order, so a row reusing blocks that an earlier
row of the same plan fills reads them after they are written (NOTE [kv allocation]). The
last positions that need logits share one LM-head product; a row with ``all_logits`` gets
every position's. A chunk that does not reach its request's end needs no logits at all.

The slots were allocated by the scheduler; if the pass fails, the rows' keys and values may
be half written, and the caller releases those rows without caching their blocks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _dtype as dt
from ..autograd import no_grad
from ..ops import cat, narrow, select, tensor, view
from .scheduler import SchedulerOutput

if TYPE_CHECKING:
    from .._tensor import Tensor
    from ..models import BatchDecoder

__all__ = ["ModelRunner", "StepLogits"]


class StepLogits:
    """A plan's logits, by plan row: ``row(i)`` is [V] (its last position), [n, V] (``all_logits``)
    or None (a chunk that does not reach its request's end). ``decode`` and ``extend`` hold the
    batched tensors, [rows, V] each, with ``decode_index``/``extend_index`` mapping plan rows
    into them (for one argmax over a whole batch)."""

    def __init__(self, n: int) -> None:
        self._rows: list[Tensor | None] = [None] * n
        self.batches: list[tuple[Tensor, list[int]]] = []
        """(logits [k, V], the plan rows of its k rows) for each batched product."""

    def row(self, i: int) -> Tensor | None:
        """Plan row ``i``'s logits (see the class)."""
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)


class ModelRunner:
    """Runs plans on ``decoder`` (NOTE [one pass per plan]). Not thread safe: one thread drives it."""

    def __init__(self, decoder: BatchDecoder) -> None:
        self.decoder = decoder
        self.model = decoder.model
        self.cache = decoder.cache

    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward pass over the plan's rows; their logits (``StepLogits``)."""
        out = StepLogits(len(plan.rows))
        decode = [i for i, r in enumerate(plan.rows) if r.decode and not r.all_logits]
        extend = [i for i, r in enumerate(plan.rows) if i not in set(decode)]
        if extend:
            self._extend(plan, extend, out)
        if decode:
            rows = [plan.rows[i] for i in decode]
            logits = self.decoder.decode([r.row for r in rows], [r.tokens[0] for r in rows])
            out.batches.append((logits, decode))
            for j, i in enumerate(decode):
                out._rows[i] = select(logits, 0, j)
        return out

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
                out._rows[i] = select(logits, 0, j)
        for i, full in fulls:
            out._rows[i] = full
