"""The batch scheduler's state: a job (Entry) and its choices (Seq), its KV memory, its sampling.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kael.models import KVCacheFull

from kael_server.errors import Cancelled
from kael_server.jobs import Failed, Job
from kael_server.metrics import Metrics
from kael_server.output import Choice
from kael_server.protocols import BatchEngine

if TYPE_CHECKING:
    from kael_server.generator import Generator

__all__ = ["Entry", "KvMemory", "Seq", "StepSampling", "kv_full", "row_of"]


def kv_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the paged KV cache lacks blocks (kael's ``KVCacheFull``; nothing changed)."""
    return isinstance(exc, KVCacheFull)


def row_of(seq: Seq) -> int:
    """The engine row of a started sequence."""
    assert seq.row is not None, "a sequence reaches the engine only once it holds a row"
    return seq.row


@dataclass(eq=False)
class Entry:
    """A job as the batch scheduler tracks it."""

    job: Job
    admitted: float
    """``time.perf_counter()`` at submit."""
    width: int
    """Rows it takes: one per choice."""
    ids: list[list[int]] | None = None
    """The checked prompts, once the encoder thread is done."""
    seqs: list[Seq] = field(default_factory=list)
    """Its choices, from the start on (by index)."""
    started: float = 0.0
    accepted: bool = False
    """Its prompts were accepted (counted): it is a generation, whatever happens next."""
    closed: bool = False
    """Its outcome was decided (on the worker)."""
    done: bool = False
    """Its final event was sent (under the lock, so it is sent once)."""


@dataclass(eq=False)
class Seq:
    """One choice of a job in the batch."""

    entry: Entry
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


class KvMemory:
    """The batch scheduler's KV memory: parking, preemption and resumption (NOTE [kv memory]).

    A mixin of BatchScheduler, which owns these attributes and the methods it calls back.
    """

    _engine: BatchEngine
    _metrics: Metrics
    _decoding: list[Seq]
    _parked: list[Seq]

    if TYPE_CHECKING:  # BatchScheduler's (StepSampling's), declared for the type checker only

        def _fail(self, entry: Entry, failure: Failed) -> None: ...

        def _sample(self, seq: Seq, logits: Any) -> int: ...

        def _take(self, seq: Seq, token: int) -> None: ...

        def _begin(self, firsts: list[tuple[Seq, object]]) -> None: ...

    def _park(self, seq: Seq, why: str) -> None:
        seq.parked = why
        self._parked.append(seq)
        self._parked.sort(key=lambda s: (s.entry.admitted, s.choice.index))

    def _make_room(self) -> None:
        """Preempts the newest decoding sequences until the next step's blocks are free."""
        engine = self._engine
        while (
            len(self._decoding) > 1 and engine.blocks_needed([row_of(s) for s in self._decoding]) > engine.free_blocks
        ):
            victim = max(self._decoding, key=lambda s: (s.entry.admitted, s.choice.index))
            self._decoding.remove(victim)
            try:
                engine.preempt(row_of(victim))
            except Exception as exc:
                self._fail(victim.entry, Failed(exc))
                continue
            self._metrics.preemptions.inc()
            self._park(victim, "resume")

    def _fits(self, seq: Seq, tokens: int) -> bool:
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
                logits = self._engine.prefill(row_of(seq), ids)
            except Exception as exc:
                if kv_full(exc):
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

    def _cached_tokens(self, seq: Seq) -> int:
        """The prompt tokens of ``seq``'s row that came from the prefix cache (a statistic: a
        failure to count it ends nothing)."""
        try:
            return int(self._engine.cached_tokens(row_of(seq)))
        except Exception:
            return 0

    def _kv_stats(self) -> dict[str, int]:
        try:
            return dict(self._engine.kv_stats())
        except Exception:
            return {}


class StepSampling:
    """How the batch scheduler picks each row's token of a step: a mixin of BatchScheduler."""

    _engine: BatchEngine
    _generator: Generator

    def _greedy(self, batch: list[Seq], logits: object) -> dict[int, int]:
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

    def _sample(self, seq: Seq, logits: Any) -> int:
        if seq.choice.sampler is not None:  # penalties, bias, top-p, min-p, logprobs: kael's TokenSampler
            return int(seq.choice.sampler(logits))
        params = seq.entry.job.params
        top_k = min(params.top_k, self._generator.vocab_size)
        return int(self._engine.sample(logits, params.temperature, top_k, seq.choice.rng))
