"""``constrained_sampler``: a matcher as a bare ``model.generate(..., sampler=...)`` (greedy on
the masked logits, for a caller that holds its own matcher): each step masks the logits with
the matcher, picks the highest-logit allowed token and advances the matcher;
``on_token=stop_at_end(eos)`` ends the loop at the end token. The usual way is
``model.generate(..., constraint=c, tokenizer=tok)`` (or ``SamplingParams(constraint=c)`` in a
``kael.engine.TokenSampler``), which samples with every other setting too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._matcher import ConstraintMatcher

__all__ = ["constrained_sampler", "stop_at_end"]


def constrained_sampler(matcher: ConstraintMatcher, eos: int) -> Callable[[Any, Sequence[int]], int]:
    """A ``sampler(logits, tokens) -> id`` taking the greedy token the constraint allows
    (``eos`` once the output is complete and ``eos`` scores highest, or the grammar is done)."""

    def sample(logits: Any, tokens: Sequence[int]) -> int:
        row = np.array(logits.numpy() if hasattr(logits, "numpy") else logits, dtype=np.float64).reshape(-1)
        matcher.apply(row, tokens)
        token = int(np.argmax(row))
        if token != eos:
            matcher.accept(token)
        return token

    return sample


def stop_at_end(eos: int) -> Callable[[int], bool]:
    """An ``on_token`` that stops generation after ``eos``."""
    return lambda token: token != eos
