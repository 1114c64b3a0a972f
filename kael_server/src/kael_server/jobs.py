"""One generation request as the worker thread and the event loop share it.

NOTE [job ownership]: a Job is created on the event loop and handed to a Scheduler, whose
worker thread writes ``stats`` and calls ``emit``; the loop only reads ``stats`` after the
final event (Finished or Failed) has arrived, and only the loop reads ``events`` and
``done``. ``emit`` crosses threads with ``loop.call_soon_threadsafe``, so the worker never
blocks on a slow or absent reader. ``cancel`` may be called from any thread; the worker
checks it before and after encoding and at every token. ``SamplingParams`` is kael's
(``kael.engine.SamplingParams``), the only such struct, re-exported here.

NOTE [choices]: a job generates ``len(prompts) * params.n`` sequences, its choices. Choice
``i`` continues prompt ``i // n`` (OpenAI's numbering of ``index``); its ``TextPiece``s carry
``index=i``, ``stats.choices[i]`` holds its token count, finish reason and logprobs, and
``Finished.texts[i]`` its whole text. The ``n`` choices of one prompt share its encoding
and, when batched, its prefill; a seeded request samples choice ``i`` with ``seed + i % n``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

from kael.engine import SamplingParams

__all__ = [
    "ChoiceStats",
    "ChatPrompt",
    "Event",
    "Failed",
    "Finished",
    "Job",
    "JobStats",
    "Outcome",
    "Prompt",
    "PromptAccepted",
    "SamplingParams",
    "TextPiece",
    "TokenInfo",
]


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation rendered by the model's chat template, encoded as a chat prompt (the
    special tokens written in it are the tokenizer's specials; ``kael.tokenizer.encode_chat``)."""

    text: str


Prompt = str | tuple[int, ...] | ChatPrompt
"""Text to encode, token ids as they are, or a rendered conversation."""


@dataclass(frozen=True)
class TokenInfo:
    """One token as a logprobs answer shows it."""

    text: str
    logprob: float | None
    """None for the first prompt token (nothing comes before it)."""
    top: dict[str, float] | None
    """The most likely tokens at this position (and the chosen one), by text."""
    offset: int
    """Where the token starts in the choice's text, in characters."""


@dataclass
class ChoiceStats:
    """One choice, written by the worker thread; read by the loop once the job is done."""

    tokens: int = 0
    finish_reason: str = "length"
    logprobs: list[TokenInfo] | None = None
    """With ``params.logprobs``: every token of the text (the echoed prompt's first)."""


@dataclass
class JobStats:
    """Written by the worker thread; read by the loop once the job is done."""

    prompt_tokens: int = 0
    """Every prompt's tokens, each prompt counted once (whatever ``n``)."""
    cached_tokens: int = 0
    """Of those, the tokens whose keys and values came from the prefix cache (not computed)."""
    tokens: int = 0
    """Generated tokens, over every choice."""
    ttft: float | None = None
    """Seconds from the request's arrival to its first generated token."""
    seconds: float = 0.0
    """Wall time of the generation itself."""
    choices: list[ChoiceStats] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """The first choice's (a job of one choice: its only one)."""
        return self.choices[0].finish_reason if self.choices else "length"


@dataclass(frozen=True)
class PromptAccepted:
    tokens: int


@dataclass(frozen=True)
class TextPiece:
    text: str
    index: int = 0
    """The choice it belongs to (NOTE [choices])."""
    logprobs: tuple[TokenInfo, ...] = ()
    """With ``params.logprobs``: the tokens not sent before, up to this piece."""


@dataclass(frozen=True)
class Finished:
    texts: tuple[str, ...]
    """Each choice's whole text (the concatenation of its TextPieces)."""

    @property
    def text(self) -> str:
        """The first choice's text (a job of one choice: its only one)."""
        return self.texts[0]


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = PromptAccepted | TextPiece | Finished | Failed
Outcome = Finished | Failed


@dataclass(eq=False)
class Job:
    prompts: tuple[Prompt, ...]
    params: SamplingParams
    """With ``fit_context``, replaced once by the worker's ``Generator.prepare`` (its max_tokens
    fitted to the encoded prompts) before the job is accepted; read by the worker after that."""
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
    def width(self) -> int:
        """Its sequences (NOTE [choices]): what it takes of a batch."""
        return len(self.prompts) * self.params.n

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
