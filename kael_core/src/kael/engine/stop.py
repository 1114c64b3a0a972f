"""The one stop function: when a sequence ends, and what of its text a client may see.

``SequenceStop`` decides, for one sequence of a request, every way it can end (vLLM's and
OpenAI's rules):

- an end token: the model's end-of-text / eos ids and ``params.stop_token_ids`` (a chat
  template's end-of-turn ids) end it with finish reason "stop" and are never part of its text;
  with ``ignore_eos`` the model's ids are ordinary tokens (shown as nothing) and generation
  goes on (``stop_token_ids`` still end it);
- ``min_tokens``: no stop string ends it before that many tokens (the sampler masks the end
  tokens until then: NOTE [sampling order]);
- a stop string (``params.stop``): its text is cut where the first completed stop string
  starts (``StopMatcher``), finish reason "stop";
- the length limit: ``max_tokens`` tokens, finish reason "length".
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from .params import SamplingParams

__all__ = ["FinishReason", "SequenceStop", "StopMatcher"]

FinishReason = Literal["stop", "length"]


class SequenceStop:
    """One sequence's stop state: feed it each token (``token``), then that token's text (``text``).

    ``eos_ids`` are the model's end-of-text ids. ``finish_reason`` is "length" until something
    ends the sequence with "stop". ``generated`` counts the tokens that are part of the text
    (an end token that stops the sequence is not).
    """

    def __init__(self, params: SamplingParams, eos_ids: Collection[int] = ()) -> None:
        self.params = params
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self.end_tokens = self.eos_ids | frozenset(params.stop_token_ids)
        """Every id that ends the sequence (unless ``ignore_eos`` for the model's own)."""
        self.strings = StopMatcher(params.stop)
        self.generated = 0
        self.produced = 0
        """Tokens the model produced, end tokens too (what ``max_tokens`` bounds)."""
        self.finish_reason: FinishReason = "length"
        self.stopped = False

    def token(self, token: int) -> bool:
        """The next token: True if it is part of the text (its text follows with ``text``);
        False if it ends the sequence (an end token: finish reason "stop")."""
        self.produced += 1
        ends = token in self.end_tokens and not (self.params.ignore_eos and token not in self.params.stop_token_ids)
        if ends:
            self.finish_reason, self.stopped = "stop", True
            return False
        self.generated += 1
        return True

    def silent(self, token: int) -> bool:
        """Whether an accepted ``token`` shows no text (a model end id under ``ignore_eos``)."""
        return token in self.end_tokens

    def text(self, piece: str) -> str:
        """The text of the token just accepted: what is safe to send now (stop strings held back
        or cut; from ``min_tokens`` on). Sets ``stopped`` once a stop string completes."""
        if self.generated < self.params.min_tokens:
            return piece
        safe = self.strings.feed(piece)
        if self.strings.stopped:
            self.finish_reason, self.stopped = "stop", True
        return safe

    def flush(self, rest: str = "") -> str:
        """The sequence ended: ``rest`` (text its decoder still held) and the text held back as a
        possible stop string, unless a stop string already cut the text."""
        if self.strings.stopped:
            return ""
        return self.strings.feed(rest) + self.strings.flush()

    @property
    def at_length(self) -> bool:
        """Whether ``max_tokens`` tokens were produced (finish reason "length" unless stopped)."""
        return self.produced >= self.params.max_tokens

    @property
    def done(self) -> bool:
        """Whether the sequence ends here: stopped, or at its length."""
        return self.stopped or self.at_length


class StopMatcher:
    """Feeds text pieces in order and releases only text that cannot be part of a stop string.

    The output is cut at the stop string that completes first (earliest end; on a tie, the
    one that starts first), which is what a client would see if it had the whole text at
    once and streaming never changed the result. Text that could still become a stop string
    is held back across pieces, so a stop split over several events is never leaked.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Returns the text that is now safe to send; sets ``stopped`` once a stop string completes."""
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        cut = _first_stop(text, self._stops)
        if cut is not None:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = _longest_partial_suffix(text, self._stops)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """Ends the text: what was held back is no stop string, so it is released."""
        held, self._held = self._held, ""
        return held


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """The start of the stop occurrence that ends first in ``text``, or None."""
    best: tuple[int, int] | None = None  # (end, start)
    for stop in stops:
        start = text.find(stop)
        if start >= 0:
            candidate = (start + len(stop), start)
            if best is None or candidate < best:
                best = candidate
    return None if best is None else best[1]


def _longest_partial_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
