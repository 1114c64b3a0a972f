"""JobOutput: what becomes of one choice's generated token ids (text pieces, stop strings, logprobs, stats).

Both schedulers feed it: the single slot through ``model.generate``'s ``on_token``, the
batch scheduler once per decode step. It runs on the thread that generates. A job has one
``Choice`` per sequence it generates (NOTE [choices] in jobs.py), each with its own output.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kael.engine import Detokenizer, SequenceStop, TokenSampler

from kael_server.errors import Cancelled
from kael_server.jobs import ChoiceStats, Job, TextPiece, TokenInfo
from kael_server.protocols import Tokenizer

__all__ = ["Choice", "Echo", "JobOutput", "token_info", "token_text"]


def token_text(tokenizer: Tokenizer, token: int) -> str:
    """A token as a logprobs answer names it: its text, or ``bytes:\\xNN...`` (OpenAI's spelling)
    for a token that is part of a UTF-8 character."""
    raw = tokenizer.decode([token])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def token_info(tokenizer: Tokenizer, token: int, record: Any, chars: int) -> TokenInfo:
    """A token's logprobs entry from kael's ``TokenLogprob`` ``record`` (None: no logprob, as for
    a prompt's first token), its text starting at character ``chars``."""
    name = token_text(tokenizer, token)
    if record is None:
        return TokenInfo(name, None, None, chars)
    top = {token_text(tokenizer, t): lp for t, lp in record.top}
    top.setdefault(name, record.logprob)  # OpenAI: the chosen token is always listed
    return TokenInfo(name, record.logprob, top, chars)


@dataclass(frozen=True)
class Echo:
    """A prompt as its choices' texts start (``echo``): its text and, with logprobs, its tokens."""

    text: str
    tokens: tuple[TokenInfo, ...] | None = None


class JobOutput:
    """Decodes one choice's tokens to whole UTF-8 characters, cuts at stop strings and emits the
    text pieces (with the logprobs of the tokens they complete).

    ``sampler`` (a ``kael.engine.TokenSampler`` or None) is the one that picks this choice's
    tokens; with ``params.logprobs`` its ``last`` record of each step becomes a ``TokenInfo``.
    When it ends is kael's one stop function (``kael.engine.SequenceStop``): ``end_tokens``
    (default: the tokenizer's ``eot_token``) are the model's end-of-text ids, which with the
    request's ``stop_token_ids`` end the text with finish reason "stop" (the model's own not
    with ``ignore_eos``) and are never part of it; stop strings count from token
    ``min_tokens`` on (vLLM's rule); ``max_tokens`` ends it with "length".
    """

    def __init__(
        self,
        job: Job,
        tokenizer: Tokenizer,
        index: int = 0,
        *,
        sampler: TokenSampler | None = None,
        echo: Echo | None = None,
        end_tokens: Collection[int] | None = None,
    ) -> None:
        self.job = job
        self.index = index
        self.tokenizer = tokenizer
        eos = frozenset(end_tokens) if end_tokens is not None else frozenset((tokenizer.eot_token,))
        self.stop = SequenceStop(job.params, eos)  # kael's one stop function
        self.text_out = Detokenizer(tokenizer, self.stop)  # whole UTF-8 characters, stop strings cut
        self.sampler = sampler if job.params.logprobs is not None else None
        while len(job.stats.choices) <= index:
            job.stats.choices.append(ChoiceStats())
        self.stats = job.stats.choices[index]
        self.pieces: list[str] = []
        self.pending: list[TokenInfo] = []
        self.interrupted = False
        if job.params.logprobs is not None:
            self.stats.logprobs = []
        if echo is not None:
            self.text_out.chars = len(echo.text)
            if echo.tokens is not None and self.stats.logprobs is not None:
                self.pending.extend(echo.tokens)
                self.stats.logprobs.extend(echo.tokens)
            self._send(echo.text)

    def on_token(self, token: int) -> bool:
        """Handles one generated token; False once generation must stop (cancelled, end of text, stop string)."""
        job, choice = self.job, self.stats
        if job.cancelled:
            self.interrupted = True
            return False
        if not self.stop.token(token):  # an end token: never part of the text
            choice.finish_reason = self.stop.finish_reason
            return False
        stats = job.stats
        stats.tokens += 1
        choice.tokens += 1
        if stats.ttft is None:
            stats.ttft = time.perf_counter() - job.arrived
        if self.sampler is not None:
            self._note(token)
        self._send(self.text_out.token(token))
        if self.stop.stopped:
            choice.finish_reason = self.stop.finish_reason
            return False
        return True

    def text(self) -> str:
        """The whole text once generation has ended; raises Cancelled if it was interrupted."""
        if self.interrupted:
            raise Cancelled(self.job.cancel_reason or "client")
        self._send(self.text_out.flush())
        if self.pending:  # logprobs of tokens whose text was held back, then cut or empty
            self.job.emit(TextPiece("", self.index, tuple(self.pending)))
            self.pending.clear()
        return "".join(self.pieces)

    def _note(self, token: int) -> None:
        last = self.sampler.last if self.sampler is not None else None
        if last is None or last.token != token:  # a sampler that did not pick this token
            raise RuntimeError(f"no logprob recorded for token {token} of choice {self.index}")
        info = token_info(self.tokenizer, token, last, self.text_out.chars)
        self.pending.append(info)
        if self.stats.logprobs is not None:
            self.stats.logprobs.append(info)

    def _send(self, text: str) -> None:
        if text:
            self.pieces.append(text)
            if self.pending:
                self.job.emit(TextPiece(text, self.index, tuple(self.pending)))
                self.pending.clear()
            else:
                self.job.emit(TextPiece(text, self.index))


@dataclass(eq=False)
class Choice:
    """One sequence of a job: its prompt's ids, where its tokens go, and how they are picked."""

    index: int
    ids: list[int]
    output: JobOutput
    sampler: TokenSampler | None = None
    """Its ``kael.engine.TokenSampler``, or None when ``model.generate`` / ``BatchEngine.sample``
    draws it alone (``TokenSampler.simple``)."""
    rng: object | None = None
    """Its random generator (None: greedy, or the model's default)."""
