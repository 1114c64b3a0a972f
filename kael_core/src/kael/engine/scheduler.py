"""Scheduler: each step's plan of "n new tokens per row" under a token budget (vLLM v1's design).

NOTE [one schedule]: ``schedule()`` walks the running requests first, oldest first, giving each
what it lacks: one token (a decode step) or the next chunk of its prompt (at most what is left
of the step's ``max_num_batched_tokens``); a prompt longer than the budget is prefilled in
chunks over several steps while the others keep decoding (chunked prefill). Then, if nothing
was preempted, waiting requests start, first come first served, while rows, budget and blocks
last; a new request's chunk starts after its cached prefix, so a repeated prompt computes only
its uncached tail. A plan row may hold more than one token for a running request (k draft
tokens to verify, ``ScheduledRow.all_logits``): the runner returns every position's logits.

When the KV manager cannot give a running request its slots, the newest running request not
yet scheduled in this step is preempted (NOTE [request state] in request.py): its row and
blocks go back, it returns to the front of the waiting queue with ``num_computed = 0``, and
resumes later as an ordinary prefill of its prompt and output, which hits the prefix cache.
A waiting request starts only if the pool keeps one spare block per running request, so one
just started is not preempted again at once.

NOTE [forks]: a request with ``fork_of`` (a sibling choice of the same prompt, ``n`` > 1)
waits until that request's prompt is computed; the engine then copies its row (no block is
computed) and samples the sibling's first token from the same logits (``EngineCore``). If the
parent is gone or no row is free, the sibling starts as an ordinary prefill instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .._errors import KaelError
from .kv_manager import KVBackend
from .request import Request, RequestStatus
from .speculative import Speculator

__all__ = ["ScheduledRow", "Scheduler", "SchedulerOutput"]


@dataclass(frozen=True)
class ScheduledRow:
    """``tokens`` new positions of ``request`` (from position ``start``) in cache row ``row``."""

    request: Request
    row: int
    start: int
    tokens: tuple[int, ...]
    decode: bool
    """A one-token step of a request past its prefill (the family's decode step runs it)."""
    all_logits: bool = False
    """Return the logits of every new position (draft verification), not just the last one."""
    drafts: int = 0
    """Trailing draft tokens to verify (NOTE [speculation identical to plain decoding] in speculative.py)."""

    @property
    def n(self) -> int:
        """New tokens this step."""
        return len(self.tokens)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last known token (its logits pick the next)."""
        return self.start + self.n >= self.request.num_tokens


@dataclass
class SchedulerOutput:
    """One step's plan: its rows (running first, then the requests started now) and the requests
    preempted to make room."""

    rows: list[ScheduledRow] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Tokens the step computes (at most the budget)."""
        return sum(r.n for r in self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)


class Scheduler:
    """Plans each step of the requests added to it (NOTE [one schedule]).

    ``max_num_batched_tokens``: the step's token budget (prefill chunks and decode tokens);
    ``max_num_seqs``: the most requests running at once (default: every row of ``kv``);
    ``speculator``: drafts for decoding requests (speculative.py), verified in their decode step.
    """

    def __init__(
        self,
        kv: KVBackend,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        if isinstance(max_num_batched_tokens, bool) or not isinstance(max_num_batched_tokens, int):
            raise KaelError(f"Scheduler: max_num_batched_tokens must be an int >= 1, got {max_num_batched_tokens!r}")
        if max_num_batched_tokens < 1:
            raise KaelError(f"Scheduler: max_num_batched_tokens must be an int >= 1, got {max_num_batched_tokens!r}")
        seqs = kv.rows if max_num_seqs is None else max_num_seqs
        if isinstance(seqs, bool) or not isinstance(seqs, int) or not 1 <= seqs <= kv.rows:
            raise KaelError(f"Scheduler: max_num_seqs must be an int in 1..{kv.rows} (the rows), got {max_num_seqs!r}")
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = seqs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.speculator = speculator

    def add(self, request: Request) -> None:
        """Queues ``request`` (WAITING) behind the others."""
        if request.status is not RequestStatus.WAITING or request.row is not None:
            raise KaelError(f"Scheduler.add: request {request.request_id!r} is {request.status.value}, not new")
        self.waiting.append(request)

    def finish(self, request: Request, status: RequestStatus | None = None) -> None:
        """Takes ``request`` out (finished, failed or aborted: ``status``, default its own if
        finished else FINISHED_ABORTED); its row and blocks go back."""
        if status is not None:
            request.status = status
        elif not request.finished:
            request.status = RequestStatus.FINISHED_ABORTED
        if request in self.running:
            self.running.remove(request)
        if request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
        if self.speculator is not None:
            self.speculator.forget(request)

    @property
    def has_unfinished(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """The next step's plan (NOTE [one schedule]); slots for it are allocated already."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed, budget)
            if n <= 0:  # nothing to compute (a fork waiting for its first token): skip
                i += 1
                continue
            tokens = request.all_ids[request.num_computed : request.num_computed + n]
            drafts = self._drafts(request, n, budget)
            if drafts and self.kv.grow(request, tokens + drafts):  # never preempts for drafts
                out.rows.append(self._row(request, tokens + drafts, len(drafts)))
                budget -= n + len(drafts)
                i += 1
                continue
            while not self.kv.grow(request, tokens):
                victim = max(self.running[i:], key=lambda r: r.arrival)
                self._preempt(victim, out)
                if victim is request:
                    break
            if request.row is None:  # preempted itself: nothing older is left to preempt
                break
            out.rows.append(self._row(request, tokens))
            budget -= n
            i += 1
        if not out.preempted:
            self._start_waiting(out, budget)
        return out

    def _start_waiting(self, out: SchedulerOutput, budget: int) -> None:
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and self.kv.free_rows:
            request = self.waiting.popleft()
            if request.fork_of is not None and not request.fork_of.finished:
                skipped.append(request)  # it waits for its parent's prefill (NOTE [forks])
                continue
            request.fork_of = None
            ids = request.all_ids
            cached = self.kv.cached_prefix(ids)
            end = min(len(ids), cached + budget)
            if not self.kv.start(request, end, spare=len(self.running)):
                self.waiting.appendleft(request)
                break
            request.status = RequestStatus.RUNNING
            request.prefill_target = len(ids)
            if not request.started:
                request.started, request.num_cached = True, request.num_computed
            self.running.append(request)
            tokens = ids[request.num_computed : end]
            out.rows.append(self._row(request, tokens))
            budget -= len(tokens)
        self.waiting.extendleft(reversed(skipped))

    def _drafts(self, request: Request, n: int, budget: int) -> list[int]:
        """Drafts for a decode step of ``request`` (none for a prefill chunk, nor past its
        ``max_tokens``, the budget or where they would fill a KV block)."""
        if self.speculator is None or n != 1 or request.prefilling:
            return []
        room = min(
            self.kv.draft_room(request),
            budget - 1,
            request.params.max_tokens - len(request.output_ids) - 1,
        )
        return self.speculator.drafts(request, room) if room > 0 else []

    def _row(self, request: Request, tokens: list[int], drafts: int = 0) -> ScheduledRow:
        assert request.row is not None
        decode = len(tokens) == 1 and not request.prefilling
        start = request.num_computed
        return ScheduledRow(request, request.row, start, tuple(tokens), decode, all_logits=drafts > 0, drafts=drafts)

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        self.kv.preempt(victim)  # its blocks were all written by earlier steps: they stay cached
        victim.status = RequestStatus.WAITING
        victim.num_computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        out.preempted.append(victim)
