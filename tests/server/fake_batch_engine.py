"""FakeBatchEngine: a BatchEngine with FakeModel's token rules per row, to drive the batch
scheduler through joins, failures and chunked prefills (tests/server/test_batching*.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from kael.engine import SchedulerOutput, StepLogits, isolate_rows

from .fakes import SECRET, FakeRows, Gate, RowLogits, draw_letter, greedy_letter

__all__ = ["FakeBatchEngine"]


class FakeBatchEngine(FakeRows):
    """A BatchEngine (kael_server.protocols: kael.engine's KVBackend and Runner in one object)
    with FakeModel's token rules, per cache row.

    Greedy picks a letter from the row's context (prompt + tokens fed), exactly as FakeModel
    does for the same prompt alone; sampling draws from the job's generator. Blocks never run
    out and nothing is cached by prefix. To force misbehaviour:

    * ``gate``: block before each decode step until the test lets it through;
    * ``fail_decode_at``: raise (with SECRET) in decode step number ``fail_decode_at`` (from 0);
    * ``fail_prefill``: raise (with SECRET) when prefilling a prompt it accepts (a step's
      prefills together fail, then each runs alone, as kael's ModelRunner does);
    * ``fail_sample``: raise (with SECRET) when sampling for a context it accepts;
    * ``poison``: for a context it accepts, sample token ``poison_token`` (which a
      PoisonTokenizer refuses to decode: a failure in that job's token handling).

    ``steps`` records the rows of every decode step; ``prefills`` the (row, prompt) of each
    prompt prefilled to its end; ``prefill_calls`` the rows of each prefill call (a step's
    prefill rows, or one row run alone); ``greedy_calls`` counts the ``greedy`` calls (one per
    product with several greedy rows); ``forks`` the (src, dst) of each ``fork``; ``plan_tokens``
    the tokens of each step's plan; ``chunks`` the (prompt, start, tokens) of each prefill row.
    """

    def __init__(
        self,
        rows: int,
        *,
        gate: Gate | None = None,
        fail_decode_at: int | None = None,
        fail_prefill: Callable[[tuple[int, ...]], bool] | None = None,
        fail_sample: Callable[[tuple[int, ...]], bool] | None = None,
        poison: Callable[[tuple[int, ...]], bool] | None = None,
        poison_token: int = 0,
    ) -> None:
        super().__init__(rows)
        self.gate = gate
        self.fail_decode_at = fail_decode_at
        self.fail_prefill = fail_prefill
        self.fail_sample = fail_sample
        self.poison = poison
        self.poison_token = poison_token
        self.steps: list[list[int]] = []
        self.prefills: list[tuple[int, list[int]]] = []
        self.prefill_calls: list[list[int]] = []
        self.greedy_calls = 0
        self.plan_tokens: list[int] = []
        self.chunks: list[tuple[tuple[int, ...], int, int]] = []
        self._rng = random.Random()

    # ---- kael.engine.Runner -------------------------------------------------------------------
    def execute(self, plan: SchedulerOutput) -> StepLogits:
        out = StepLogits(len(plan.rows))
        self.plan_tokens.append(plan.num_tokens)
        extend = [i for i, r in enumerate(plan.rows) if not r.decode]
        decode = [i for i, r in enumerate(plan.rows) if r.decode]
        if extend:  # a failing prefill group runs again row by row, as kael's ModelRunner does
            isolate_rows(extend, lambda which: self._extend(plan, which, out), out.errors)
        if decode:
            if self.gate is not None:
                self.gate.step()
            step = len(self.steps)
            rows = [plan.rows[i].row for i in decode]
            self.steps.append(rows)
            out.decode_rows = len(rows)
            if step == self.fail_decode_at:
                out.errors.update((i, RuntimeError(SECRET)) for i in decode)
                return out
            batch = []
            for i in decode:
                r = plan.rows[i]
                self.contexts[r.row].extend(r.tokens)
                batch.append(RowLogits(r.row, tuple(self.contexts[r.row])))
                out.set(i, batch[-1])
            out.batches.append((batch, decode))
        return out

    def _extend(self, plan: SchedulerOutput, which: list[int], out: StepLogits) -> None:
        self.prefill_calls.append([plan.rows[i].row for i in which])
        for i in which:
            if self.fail_prefill is not None and self.fail_prefill(tuple(plan.rows[i].request.prompt_ids)):
                raise RuntimeError(SECRET)
        lasts, rows = [], []
        for i in which:
            r = plan.rows[i]
            context = self.contexts[r.row]
            context.extend(r.tokens)
            self.chunks.append((tuple(r.request.prompt_ids), r.start, r.n))
            if r.samples:
                self.prefills.append((r.row, list(context)))
                lasts.append(RowLogits(r.row, tuple(context)))
                rows.append(i)
                out.set(i, lasts[-1])
        if lasts:
            out.batches.append((lasts, rows))

    def sample(self, logits: RowLogits, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int:
        if self.fail_sample is not None and self.fail_sample(logits.context):
            raise RuntimeError(SECRET)
        if self.poison is not None and self.poison(logits.context):
            return self.poison_token
        if temperature == 0:
            return greedy_letter(logits.context)
        return draw_letter(generator if generator is not None else self._rng)

    def greedy(self, logits: list[RowLogits]) -> list[int]:
        self.greedy_calls += 1
        return [self.sample(row) for row in logits]
