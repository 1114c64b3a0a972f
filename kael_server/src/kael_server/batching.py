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
A job wider than the slots (``n`` choices on a one-slot server) runs when no other job holds
a row, on the engine's spare rows (``engine.rows`` may exceed ``slots``), as alone.

    submit (loop) -> rows free? hold them : queue room? wait (at most queue_timeout) : 429
    encoder thread: tokenize + check the prompts (never on the loop, never on the worker)
    worker: [prefill the ready jobs, fork their choices] -> decode step(batch)
            -> sample (greedy rows: one call) -> JobOutput per row ...

NOTE [kv memory]: with kael's paged KV cache (``BatchDecoder(paged=True)``, blocks of tokens
shared by prefix) rows only bound the batch; memory is the pool's blocks. A prefill that finds
too few free blocks (``KVCacheFull``, nothing changed) *parks* its sequence until others give
blocks back, and before each decode step, while the step needs more blocks than are free, the
newest sequence is *preempted*: its blocks go back (its full ones stay cached), and it is parked
to be recomputed from its prompt and every token it produced so far, in one prefill whose
logits are those the skipped decode step would have given; it then goes on exactly where it
stopped (its sampler and generator untouched), so its output is the unpreempted one. Parked
sequences come back first, oldest first, before new prompts start, and only while the pool
keeps one spare block per decoding sequence (so a resumed one is not preempted again at once).

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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kael.models import KVCacheFull

from kael_server.errors import Busy, Cancelled, FieldError, InvalidRequest, QueueTimeout
from kael_server.jobs import Failed, Finished, Job, Outcome
from kael_server.output import Choice
from kael_server.protocols import BatchEngine
from kael_server.scheduler import Scheduler

if TYPE_CHECKING:
    from kael_server.generator import Generator

__all__ = ["BatchScheduler"]


def _kv_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the paged KV cache lacks blocks (kael's ``KVCacheFull``; nothing changed)."""
    return isinstance(exc, KVCacheFull)


def _row(seq: _Seq) -> int:
    """The engine row of a started sequence."""
    assert seq.row is not None, "a sequence reaches the engine only once it holds a row"
    return seq.row


@dataclass(eq=False)
class _Entry:
    """A job as the batch scheduler tracks it."""

    job: Job
    admitted: float
    """``time.perf_counter()`` at submit."""
    width: int
    """Rows it takes: one per choice."""
    ids: list[list[int]] | None = None
    """The checked prompts, once the encoder thread is done."""
    seqs: list[_Seq] = field(default_factory=list)
    """Its choices, from the start on (by index)."""
    started: float = 0.0
    accepted: bool = False
    """Its prompts were accepted (counted): it is a generation, whatever happens next."""
    closed: bool = False
    """Its outcome was decided (on the worker)."""
    done: bool = False
    """Its final event was sent (under the lock, so it is sent once)."""


@dataclass(eq=False)
class _Seq:
    """One choice of a job in the batch."""

    entry: _Entry
    choice: Choice
    row: int | None = None
    """The engine row, from prefill to the end."""
    last: int = 0
    """The token fed at the next decode step."""
    produced: int = 0
    text: str | None = None
    """Its whole text, once it ended."""
    tokens: list[int] = field(default_factory=list)
    """Every token it produced (a preempted sequence is recomputed from its prompt and these)."""
    parked: str | None = None
    """Waiting for KV blocks: "start" (its prompt's first prefill) or "resume" (it was preempted)."""


class BatchScheduler(Scheduler):
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
        self._slotted: dict[Job, _Entry] = {}  # holding rows: encoding, waiting for prefill, or decoding
        self._used = 0  # rows the slotted jobs hold
        self._queue: deque[_Entry] = deque()
        self._worker_alive = False
        # The worker's own state (no lock): free engine rows and the sequences being decoded.
        self._free_rows = list(range(engine.rows - 1, -1, -1))
        self._decoding: list[_Seq] = []
        self._parked: list[_Seq] = []  # waiting for KV blocks, oldest first (NOTE [kv memory])
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
        entry = _Entry(job, time.perf_counter(), job.width)
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

    def _slot(self, entry: _Entry) -> None:
        self._slotted[entry.job] = entry
        self._used += entry.width

    def _remove(self, entry: _Entry) -> bool:
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

    def _start(self, entries: list[_Entry]) -> None:
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
                entry.seqs = [_Seq(entry, choice) for choice in generator.choices(job, entry.ids)]
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
        group: list[_Seq] = []
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

    def _prefill(self, group: list[_Seq]) -> None:
        """One shared prefill of the prompts of ``group`` (first choices); then the forks into
        their other choices' rows, and each choice's first token from the prompt's logits."""
        group = [seq for seq in group if not seq.entry.closed]  # another prompt of its job failed
        if not group:
            return
        firsts: list[tuple[_Seq, object]] = []
        if self._parked:  # parked sequences go first (NOTE [kv memory])
            for seq in group:
                self._park(seq, "start")
            return
        try:
            logits = self._engine.prefill_many([_row(s) for s in group], [s.choice.ids for s in group])
            firsts = [(seq, logits[i]) for i, seq in enumerate(group)]
        except Exception as exc:
            if len(group) == 1 and not _kv_full(exc):
                self._fail(group[0].entry, Failed(exc))
                return
            for seq in group:  # which prompt failed (or does not fit)? each alone, so the others go on
                if seq.entry.closed:
                    continue
                if self._parked:  # an earlier one did not fit: the later ones wait behind it
                    self._park(seq, "start")
                    continue
                try:
                    firsts.append((seq, self._engine.prefill(_row(seq), seq.choice.ids)))
                except Exception as alone:
                    if _kv_full(alone):
                        self._park(seq, "start")
                    else:
                        self._fail(seq.entry, Failed(alone))
        self._begin(firsts)

    def _begin(self, firsts: list[tuple[_Seq, object]]) -> None:
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
                    self._engine.fork(_row(source), _row(seq))
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
            logits = self._engine.decode([_row(s) for s in batch], [s.last for s in batch])
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

    # ---- KV memory: parking, preemption, resumption (NOTE [kv memory]) --------------------

    def _park(self, seq: _Seq, why: str) -> None:
        seq.parked = why
        self._parked.append(seq)
        self._parked.sort(key=lambda s: (s.entry.admitted, s.choice.index))

    def _make_room(self) -> None:
        """Preempts the newest decoding sequences until the next step's blocks are free."""
        engine = self._engine
        while len(self._decoding) > 1 and engine.blocks_needed([_row(s) for s in self._decoding]) > engine.free_blocks:
            victim = max(self._decoding, key=lambda s: (s.entry.admitted, s.choice.index))
            self._decoding.remove(victim)
            try:
                engine.preempt(_row(victim))
            except Exception as exc:
                self._fail(victim.entry, Failed(exc))
                continue
            self._metrics.preemptions.inc()
            self._park(victim, "resume")

    def _fits(self, seq: _Seq, tokens: int) -> bool:
        """Whether ``tokens`` new positions for ``seq`` leave one spare block per decoding sequence
        (always when nothing else decodes: the pool holds at least one whole context)."""
        if not self._decoding:
            return True
        engine = self._engine
        size = engine.block_size
        return engine.free_blocks - -(-tokens // size) >= len(self._decoding)

    def _unpark(self) -> None:
        """Parked sequences come back, oldest first, while they fit."""
        while self._parked:
            seq = self._parked[0]
            if seq.entry.closed:
                self._parked.pop(0)
                continue
            if seq.entry.job.cancelled:
                self._fail(seq.entry, Failed(Cancelled(seq.entry.job.cancel_reason or "client")))
                continue
            ids = seq.choice.ids if seq.parked == "start" else [*seq.choice.ids, *seq.tokens]
            if not self._fits(seq, len(ids)):
                return
            self._parked.pop(0)
            why, seq.parked = seq.parked, None
            try:
                logits = self._engine.prefill(_row(seq), ids)
            except Exception as exc:
                if _kv_full(exc):
                    seq.parked = why
                    self._parked.insert(0, seq)
                    return
                self._fail(seq.entry, Failed(exc))
                continue
            if why == "start":
                self._begin([(seq, logits)])
                continue
            # Resumed: these logits are the skipped step's (after its last token); it goes on from there.
            self._decoding.append(seq)
            try:
                token = self._sample(seq, logits)
            except Exception as exc:
                self._fail(seq.entry, Failed(exc))
                continue
            self._take(seq, token)

    def _cached_tokens(self, seq: _Seq) -> int:
        """The prompt tokens of ``seq``'s row that came from the prefix cache (a statistic: a
        failure to count it ends nothing)."""
        try:
            return int(self._engine.cached_tokens(_row(seq)))
        except Exception:
            return 0

    def _kv_stats(self) -> dict[str, int]:
        try:
            return dict(self._engine.kv_stats())
        except Exception:
            return {}

    def _greedy(self, batch: list[_Seq], logits: object) -> dict[int, int]:
        """The plain greedy rows' tokens (by position in the step) from one engine call; empty if
        fewer than two rows are greedy, or if that call fails (each row then samples alone,
        so a failure ends only its own job)."""
        rows = [
            i for i, seq in enumerate(batch) if seq.choice.sampler is None and seq.entry.job.params.temperature == 0
        ]
        if len(rows) < 2:
            return {}
        try:
            picked = self._engine.greedy(logits)
            return {i: int(picked[i]) for i in rows}
        except Exception:
            return {}

    def _sample(self, seq: _Seq, logits: Any) -> int:
        if seq.choice.sampler is not None:  # penalties, bias, top-p, min-p, logprobs: kael's TokenSampler
            return int(seq.choice.sampler(logits))
        params = seq.entry.job.params
        top_k = min(params.top_k, self._generator.vocab_size)
        return int(self._engine.sample(logits, params.temperature, top_k, seq.choice.rng))

    def _take(self, seq: _Seq, token: int) -> None:
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

    def _free(self, seq: _Seq) -> None:
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

    def _end(self, seq: _Seq) -> None:
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

    def _fail(self, entry: _Entry, failure: Failed) -> None:
        """The whole job ends with ``failure``: every one of its rows goes back."""
        for seq in entry.seqs:
            self._free(seq)
        self._close(entry, failure)

    def _close(self, entry: _Entry, failure: Failed | None) -> None:
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
