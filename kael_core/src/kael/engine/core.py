"""EngineCore: the engine's step, schedule -> run -> sample -> stop, over requests.

    core = EngineCore.on(BatchDecoder(model, rows=8))
    core.add(Request(prompt_ids, SamplingParams(max_tokens=32, temperature=0.0), eos_ids=[50256]))
    while core.has_unfinished:
        for event in core.step():       # the tokens each request got this step
            ...

NOTE [step isolation]: what belongs to one request (its sampler, its ``on_token``) runs in a
try of its own, so its failure ends that request only (a ``StepEvent`` with ``error``). Only
a failing forward pass, which every row of the plan shares, ends every request in it; their
rows are then released without caching their blocks (their keys and values may be half
written). Every request gets exactly one final event (``finished``), whatever ends it, except
one taken out by ``abort``, whose caller knows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..ops import narrow, select
from .kv_manager import KVBackend, KVManager
from .request import Request, RequestError, RequestStatus, check_fits
from .runner import ModelRunner, Runner, StepLogits
from .scheduler import ScheduledRow, Scheduler, SchedulerOutput
from .speculative import Speculator

if TYPE_CHECKING:
    from ..models import BatchDecoder

__all__ = ["EngineCore", "StepEvent"]


@dataclass
class StepEvent:
    """What one request got from a step: its new ``tokens``; ``finished`` once it is done
    (``request.finish_reason`` says why, ``error`` if it failed)."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    error: BaseException | None = None


class EngineCore:
    """Requests in, tokens out, one step at a time, over a KV manager and a runner (``on(decoder)``:
    kael's, on a ``BatchDecoder``; NOTE [step isolation]).

    ``max_num_batched_tokens`` is each step's token budget (chunked prefill, NOTE [one
    schedule] in scheduler.py); ``max_num_seqs`` bounds the running requests (default: the
    decoder's rows). Not thread safe: one thread drives it.
    """

    def __init__(
        self,
        kv: KVBackend,
        runner: Runner,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int | None = None,
        vocab_size: int | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.kv = kv
        self.vocab_size = vocab_size
        """Token ids must be below it (None: not checked here)."""
        self.speculator = speculator
        """Speculative decoding's drafts and counters (None: plain decoding)."""
        self.scheduler = Scheduler(
            kv, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, speculator=speculator
        )
        self.runner = runner
        self.last_plan: SchedulerOutput | None = None
        """The plan of the latest step (for metrics and tests)."""
        self.last_logits: StepLogits | None = None
        """The latest step's logits (for metrics and tests)."""

    @classmethod
    def on(
        cls,
        decoder: BatchDecoder,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int | None = None,
        speculator: Speculator | None = None,
    ) -> EngineCore:
        """The engine over kael's ``BatchDecoder`` (its ``KVManager`` and ``ModelRunner``), speculating
        with ``speculator`` when given (NOTE [speculation identical to plain decoding])."""
        if speculator is not None:
            decoder.allow_drafts(speculator.k_max)  # NOTE [drafts in the decode step] in runner.py
        return cls(
            KVManager(decoder),
            ModelRunner(decoder),
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            vocab_size=decoder.vocab_size,
            speculator=speculator,
        )

    @property
    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return self.scheduler.has_unfinished

    def add(self, request: Request) -> None:
        """Queues a new request; it runs from the next step on (RequestError if its ids and
        ``max_tokens`` do not fit a row, or an id is outside the vocabulary)."""
        check_fits(request.all_ids, request.params, self.kv.max_positions)  # it never outgrows its row
        if self.vocab_size is not None and max(request.all_ids) >= self.vocab_size:
            raise RequestError(
                "prompt_ids", f"token id {max(request.all_ids)} is out of range for a vocabulary of {self.vocab_size}"
            )
        self.scheduler.add(request)

    def abort(self, request: Request) -> None:
        """Takes ``request`` out now (FINISHED_ABORTED unless it had finished); no event follows."""
        self.scheduler.finish(request, None if request.finished else RequestStatus.FINISHED_ABORTED)

    def step(self) -> list[StepEvent]:
        """One step: schedule, one forward pass, sample each row that reached its end, stop checks."""
        start = time.perf_counter()
        plan = self.last_plan = self.scheduler.schedule()
        if not plan:
            return []
        events = self._step(plan)
        if self.speculator is not None and all(r.decode or r.drafts for r in plan.rows):
            produced = sum(len(e.tokens) for e in events)  # NOTE [speculation pays or pauses]
            self.speculator.observe_step(
                time.perf_counter() - start, produced, any(r.drafts for r in plan.rows), len(plan.rows)
            )
        return events

    def _step(self, plan: SchedulerOutput) -> list[StepEvent]:
        """``plan``'s forward pass and each row's tokens."""
        try:
            logits = self.last_logits = self.runner.execute(plan)
        except Exception as exc:  # a runner without isolation of its own: every request in it fails
            for r in plan.rows:
                self.kv.free(r.request, keep=False)
                self.scheduler.finish(r.request, RequestStatus.FINISHED_ABORTED)
            return [StepEvent(r.request, finished=True, error=exc) for r in plan.rows]
        events: list[StepEvent] = []
        for i, err in logits.errors.items():  # NOTE [runner isolation]: only the failed rows
            request = plan.rows[i].request
            self.kv.free(request, keep=False)
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            events.append(StepEvent(request, finished=True, error=err))
        greedy = self._greedy(plan, logits)
        for i, r in enumerate(plan.rows):
            request = r.request
            if i in logits.errors:
                continue
            request.num_computed += r.n
            if not r.samples or request.finished:
                continue
            row = logits.row(i)
            if r.drafts:
                event = self._verify(r, row)
                if event is not None:
                    events.append(event)
                continue
            if r.all_logits:
                row = select(row, 0, r.n - 1)
            children = self._fork_children(r) if not r.decode else []
            for req in [request, *children]:
                event = self._advance(req, greedy.get(i) if _greedy_row(req) else None, row)
                if event is not None:
                    events.append(event)
        return events

    def _advance(self, request: Request, greedy: int | None, row: Any) -> StepEvent | None:
        """Samples ``request``'s next token from ``row`` (or takes ``greedy``) and applies the stop
        function; its event (None if it was finished already)."""
        if request.finished:
            return None
        try:
            token = greedy if greedy is not None else self._pick(request, row)
            more = request.append(token)
        except Exception as exc:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            return StepEvent(request, finished=True, error=exc)
        if not more:
            self.scheduler.finish(request)
        return StepEvent(request, [token], finished=not more)

    def _pick(self, request: Request, row: Any) -> int:
        """``request``'s next token from its logits ``row``, as plain decoding picks it."""
        if request.sampler is not None:
            return int(request.sampler(row))
        params = request.params  # the runner's temperature/top-k draw (argmax at temperature 0)
        top_k = min(params.top_k, self.vocab_size) if self.vocab_size is not None else params.top_k
        return int(self.runner.sample(row, params.temperature, top_k, request.generator))

    def _verify(self, r: ScheduledRow, rows: Any) -> StepEvent | None:
        """Samples a verification row's positions in order while they confirm the drafts, drops
        the keys and values of the rest (NOTE [speculation identical to plain decoding] in
        speculative.py); the request's event."""
        request = r.request
        if request.finished:
            return None
        drafts = r.tokens[len(r.tokens) - r.drafts :]
        tokens: list[int] = []
        more, error = True, None
        first = r.n - r.drafts - 1
        try:
            # greedy: every position's argmax in one call (the same argmax, row by row, as _pick's)
            picks = self.runner.greedy(narrow(rows, 0, first, r.drafts + 1)) if _greedy_row(request) else None
            for j in range(r.drafts + 1):
                token = picks[j] if picks is not None else self._pick(request, select(rows, 0, first + j))
                tokens.append(token)
                more = request.append(token)
                if not more or j == r.drafts or token != drafts[j]:
                    break
        except Exception as exc:
            error = exc
        accepted = sum(1 for a, b in zip(tokens, drafts) if a == b)
        if self.speculator is not None:
            self.speculator.record(request, r.drafts, accepted)
        if error is not None:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            return StepEvent(request, tokens, finished=True, error=error)
        request.num_computed = r.start + r.n - r.drafts + min(accepted, len(tokens) - 1)
        if request.row is not None:
            self.kv.truncate(request, request.num_computed)
        if not more:
            self.scheduler.finish(request)
        return StepEvent(request, tokens, finished=not more)

    def _greedy(self, plan: SchedulerOutput, logits: StepLogits) -> dict[int, int]:
        """The greedy sampling rows' tokens, one ``runner.greedy`` per batched product with at
        least two of them (plan row -> token); empty where that call fails (each row then picks
        alone, so a failure ends only its own request)."""
        out: dict[int, int] = {}
        for batch, rows in logits.batches:
            want = {i for i in rows if plan.rows[i].samples and _greedy_row(plan.rows[i].request)}
            if len(want) < 2:
                continue
            try:
                picked = self.runner.greedy(batch)
            except Exception:
                continue
            out.update({i: int(picked[j]) for j, i in enumerate(rows) if i in want})
        return out

    def _fork_children(self, r: ScheduledRow) -> list[Request]:
        """The waiting siblings of ``r.request`` whose prefill just ended (NOTE [forks] in
        scheduler.py): forked into free rows now, or left to start as ordinary prefills."""
        parent = r.request
        kids = [q for q in self.scheduler.waiting if q.fork_of is parent]
        started = []
        for kid in kids:
            kid.fork_of = None
            if parent.finished or len(self.scheduler.running) >= self.scheduler.max_num_seqs:
                continue
            if not self.kv.fork(parent, kid):
                continue
            self.scheduler.waiting.remove(kid)
            kid.status = RequestStatus.RUNNING
            kid.prefill_target = kid.num_tokens
            kid.started, kid.num_cached = True, 0
            self.scheduler.running.append(kid)
            started.append(kid)
        return started


def _greedy_row(request: Request) -> bool:
    """Whether the request's token is the plain argmax (no sampler, temperature 0)."""
    return request.sampler is None and request.params.temperature == 0
