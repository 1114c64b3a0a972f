"""The logits-processor seam: per-request changes to a row's logits before it is sampled.

NOTE [logits processors]: a request carries a list of processors (``LogitsProcessor``). At
each step, before the sampler draws, every processor in turn gets the row's logits (a float64
NumPy array [V] the sampler owns) and the tokens the sequence generated so far; it changes the
array in place (returning None) or returns the masked/biased array to use instead. A
processor with state (a grammar's position, say) keeps it in step with those tokens:

- ``fork()`` returns an independent copy, for the ``n > 1`` sequences of one prompt;
- ``rollback(n_tokens)`` forgets the last ``n_tokens`` accepted tokens (speculative tokens that
  were rejected);
- ``accept(token)`` is told each token the sequence continues with.

Preemption never touches a processor: it lives with the request, not with a batch row, so a
resumed request's processors are where they were. kael's own processors (``LogitBias``,
``Penalties``, ``MinTokens``) are functions of the tokens they are given and keep no state.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Protocol, Self, runtime_checkable

import numpy as np

from .._errors import ShapeError

__all__ = ["LogitBias", "LogitsProcessor", "MinTokens", "Penalties", "check_ids"]

_NEG_INF = -math.inf


@runtime_checkable
class LogitsProcessor(Protocol):
    """Changes one row's logits before sampling (NOTE [logits processors])."""

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray | None:
        """Mask or bias ``logits`` [V] (float64) given the tokens generated so far: in place
        (return None) or return the array to use."""
        ...

    def accept(self, token: int) -> None:
        """The sequence continues with ``token``."""
        ...

    def fork(self) -> LogitsProcessor:
        """An independent copy for another sequence of the same prompt."""
        ...

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` accepted tokens."""
        ...


def check_ids(op: str, what: str, ids: np.ndarray, v: int) -> None:
    """A ShapeError naming ``op`` when an id is not below the vocabulary size ``v``."""
    if ids.size and int(ids.max()) >= v:
        raise ShapeError(f"{op}: {what} {int(ids.max())} is out of range for a vocabulary of {v}")


class _Stateless:
    """accept/fork/rollback of a processor that is a function of the tokens it is given."""

    def accept(self, token: int) -> None:
        """Nothing to remember."""

    def fork(self) -> Self:
        """Itself: it has no state to copy."""
        return self

    def rollback(self, n_tokens: int) -> None:
        """Nothing to forget."""


class LogitBias(_Stateless):
    """OpenAI's ``logit_bias``: adds each (token id, bias) to that token's logit."""

    def __init__(self, pairs: Sequence[tuple[int, float]]) -> None:
        self.ids = np.array([t for t, _ in pairs], dtype=np.int64)
        self.values = np.array([b for _, b in pairs], dtype=np.float64)

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        """``logits[id] += bias`` for every biased id."""
        check_ids("logit_bias", "token id", self.ids, logits.shape[0])
        logits[self.ids] += self.values


class Penalties(_Stateless):
    """The repetition (vLLM / Hugging Face), frequency and presence (OpenAI) penalties.

    For every token seen in ``prompt`` or the output a positive logit is divided by
    ``repetition`` and a negative one multiplied by it; then ``logit[j] -= c[j] * frequency +
    (c[j] > 0) * presence``, c[j] the times j was generated (the prompt does not count).
    """

    def __init__(self, prompt: Sequence[int], presence: float, frequency: float, repetition: float) -> None:
        self.prompt = np.array(prompt, dtype=np.int64)
        self.presence, self.frequency, self.repetition = presence, frequency, repetition

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        """The penalties for a sequence that generated ``tokens``, in place."""
        v = logits.shape[0]
        out = np.array(tokens, dtype=np.int64)
        check_ids("penalties", "token id", self.prompt, v)
        check_ids("penalties", "token id", out, v)
        counts = np.bincount(out, minlength=v)
        if self.repetition != 1:
            seen = counts > 0
            seen[self.prompt] = True
            hit = logits[seen]
            with np.errstate(over="ignore"):  # a tiny penalty may overflow a logit to +-inf: that is its meaning
                logits[seen] = np.where(hit > 0, hit / self.repetition, hit * self.repetition)
        if self.frequency != 0:
            logits -= counts * self.frequency
        if self.presence != 0:
            logits -= (counts > 0) * self.presence


class MinTokens(_Stateless):
    """``min_tokens``: the end tokens get -inf until ``min_tokens`` tokens were generated."""

    def __init__(self, min_tokens: int, end_tokens: Collection[int]) -> None:
        self.min_tokens = min_tokens
        self.ids = np.array(sorted(end_tokens), dtype=np.int64)

    def apply(self, logits: np.ndarray, tokens: Sequence[int]) -> None:
        """Masks the end tokens while fewer than ``min_tokens`` were generated."""
        check_ids("min_tokens", "stop token", self.ids, logits.shape[0])
        if len(tokens) < self.min_tokens:
            logits[self.ids] = _NEG_INF
