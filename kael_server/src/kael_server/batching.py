"""BatchScheduler: the server's adapter to kael's engine, continuous batching of N sequences.

Admission is the server's (slots, a bounded queue, 429s); generation is kael's
(``kael.engine.EngineCore``): each choice of a job becomes one ``kael.engine.Request`` whose
tokens go to the choice's JobOutput, and one worker thread calls ``EngineCore.step()``
(schedule -> one forward pass -> sample -> stop) while anything runs. One slot is a batch of
one; every server gets the paged KV cache, prefix caching and chunked prefill.

A job of several choices (``n``, or a list of prompts: NOTE [choices] in jobs.py) takes one
row per choice: each prompt is prefilled once, in its first choice's row, and its other
choices fork from it (NOTE [forks] in kael/engine/scheduler.py), each sampled with its own
generator. Slots count rows: a job waits until its rows are free. A job wider than the slots
(n > --slots) runs alone, on the engine's spare rows (>= slots).

    submit (loop) -> rows free? hold them : queue room? wait (at most queue_timeout) : 429
    encoder thread: tokenize + check the prompts (never on the loop, never on the worker)
    worker: ready jobs -> Requests -> EngineCore.step() -> events back to the jobs

NOTE [kv memory] (batch_state.py): preemption and resumption are the engine's.

NOTE [batch isolation]: the engine ends only the request whose sampler, token handling or
prefill failed (NOTE [step isolation] in kael/engine/core.py); this adapter then ends its
whole job (every one of its requests), and nobody else's. Only a failing decode step (the
one pass all rows share) ends every job in it. Whatever happens, each job gets exactly one
final event (Finished or Failed), sent after its rows are given back.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kael.engine import EngineCore, Request, Speculator, StepEvent
from kael.models import BatchDecoder

from kael_server.batch_state import Entry, Seq
from kael_server.errors import Busy, Cancelled, FieldError, InvalidRequest, QueueTimeout
from kael_server.jobs import Failed, Finished, Job, Outcome
from kael_server.protocols import BatchEngine
from kael_server.scheduler import Scheduler

if TYPE_CHECKING:
    from kael_server.generator import Generator

__all__ = ["BatchScheduler"]


class BatchScheduler(Scheduler):
    """``slots`` sequences decoded together (default ``engine.rows``; a wider job alone, up to
    ``engine.rows``), plus a queue of ``queue`` jobs waiting up to ``queue_timeout`` s.

    ``engine`` is kael's ``BatchDecoder`` (its ``KVManager`` and ``ModelRunner`` drive it) or
    any ``BatchEngine`` (one object that is both a ``kael.engine.KVBackend`` and a
    ``kael.engine.Runner``: test engines). ``prefill_tokens`` is each step's token budget
    (``EngineCore``'s ``max_num_batched_tokens``, vLLM's default of 2048): prompts share a step
    up to it, and a longer one is prefilled in chunks between decode steps.
    """

    def __init__(
        self,
        generator: Generator,
        engine: BatchDecoder | BatchEngine,
        *,
        queue: int = 0,
        queue_timeout: float = 10.0,
        prefill_tokens: int = 2048,
        slots: int | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        if prefill_tokens < 1:
            raise ValueError(f"BatchScheduler prefill_tokens must be >= 1, got {prefill_tokens!r}")
        if engine.rows < 1:
            raise ValueError(f"BatchScheduler needs an engine with at least one row, got {engine.rows!r}")
        if queue < 0:
            raise ValueError(f"BatchScheduler queue must be >= 0, got {queue!r}")
        if not queue_timeout >= 0:
            raise ValueError(f"BatchScheduler queue_timeout must be >= 0 seconds, got {queue_timeout!r}")
        if slots is not None and not 1 <= slots <= engine.rows:
            raise ValueError(f"BatchScheduler slots must be in 1..{engine.rows} (the engine's rows), got {slots!r}")
        self.capacity = slots if slots is not None else engine.rows
        self.widest = engine.rows
        """The most sequences one job may have: a job wider than ``capacity`` runs alone."""
        self.queue_limit = queue
        self.queue_timeout = queue_timeout
        self.prefill_tokens = prefill_tokens
        """Tokens one engine step computes at most: prompts share a step up to it; a longer one is
        prefilled in chunks, so it does not hold up the others' tokens."""
        self._generator = generator
        if isinstance(engine, BatchDecoder):
            self._core = EngineCore.on(engine, max_num_batched_tokens=prefill_tokens, speculator=speculator)
        else:
            self._core = EngineCore(engine, engine, max_num_batched_tokens=prefill_tokens, speculator=speculator)
        self.speculator = speculator
        """Speculative decoding's drafter and counters (None: plain decoding)."""
        self._metrics = generator.metrics
        self._changed = threading.Condition()
        self._slotted: dict[Job, Entry] = {}  # holding rows: encoding, waiting for prefill, or decoding
        self._used = 0  # rows the slotted jobs hold
        self._queue: deque[Entry] = deque()
        self._worker_alive = False
        # The worker's own state (no lock): the started jobs and each request's choice.
        self._active: list[Entry] = []
        self._seqs: dict[Request, Seq] = {}

    # ---- the Scheduler interface (any thread) ------------------------------------------

    def full(self) -> bool:
        with self._changed:
            queued = sum(not e.job.cancelled for e in self._queue)
            return not (self._room(1) and not queued) and queued >= self.queue_limit

    def submit(self, job: Job) -> None:
        if job.width > self.widest:
            raise InvalidRequest(
                [
                    FieldError(
                        "n",
                        f"expected n times the number of prompts to be at most {self.widest}: "
                        f"this server decodes at most {self.widest} sequences of one request",
                    )
                ]
            )
        entry = Entry(job, time.perf_counter(), job.width)
        with self._changed:
            dropped = self._drop_cancelled_queued()
            if self._room(entry.width) and not self._queue:
                self._slot(entry)
                self._metrics.queue_wait.observe(0)
            elif len(self._queue) < self.queue_limit:
                self._queue.append(entry)
                self._metrics.queue_depth.set(len(self._queue))
                job.loop.call_later(self.queue_timeout, self._expire, entry)
            else:
                entry.done = True
            start_worker = not entry.done and not self._worker_alive
            if start_worker:
                self._worker_alive = True
        self._emit_all(dropped)
        if entry.done:
            raise Busy
        try:
            if start_worker:
                threading.Thread(target=self._work, name="kael-batch", daemon=True).start()
            threading.Thread(target=self._encode, args=(entry,), name="kael-encode", daemon=True).start()
        except BaseException:
            with self._changed:
                if start_worker:
                    self._worker_alive = False
                self._remove(entry)
            raise

    def running(self) -> list[Job]:
        """Every job admitted and not finished: in a slot or in the queue."""
        with self._changed:
            return [*self._slotted, *(e.job for e in self._queue)]

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._slotted or self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    # ---- bookkeeping (callers hold the lock) -------------------------------------------

    def _room(self, width: int) -> bool:
        """Whether a job of ``width`` rows may start now: it fits the slots, or it runs alone."""
        return self._used + width <= self.capacity or self._used == 0

    def _slot(self, entry: Entry) -> None:
        self._slotted[entry.job] = entry
        self._used += entry.width

    def _remove(self, entry: Entry) -> bool:
        """Takes ``entry`` out of its slot or the queue, moving queued jobs into free rows.
        True if the caller must send its final event (it was not finished already)."""
        if entry.done:
            return False
        entry.done = True
        if self._slotted.pop(entry.job, None) is not None:
            self._used -= entry.width
        elif entry in self._queue:
            self._queue.remove(entry)
            self._metrics.queue_wait.observe(time.perf_counter() - entry.admitted)
        while self._queue and self._room(self._queue[0].width):
            nxt = self._queue.popleft()
            self._slot(nxt)
            self._metrics.queue_wait.observe(time.perf_counter() - nxt.admitted)
        self._metrics.queue_depth.set(len(self._queue))
        self._changed.notify_all()
        return True

    def _drop_cancelled_queued(self) -> list[tuple[Entry, Outcome]]:
        """Queued jobs whose client left (or that shutdown cancelled) give their place back."""
        gone = [e for e in self._queue if e.job.cancelled]
        return [(e, Failed(Cancelled(e.job.cancel_reason or "client"))) for e in gone if self._remove(e)]

    @staticmethod
    def _emit_all(finished: Sequence[tuple[Entry, Outcome]]) -> None:
        for entry, outcome in finished:
            entry.job.emit(outcome)

    def _finish(self, entry: Entry, outcome: Outcome) -> None:
        with self._changed:
            send = self._remove(entry)
        if send:
            entry.job.emit(outcome)

    # ---- the event loop: a queued job's deadline ---------------------------------------

    def _expire(self, entry: Entry) -> None:
        with self._changed:
            if entry not in self._queue:
                return  # it got a slot, or finished
        job = entry.job
        self._finish(entry, Failed(Cancelled(job.cancel_reason or "client") if job.cancelled else QueueTimeout()))

    # ---- encoder threads: one per job, so a long prompt holds up nobody ----------------

    def _encode(self, entry: Entry) -> None:
        try:
            ids = self._generator.prepare(entry.job)
        except BaseException as exc:
            self._finish(entry, Failed(exc))
            return
        with self._changed:
            entry.ids = ids
            self._changed.notify_all()

    # ---- the worker thread: jobs -> Requests -> EngineCore.step() -> events --------------

    def _work(self) -> None:
        core = self._core
        try:
            while True:
                with self._changed:
                    dropped = self._drop_cancelled_queued()
                    while True:
                        if not self._slotted and not self._queue:
                            self._worker_alive = False
                            self._changed.notify_all()
                            break
                        ready = [e for e in self._slotted.values() if e.ids is not None and not e.started]
                        if ready or core.has_unfinished:
                            break
                        self._changed.wait()
                    alive = self._worker_alive
                self._emit_all(dropped)
                if not alive:
                    return
                if ready:
                    self._start(ready)
                self._drop_cancelled()
                if core.has_unfinished:
                    self._step()
                self._metrics.kv_observe(self._kv_stats())
        except BaseException as exc:  # a bug in the loop itself: no job may be left waiting
            self._fail_everything(exc)

    def _start(self, entries: list[Entry]) -> None:
        """The ready jobs become Requests: one per choice, each prompt's other choices forking
        from its first (NOTE [forks] in kael/engine/scheduler.py)."""
        generator = self._generator
        for entry in entries:
            job = entry.job
            entry.started = time.perf_counter()
            if job.cancelled:
                self._close(entry, Failed(Cancelled(job.cancel_reason or "client")))
                continue
            assert entry.ids is not None
            generator.accept(job, entry.ids)
            entry.accepted = True
            try:
                entry.seqs = [Seq(entry, choice) for choice in generator.choices(job, entry.ids)]
            except Exception as exc:
                self._close(entry, Failed(exc))
                continue
            self._active.append(entry)
            if job.params.max_tokens == 0:  # the echoed prompts are the whole answer
                for seq in entry.seqs:
                    self._end(seq)
                continue
            n = job.params.n
            try:
                for seq in entry.seqs:
                    first = entry.seqs[seq.choice.index - seq.choice.index % n]
                    output = seq.choice.output
                    seq.request = Request(
                        seq.choice.ids,
                        job.params,
                        sampler=seq.choice.sampler,  # penalties, bias, top-p, min-p, logprobs
                        generator=seq.choice.rng,  # else the runner's temperature/top-k draw
                        on_token=output.on_token,
                        stop_state=output.stop,
                        fork_of=first.request if first is not seq else None,
                        request_id=(id(job), seq.choice.index),
                    )
                    self._seqs[seq.request] = seq
                    self._core.add(seq.request)
            except Exception as exc:
                self._fail(entry, Failed(exc))

    def _drop_cancelled(self) -> None:
        """Jobs whose client left (or that shutdown or a deadline cancelled) leave the batch."""
        for entry in list(self._active):
            job = entry.job
            if job.cancelled and not entry.closed:
                self._fail(entry, Failed(Cancelled(job.cancel_reason or "client")))

    def _step(self) -> None:
        """One engine step; each request's event goes back to its job."""
        events = self._core.step()
        plan, logits = self._core.last_plan, self._core.last_logits
        if plan is not None:
            for _ in plan.preempted:
                self._metrics.preemptions.inc()
        if logits is not None and logits.decode_rows:
            self._metrics.batch_size.observe(logits.decode_rows)
        if self.speculator is not None:
            self._metrics.spec_observe(self.speculator.proposed, self.speculator.accepted)
        for event in events:
            self._event(event)

    def _event(self, event: StepEvent) -> None:
        seq = self._seqs.get(event.request)
        if seq is None or seq.entry.closed:
            return
        entry = seq.entry
        if event.error is not None:
            self._fail(entry, Failed(event.error))
            return
        if not seq.counted and event.tokens:
            seq.counted = True
            if seq.choice.index % entry.job.params.n == 0:  # a prompt's first choice: its prefill
                entry.job.stats.cached_tokens += event.request.num_cached
        if event.finished:
            self._end(seq)

    def _release(self, seq: Seq) -> None:
        """The choice leaves the engine (its row and blocks go back)."""
        request = seq.request
        if request is not None:
            self._seqs.pop(request, None)
            self._core.abort(request)

    def _end(self, seq: Seq) -> None:
        """A choice is done: its row goes back; its job ends with its last choice."""
        self._release(seq)
        try:
            seq.text = seq.choice.output.text()
        except Exception as exc:
            self._fail(seq.entry, Failed(exc))
            return
        entry = seq.entry
        if all(s.text is not None for s in entry.seqs):
            self._close(entry, None)

    def _fail(self, entry: Entry, failure: Failed) -> None:
        """The whole job ends with ``failure``: every one of its requests leaves the engine."""
        for seq in entry.seqs:
            self._release(seq)
        self._close(entry, failure)

    def _close(self, entry: Entry, failure: Failed | None) -> None:
        """A job leaves the batch: its stats, then its final event (once)."""
        if entry.closed:
            return
        entry.closed = True
        if entry in self._active:
            self._active.remove(entry)
        if entry.accepted:
            stats = entry.job.stats
            stats.seconds = time.perf_counter() - entry.started
            self._metrics.generation_finished(stats.tokens, stats.seconds, stats.ttft)
        outcome: Outcome = failure if failure is not None else Finished(tuple(s.text or "" for s in entry.seqs))
        self._finish(entry, outcome)

    def _kv_stats(self) -> dict[str, int]:
        try:
            return dict(self._core.kv.stats())
        except Exception:  # a statistic: a failure to read it ends nothing
            return {}

    def _fail_everything(self, exc: BaseException) -> None:
        with self._changed:
            everyone = [*self._slotted.values(), *self._queue]
            finished = [(e, Failed(exc)) for e in everyone if self._remove(e)]
            self._active.clear()
            self._worker_alive = False
            self._changed.notify_all()
        for request in list(self._seqs):
            with contextlib.suppress(Exception):  # nothing more can be done for this engine row
                self._core.abort(request)
        self._seqs.clear()
        self._emit_all(finished)
