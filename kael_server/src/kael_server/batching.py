"""BatchScheduler: continuous batching, up to N sequences sharing every decode step.

One worker thread drives a BatchEngine (kael's ``models.BatchDecoder``: a KV cache with one
row per slot). Between two decode steps it prefills the jobs whose prompts are ready, each
into a free row and each as it would run alone, in one engine call (their first tokens come
from the prefill), then runs one decode step for every sequence in the batch. A job leaves
the batch when it finishes, fails or is cancelled; the others go on untouched, and the first
job in the queue takes the slot.

A job of several choices (``n``, or a list of prompts: NOTE [choices] in jobs.py) takes one
row per choice: each prompt is prefilled once into its first choice's row and forked
(``BatchEngine.fork``) into the rows of its other choices, which then decode side by side,
each sampled with its own generator. Slots count rows: a job waits until its rows are free.
A job wider than the slots (n > --slots) runs alone, on the engine's spare rows (>= slots).

    submit (loop) -> rows free? hold them : queue room? wait (at most queue_timeout) : 429
    encoder thread: tokenize + check the prompts (never on the loop, never on the worker)
    worker: [prefill the ready jobs, fork their choices] -> decode step(batch)
            -> sample (greedy rows: one call) -> JobOutput per row ...

NOTE [kv memory] (batch_state.py): parking, preemption and resumption of sequences.

NOTE [batch isolation]: everything that belongs to one job (its prompt check, prefill,
sampling from its own rows of logits with its own generators, its on_token handling) runs
in a try of its own, so its failure ends that job only. The calls that several jobs share
for speed alone (one prefill for the ready prompts, one greedy pick for a step's greedy
rows) are redone job by job when they fail, to find whose it was. Only a failing decode
step (the one pass that all rows share) ends every job in it. Whatever happens, each job
gets exactly one final event (Finished or Failed), sent after its rows are given back (as
SlotPool does).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kael_server.batch_state import Entry, KvMemory, Seq, StepSampling, kv_full, row_of
from kael_server.errors import Busy, Cancelled, FieldError, InvalidRequest, QueueTimeout
from kael_server.jobs import Failed, Finished, Job, Outcome
from kael_server.protocols import BatchEngine
from kael_server.scheduler import Scheduler

if TYPE_CHECKING:
    from kael_server.generator import Generator

__all__ = ["BatchScheduler"]


class BatchScheduler(KvMemory, StepSampling, Scheduler):
    """``slots`` sequences decoded together (default ``engine.rows``; a wider job alone, up to
    ``engine.rows``), plus a queue of ``queue`` jobs waiting up to ``queue_timeout`` s."""

    def __init__(
        self,
        generator: Generator,
        engine: BatchEngine,
        *,
        queue: int = 0,
        queue_timeout: float = 10.0,
        prefill_tokens: int = 256,
        slots: int | None = None,
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
        """Prompt tokens one shared prefill may hold: short prompts share one; a long one
        (compute-bound anyway) goes alone, so it does not delay the others' first tokens."""
        self._generator = generator
        self._engine = engine
        self._metrics = generator.metrics
        self._changed = threading.Condition()
        self._slotted: dict[Job, Entry] = {}  # holding rows: encoding, waiting for prefill, or decoding
        self._used = 0  # rows the slotted jobs hold
        self._queue: deque[Entry] = deque()
        self._worker_alive = False
        # The worker's own state (no lock): free engine rows and the sequences being decoded.
        self._free_rows = list(range(engine.rows - 1, -1, -1))
        self._decoding: list[Seq] = []
        self._parked: list[Seq] = []  # waiting for KV blocks, oldest first (NOTE [kv memory])
        self._paged = engine.paged

    # ---- the Scheduler interface (any thread) ------------------------------------------

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
                        ready = [e for e in self._slotted.values() if e.ids is not None and not e.started]
                        if ready or self._decoding or self._parked:
                            break
                        self._changed.wait()
                    alive = self._worker_alive
                self._emit_all(dropped)
                if not alive:
                    return
                if self._parked:
                    self._unpark()
                if ready:
                    self._start(ready)
                if self._decoding:
                    self._step()
                self._metrics.kv_observe(self._kv_stats())
        except BaseException as exc:  # a bug in the loop itself: no job may be left waiting
            self._fail_everything(exc)

    def _start(self, entries: list[Entry]) -> None:
        """Starts the ready jobs: their choices get rows, and each prompt is prefilled into its
        first choice's row, in engine calls of up to ``prefill_tokens`` prompt tokens (each
        prompt as alone, NOTE [batched prefill] in kael's BatchDecoder). If a call fails, each
        of its prompts runs alone, so only its own job fails."""
        generator, firsts = self._generator, []
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
            if job.params.max_tokens == 0:  # the echoed prompts are the whole answer
                for seq in entry.seqs:
                    self._end(seq)
                continue
            for seq in entry.seqs:
                seq.row = self._free_rows.pop()
            firsts.extend(entry.seqs[:: job.params.n])  # each prompt's first choice
        group: list[Seq] = []
        tokens = 0
        for seq in firsts:
            n = len(seq.choice.ids)
            if group and tokens + n > self.prefill_tokens:
                self._prefill(group)
                group, tokens = [], 0
            group.append(seq)
            tokens += n
        if group:
            self._prefill(group)

    def _prefill(self, group: list[Seq]) -> None:
        """One shared prefill of the prompts of ``group`` (first choices); then the forks into
        their other choices' rows, and each choice's first token from the prompt's logits."""
        group = [seq for seq in group if not seq.entry.closed]  # another prompt of its job failed
        if not group:
            return
        firsts: list[tuple[Seq, object]] = []
        if self._parked:  # parked sequences go first (NOTE [kv memory])
            for seq in group:
                self._park(seq, "start")
            return
        try:
            logits = self._engine.prefill_many([row_of(s) for s in group], [s.choice.ids for s in group])
            firsts = [(seq, logits[i]) for i, seq in enumerate(group)]
        except Exception as exc:
            if len(group) == 1 and not kv_full(exc):
                self._fail(group[0].entry, Failed(exc))
                return
            for seq in group:  # which prompt failed (or does not fit)? each alone, so the others go on
                if seq.entry.closed:
                    continue
                if self._parked:  # an earlier one did not fit: the later ones wait behind it
                    self._park(seq, "start")
                    continue
                try:
                    firsts.append((seq, self._engine.prefill(row_of(seq), seq.choice.ids)))
                except Exception as alone:
                    if kv_full(alone):
                        self._park(seq, "start")
                    else:
                        self._fail(seq.entry, Failed(alone))
        self._begin(firsts)

    def _begin(self, firsts: list[tuple[Seq, object]]) -> None:
        """After their prompts' prefill: the forks into the other choices' rows, and each choice's
        first token from its prompt's logits."""
        for source, first in firsts:
            entry = source.entry
            if entry.closed:
                continue
            entry.job.stats.cached_tokens += self._cached_tokens(source)
            n = entry.job.params.n
            start = source.choice.index - source.choice.index % n
            siblings = entry.seqs[start : start + n]
            try:
                for seq in siblings[1:]:
                    self._engine.fork(row_of(source), row_of(seq))
            except Exception as exc:
                self._fail(entry, Failed(exc))
                continue
            for seq in siblings:
                try:
                    token = self._sample(seq, first)
                except Exception as exc:
                    self._fail(entry, Failed(exc))
                    break
                self._decoding.append(seq)
                self._take(seq, token)
                if entry.closed:
                    break

    def _step(self) -> None:
        """One decode step for every sequence in the batch (cancelled jobs leave first)."""
        for seq in list(self._decoding):
            job = seq.entry.job
            if job.cancelled and not seq.entry.closed:
                self._fail(seq.entry, Failed(Cancelled(job.cancel_reason or "client")))
        if self._paged:
            self._make_room()
        batch = list(self._decoding)
        if not batch:
            return
        self._metrics.batch_size.observe(len(batch))
        try:
            logits = self._engine.decode([row_of(s) for s in batch], [s.last for s in batch])
        except Exception as exc:  # the pass all rows share: every job in it fails
            for seq in batch:
                self._fail(seq.entry, Failed(exc))
            return
        greedy = self._greedy(batch, logits)
        for i, seq in enumerate(batch):
            if seq.entry.closed:  # its job failed at another of its rows
                continue
            try:
                token = greedy[i] if i in greedy else self._sample(seq, logits[i])
            except Exception as exc:
                self._fail(seq.entry, Failed(exc))
                continue
            self._take(seq, token)

    def _take(self, seq: Seq, token: int) -> None:
        """Hands a new token to the choice's output; ends the choice when it is done."""
        seq.produced += 1
        seq.tokens.append(token)
        try:
            more = seq.choice.output.on_token(token)
        except Exception as exc:
            self._fail(seq.entry, Failed(exc))
            return
        if not more or seq.choice.output.stop.at_length:  # kael's stop function decides
            self._end(seq)
        else:
            seq.last = token

    def _free(self, seq: Seq) -> None:
        """The sequence leaves the batch: its row back to the engine."""
        if seq in self._decoding:
            self._decoding.remove(seq)
        if seq in self._parked:
            self._parked.remove(seq)
            seq.parked = None
        if seq.row is not None:
            row, seq.row = seq.row, None
            self._engine.release(row)
            self._free_rows.append(row)

    def _end(self, seq: Seq) -> None:
        """A choice is done: its row goes back; its job ends with its last choice."""
        self._free(seq)
        try:
            seq.text = seq.choice.output.text()
        except Exception as exc:
            self._fail(seq.entry, Failed(exc))
            return
        entry = seq.entry
        if all(s.text is not None for s in entry.seqs):
            self._close(entry, None)

    def _fail(self, entry: Entry, failure: Failed) -> None:
        """The whole job ends with ``failure``: every one of its rows goes back."""
        for seq in entry.seqs:
            self._free(seq)
        self._close(entry, failure)

    def _close(self, entry: Entry, failure: Failed | None) -> None:
        """A job leaves the batch: its stats, then its final event (once)."""
        if entry.closed:
            return
        entry.closed = True
        if entry.accepted:
            stats = entry.job.stats
            stats.seconds = time.perf_counter() - entry.started
            self._metrics.generation_finished(stats.tokens, stats.seconds, stats.ttft)
        outcome: Outcome = failure if failure is not None else Finished(tuple(s.text or "" for s in entry.seqs))
        self._finish(entry, outcome)

    def _fail_everything(self, exc: BaseException) -> None:
        with self._changed:
            everyone = [*self._slotted.values(), *self._queue]
            finished = [(e, Failed(exc)) for e in everyone if self._remove(e)]
            self._decoding.clear()
            self._parked.clear()
            self._free_rows = list(range(self._engine.rows - 1, -1, -1))
            self._worker_alive = False
            self._changed.notify_all()
        for row in range(self._engine.rows):
            with contextlib.suppress(Exception):  # nothing more can be done for this engine row
                self._engine.release(row)
        self._emit_all(finished)
