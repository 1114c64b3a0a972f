"""One generation request as the worker thread and the event loop share it.

NOTE [job ownership]: a Job is created on the event loop and handed to a Scheduler, whose
worker thread writes ``stats`` and calls ``emit``; the loop only reads ``stats`` after the
final event (Finished or Failed) has arrived, and only the loop reads ``events`` and
``done``. ``emit`` crosses threads with ``loop.call_soon_threadsafe``, so the worker never
blocks on a slow or absent reader. ``cancel`` may be called from any thread; the worker
checks it before and after encoding and at every token.

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
class SamplingParams:
    """How every choice of a job is generated (kael_server's view of OpenAI's and vLLM's fields).

    The neutral values (top_p 1, min_p 0, no penalty, no bias, min_tokens 0, no logprobs) leave
    sampling to ``Model.generate`` / ``BatchEngine.sample`` (``plain``): the fast path; anything
    else goes through a ``kael.models.TokenSampler`` per choice.
    """

    max_tokens: int
    temperature: float
    top_k: int
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    """Record each generated token's log-probability and this many top alternatives."""
    echo: bool = False
    """Each choice's text starts with its prompt (with the prompt's logprobs when ``logprobs`` is set)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a choice besides the model's own end-of-text ids (a chat template's
    end-of-turn tokens); like those, never part of the text."""
    fit_context: bool = False
    """``max_tokens`` is an upper bound: once the prompt is encoded it becomes at most what the
    context leaves after the longest prompt (a chat request without max_tokens)."""

    @property
    def plain(self) -> bool:
        """Whether temperature and top_k say everything: sampled as ``Model.generate`` does alone."""
        return (
            self.top_p == 1
            and self.min_p == 0
            and self.presence_penalty == 0
            and self.frequency_penalty == 0
            and self.repetition_penalty == 1
            and not self.logit_bias
            and self.min_tokens == 0
            and self.logprobs is None
        )


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
