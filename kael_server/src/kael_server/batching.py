"""BatchScheduler: continuous batching, up to N generations sharing every decode step.

One worker thread drives a BatchEngine (kael's ``models.BatchDecoder``: a KV cache with one
row per slot). Between two decode steps it prefills the jobs whose prompts are ready, each
into a free row and each as it would run alone, in one engine call (their first tokens come
from the prefill), then runs one decode step for every job in the batch. A job leaves the
batch when it finishes, fails or is cancelled; the others go on untouched, and the first job
in the queue takes the slot.

    submit (loop) -> slot free? hold it : queue room? wait (at most queue_timeout) : 429
    encoder thread: tokenize + check the prompt (never on the loop, never on the worker)
    worker: [prefill the ready jobs] -> decode step(batch) -> sample (greedy rows: one call)
            -> JobOutput per row ...

NOTE [batch isolation]: everything that belongs to one job (its prompt check, prefill,
sampling from its own row of logits with its own generator, its on_token handling) runs in
a try of its own, so its failure ends that job only. The calls that several jobs share for
speed alone (one prefill for the ready prompts, one greedy pick for a step's greedy rows) are
redone job by job when they fail, to find whose it was. Only a failing decode step (the one
pass that all rows share) ends every job in it. Whatever happens, each job gets exactly one
final event (Finished or Failed), sent after its slot is given back (as SlotPool does).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kael_server.errors import Busy, Cancelled, QueueTimeout
from kael_server.jobs import Failed, Finished, Job, Outcome
from kael_server.output import JobOutput
from kael_server.protocols import BatchEngine
from kael_server.scheduler import Scheduler

if TYPE_CHECKING:
    from kael_server.generator import Generator


@dataclass(eq=False)
class _Entry:
    """A job as the batch scheduler tracks it."""

    job: Job
    admitted: float
    """``time.perf_counter()`` at submit."""
    ids: list[int] | None = None
    """The checked prompt, once the encoder thread is done."""
    row: int | None = None
    """The engine row, from prefill to the end."""
    output: JobOutput | None = None
    rng: object | None = None
    last: int = 0
    """The token fed at the next decode step."""
    produced: int = 0
    started: float = 0.0
    done: bool = False
    """Its final event was sent (under the lock, so it is sent once)."""


class BatchScheduler(Scheduler):
    """``engine.rows`` slots decoded together, plus a queue of ``queue`` jobs waiting up to ``queue_timeout`` s."""

    def __init__(
        self,
        generator: Generator,
        engine: BatchEngine,
        *,
        queue: int = 0,
        queue_timeout: float = 10.0,
        prefill_tokens: int = 256,
    ) -> None:
        if prefill_tokens < 1:
            raise ValueError(f"BatchScheduler prefill_tokens must be >= 1, got {prefill_tokens!r}")
        if engine.rows < 1:
            raise ValueError(f"BatchScheduler needs an engine with at least one row, got {engine.rows!r}")
        if queue < 0:
            raise ValueError(f"BatchScheduler queue must be >= 0, got {queue!r}")
        if not queue_timeout >= 0:
            raise ValueError(f"BatchScheduler queue_timeout must be >= 0 seconds, got {queue_timeout!r}")
        self.capacity = engine.rows
        self.queue_limit = queue
        self.queue_timeout = queue_timeout
        self.prefill_tokens = prefill_tokens
        """Prompt tokens one shared prefill may hold: short prompts share one; a long one
        (compute-bound anyway) goes alone, so it does not delay the others' first tokens."""
        self._generator = generator
        self._engine = engine
        self._metrics = generator.metrics
        self._changed = threading.Condition()
        self._slotted: dict[Job, _Entry] = {}  # holding a slot: encoding, waiting for prefill, or decoding
        self._queue: deque[_Entry] = deque()
        self._worker_alive = False
        # The worker's own state (no lock): free engine rows and the jobs being decoded.
        self._free_rows = list(range(engine.rows - 1, -1, -1))
        self._decoding: list[_Entry] = []

    # ---- the Scheduler interface (any thread) ------------------------------------------

    def submit(self, job: Job) -> None:
        entry = _Entry(job, time.perf_counter())
        with self._changed:
            dropped = self._drop_cancelled_queued()
            if len(self._slotted) < self.capacity:
                self._slotted[job] = entry
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

    def _remove(self, entry: _Entry) -> bool:
        """Takes ``entry`` out of its slot or the queue, moving queued jobs into free slots.
        True if the caller must send its final event (it was not finished already)."""
        if entry.done:
            return False
        entry.done = True
        if self._slotted.pop(entry.job, None) is None and entry in self._queue:
            self._queue.remove(entry)
            self._metrics.queue_wait.observe(time.perf_counter() - entry.admitted)
        while self._queue and len(self._slotted) < self.capacity:
            nxt = self._queue.popleft()
            self._slotted[nxt.job] = nxt
            self._metrics.queue_wait.observe(time.perf_counter() - nxt.admitted)
        self._metrics.queue_depth.set(len(self._queue))
        self._changed.notify_all()
        return True

    def _drop_cancelled_queued(self) -> list[tuple[_Entry, Outcome]]:
        """Queued jobs whose client left (or that shutdown cancelled) give their place back."""
        gone = [e for e in self._queue if e.job.cancelled]
        return [(e, Failed(Cancelled(e.job.cancel_reason or "client"))) for e in gone if self._remove(e)]

    @staticmethod
    def _emit_all(finished: Sequence[tuple[_Entry, Outcome]]) -> None:
        for entry, outcome in finished:
            entry.job.emit(outcome)

    def _finish(self, entry: _Entry, outcome: Outcome) -> None:
        with self._changed:
            send = self._remove(entry)
        if send:
            entry.job.emit(outcome)

    # ---- the event loop: a queued job's deadline ---------------------------------------

    def _expire(self, entry: _Entry) -> None:
        with self._changed:
            if entry not in self._queue:
                return  # it got a slot, or finished
        job = entry.job
        self._finish(entry, Failed(Cancelled(job.cancel_reason or "client") if job.cancelled else QueueTimeout()))

    # ---- encoder threads: one per job, so a long prompt holds up nobody ----------------

    def _encode(self, entry: _Entry) -> None:
        try:
            ids = self._generator.prepare(entry.job)
        except BaseException as exc:
            self._finish(entry, Failed(exc))
            return
        with self._changed:
            entry.ids = ids
            self._changed.notify_all()

    # ---- the worker thread -------------------------------------------------------------

    def _work(self) -> None:
        try:
            while True:
                with self._changed:
                    dropped = self._drop_cancelled_queued()
                    while True:
                        if not self._slotted and not self._queue:
                            self._worker_alive = False
                            self._changed.notify_all()
                            break
                        ready = [e for e in self._slotted.values() if e.ids is not None and e.row is None]
                        if ready or self._decoding:
                            break
                        self._changed.wait()
                    alive = self._worker_alive
                self._emit_all(dropped)
                if not alive:
                    return
                if ready:
                    self._start(ready)
                if self._decoding:
                    self._step()
        except BaseException as exc:  # a bug in the loop itself: no job may be left waiting
            self._fail_everything(exc)

    def _start(self, entries: list[_Entry]) -> None:
        """Prefills the ready jobs into free rows, in engine calls of up to ``prefill_tokens``
        prompt tokens (each prompt as alone, NOTE [batched prefill] in kael's BatchDecoder);
        each first token comes from its prompt's logits. If a call fails, each of its prompts
        runs alone, so only its own job fails."""
        generator, starting = self._generator, []
        for entry in entries:
            job = entry.job
            if job.cancelled:
                self._finish(entry, Failed(Cancelled(job.cancel_reason or "client")))
                continue
            assert entry.ids is not None
            generator.accept(job, entry.ids)
            entry.output = JobOutput(job, generator.tokenizer)
            entry.started = time.perf_counter()
            entry.row = self._free_rows.pop()
            try:
                entry.rng = generator.rng_for(job.params)
            except Exception as exc:
                self._end(entry, Failed(exc))
                continue
            starting.append(entry)
        group: list[_Entry] = []
        tokens = 0
        for entry in starting:
            n = len(entry.ids or ())
            if group and tokens + n > self.prefill_tokens:
                self._prefill(group)
                group, tokens = [], 0
            group.append(entry)
            tokens += n
        if group:
            self._prefill(group)

    def _prefill(self, starting: list[_Entry]) -> None:
        """One shared prefill of ``starting``; then each job's first token."""
        firsts: list[tuple[_Entry, object]] = []
        try:
            logits = self._engine.prefill_many([e.row for e in starting], [e.ids for e in starting])  # type: ignore[misc]
            firsts = [(entry, logits[i]) for i, entry in enumerate(starting)]
        except Exception as exc:
            if len(starting) == 1:
                self._end(starting[0], Failed(exc))
                return
            for entry in starting:  # which prompt failed? each alone, so the others go on
                try:
                    firsts.append((entry, self._engine.prefill(entry.row, entry.ids)))  # type: ignore[arg-type]
                except Exception as alone:
                    self._end(entry, Failed(alone))
        for entry, first in firsts:
            try:
                token = self._sample(entry, first)
            except Exception as exc:
                self._end(entry, Failed(exc))
                continue
            self._decoding.append(entry)
            self._take(entry, token)

    def _step(self) -> None:
        """One decode step for every job in the batch (cancelled ones leave first)."""
        for entry in list(self._decoding):
            if entry.job.cancelled:
                self._end(entry, Failed(Cancelled(entry.job.cancel_reason or "client")))
        batch = list(self._decoding)
        if not batch:
            return
        self._metrics.batch_size.observe(len(batch))
        try:
            logits = self._engine.decode([e.row for e in batch], [e.last for e in batch])  # type: ignore[misc]
        except Exception as exc:  # the pass all rows share: every job in it fails
            for entry in batch:
                self._end(entry, Failed(exc))
            return
        greedy = self._greedy(batch, logits)
        for i, entry in enumerate(batch):
            try:
                token = greedy[i] if i in greedy else self._sample(entry, logits[i])
            except Exception as exc:
                self._end(entry, Failed(exc))
                continue
            self._take(entry, token)

    def _greedy(self, batch: list[_Entry], logits: object) -> dict[int, int]:
        """The greedy rows' tokens (by position in the step) from one engine call; empty if
        fewer than two rows are greedy, or if that call fails (each row then samples alone,
        so a failure ends only its own job)."""
        rows = [i for i, entry in enumerate(batch) if entry.job.params.temperature == 0]
        if len(rows) < 2:
            return {}
        try:
            picked = self._engine.greedy(logits)
            return {i: int(picked[i]) for i in rows}
        except Exception:
            return {}

    def _sample(self, entry: _Entry, logits: object) -> int:
        params = entry.job.params
        top_k = min(params.top_k, self._generator.vocab_size)
        return int(self._engine.sample(logits, params.temperature, top_k, entry.rng))

    def _take(self, entry: _Entry, token: int) -> None:
        """Hands a new token to the job's output; ends the job when it is done."""
        assert entry.output is not None
        entry.produced += 1
        try:
            more = entry.output.on_token(token)
        except Exception as exc:
            self._end(entry, Failed(exc))
            return
        if not more or entry.produced >= entry.job.params.max_tokens:
            self._end(entry, None)
        else:
            entry.last = token

    def _end(self, entry: _Entry, failure: Failed | None) -> None:
        """A job leaves the batch: its stats, its row back to the engine, then its final event."""
        outcome: Outcome
        if entry.output is not None:
            stats = entry.job.stats
            stats.seconds = time.perf_counter() - entry.started
            self._metrics.generation_finished(stats.tokens, stats.seconds, stats.ttft)
        if failure is not None:
            outcome = failure
        else:
            try:
                assert entry.output is not None
                outcome = Finished(entry.output.text())
            except Exception as exc:
                outcome = Failed(exc)
        if entry in self._decoding:
            self._decoding.remove(entry)
        if entry.row is not None:
            row, entry.row = entry.row, None
            self._engine.release(row)
            self._free_rows.append(row)
        self._finish(entry, outcome)

    def _fail_everything(self, exc: BaseException) -> None:
        with self._changed:
            everyone = [*self._slotted.values(), *self._queue]
            finished = [(e, Failed(exc)) for e in everyone if self._remove(e)]
            self._decoding.clear()
            self._free_rows = list(range(self._engine.rows - 1, -1, -1))
            self._worker_alive = False
            self._changed.notify_all()
        for row in range(self._engine.rows):
            with contextlib.suppress(Exception):  # nothing more can be done for this engine row
                self._engine.release(row)
        self._emit_all(finished)
