"""FakeModelEngine: FakeModel's own engine (a BatchEngine), what a Generator built without a
scheduler serves a FakeModel through (kael_server.generator.default_engine)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from kael.engine import Request, SchedulerOutput, StepLogits

from .fakes import SECRET, Call, FakeModel, RowLogits, draw_letter, greedy_letter

__all__ = ["FakeModelEngine"]


class FakeModelEngine:
    """FakeModel's engine (a BatchEngine): each row picks its tokens by FakeModel's rules, as
    ``generate`` alone would (the script, the greedy letter of its context, letters drawn from
    its generator, or its sampler over ``fake_logits``), with the model's ``gate`` and
    ``step_seconds`` before each token and its ``fail_at``; each sequence it starts is one
    Call in ``model.calls`` (its ``produced`` are the request's output ids)."""

    free_blocks = 1 << 62

    def __init__(self, model: FakeModel, rows: int) -> None:
        self.model = model
        self.rows = rows
        self.max_positions = model.max_positions
        self.contexts: dict[int, list[int]] = {}
        self._free = list(range(rows - 1, -1, -1))
        self._seen: set[int] = set()

    # ---- kael.engine.KVBackend ----------------------------------------------------------------
    @property
    def free_rows(self) -> int:
        return len(self._free)

    def cached_prefix(self, ids: Sequence[int]) -> int:
        return 0

    def start(self, request: Request, end: int, *, spare: int = 0) -> bool:
        if not self._free:
            return False
        request.row, request.num_computed = self._take(request), 0
        self.contexts[request.row] = []
        return True

    def grow(self, request: Request, tokens: Sequence[int], *, spare: int = 0) -> bool:
        return True

    def fork(self, parent: Request, child: Request) -> bool:
        if not self._free or parent.row is None:
            return False
        child.row, child.num_computed = self._take(child), parent.num_computed
        self.contexts[child.row] = list(self.contexts[parent.row])
        return True

    def free(self, request: Request, *, keep: bool = True) -> None:
        row, request.row = request.row, None
        if row is not None:
            self.contexts.pop(row, None)
            self._free.append(row)

    def preempt(self, request: Request) -> None:
        self.free(request)

    def stats(self) -> dict[str, int]:
        return {}

    def _take(self, request: Request) -> int:
        if id(request) not in self._seen:  # one Call per sequence, as one generate call each
            self._seen.add(id(request))
            params, model = request.params, self.model
            top_k = min(params.top_k, model.vocab_size)
            call = Call(list(request.prompt_ids), params.max_tokens, params.temperature, top_k, request.generator)
            call.sampler, call.produced = request.sampler, request.output_ids
            model.calls.append(call)
        return self._free.pop()

    # ---- kael.engine.Runner -------------------------------------------------------------------
    def execute(self, plan: SchedulerOutput) -> StepLogits:
        out, model = StepLogits(len(plan.rows)), self.model
        for i, r in enumerate(plan.rows):
            context = self.contexts[r.row]
            context.extend(r.tokens)
            if not r.samples:
                continue
            if model.gate is not None:
                model.gate.step()
            if model.step_seconds:
                time.sleep(model.step_seconds)  # the model's compute time, not a wait for an event
            produced = len(r.request.output_ids)
            if produced == model.fail_at:
                out.errors[i] = RuntimeError(SECRET)
                continue
            forced = model.script[produced % len(model.script)] if model.script is not None else None
            out.set(i, RowLogits(r.row, tuple(context), forced, model.vocab_size))
        return out

    def sample(self, logits: RowLogits, temperature: float = 0.0, top_k: int = 0, generator: Any = None) -> int:
        if logits.forced is not None:
            return logits.forced
        if temperature == 0:
            return greedy_letter(logits.context)
        return draw_letter(generator if generator is not None else self.model._rng)

    def greedy(self, logits: list[RowLogits]) -> list[int]:
        return [self.sample(row) for row in logits]
