"""One generation request as the worker thread and the event loop share it.

NOTE [job ownership]: a Job is created on the event loop and handed to a Scheduler, whose
worker thread writes ``stats`` and calls ``emit``; the loop only reads ``stats`` after the
final event (Finished or Failed) has arrived, and only the loop reads ``events`` and
``done``. ``emit`` crosses threads with ``loop.call_soon_threadsafe``, so the worker never
blocks on a slow or absent reader. ``cancel`` may be called from any thread; the worker
checks it before and after encoding and at every token.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float
    top_k: int
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass
class JobStats:
    """Written by the worker thread; read by the loop once the job is done."""

    prompt_tokens: int = 0
    tokens: int = 0
    ttft: float | None = None
    """Seconds from the request's arrival to its first generated token."""
    seconds: float = 0.0
    """Wall time of ``model.generate``."""
    finish_reason: str = "length"


@dataclass(frozen=True)
class PromptAccepted:
    tokens: int


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class Finished:
    text: str
    """The whole continuation (the concatenation of every TextPiece)."""


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = PromptAccepted | TextPiece | Finished | Failed
Outcome = Finished | Failed


@dataclass(eq=False)
class Job:
    prompt: str
    params: SamplingParams
    arrived: float
    """``time.perf_counter()`` when the request arrived."""
    loop: asyncio.AbstractEventLoop
    stats: JobStats = field(default_factory=JobStats)
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancel_reason: str | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.done: asyncio.Future[Outcome] = self.loop.create_future()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self, reason: str) -> None:
        """Asks the worker to stop at the next token; the first reason given is kept."""
        if not self._cancelled.is_set():
            self.cancel_reason = reason
            self._cancelled.set()

    def emit(self, event: Event) -> None:
        """Delivers ``event`` to the loop; safe from any thread, never blocks."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is left to tell
            self.loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: Event) -> None:
        self.events.put_nowait(event)
        if isinstance(event, Finished | Failed) and not self.done.done():
            self.done.set_result(event)
