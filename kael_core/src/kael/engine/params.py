"""``SamplingParams``: how one request's sequences pick their tokens and when they stop.

The only such struct in kael: the server parses a request body into it once (as llama.cpp's
``params_from_json_cmpl`` does), ``generate``'s ``temperature``/``top_k`` become one, and the
engine's sampler (``kael.engine.sampler``) and stop function (``kael.engine.stop``) read it.
Every bad field raises ``SamplingParamError`` naming the field (``error.field``), so a server
answers a 400 that says which field was wrong.

Neutral values leave the distribution alone: ``top_k`` 0 or -1 (or at least the vocabulary
size), ``top_p`` 1, ``min_p`` 0, the penalties 0 (repetition 1) and no ``logit_bias``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import KaelError

__all__ = ["MIN_TEMPERATURE", "SamplingParamError", "SamplingParams", "check_temperature"]

MIN_TEMPERATURE = 0.001
"""The smallest temperature that is not 0 (greedy): a smaller one overflows float64 logits / T."""


class SamplingParamError(KaelError):
    """A SamplingParams field with a bad value; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))


def _int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_temperature(temperature: Any, op: str) -> None:
    """A KaelError naming ``op`` unless temperature is 0 (greedy) or finite and >= MIN_TEMPERATURE."""
    if (
        not _number(temperature)
        or math.isnan(temperature)
        or not (temperature == 0 or MIN_TEMPERATURE <= temperature < math.inf)
    ):
        raise SamplingParamError(
            "temperature",
            f"{op}: temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got {temperature!r}",
        )


@dataclass(frozen=True)
class SamplingParams:
    """How every sequence of one request is generated (OpenAI's, vLLM's and llama.cpp's fields).

    ``temperature`` 0 is greedy (the argmax, the first on ties). ``top_k`` keeps the logits at
    or above the k-th largest (ties kept; 0 and -1 disable it), ``top_p`` the smallest set of
    likeliest tokens reaching p, ``min_p`` the tokens at least min_p times as likely as the
    likeliest. ``logit_bias`` (token id -> bias, stored as sorted pairs), the penalties and
    ``min_tokens`` (the end tokens are masked until that many were generated) act before them.

    ``n`` sequences per prompt; a seeded request samples sequence ``i`` with ``seed + i``.
    ``stop`` strings and ``stop_token_ids`` end a sequence besides the model's end-of-text ids
    (which ``ignore_eos`` disregards); ``max_tokens`` bounds its length (with ``fit_context``,
    it is an upper bound lowered to what the context leaves after the prompt). ``logprobs``:
    record each token's log-probability and this many top alternatives (None: nothing);
    ``echo``: the text starts with the prompt.

    ``constraint`` (a ``kael.constraints.Constraint``: JSON schema, regex, choice, grammar) is
    what every sequence's output must match: the sampler masks each step's logits to the tokens
    the grammar allows and, once it allows only the end, the end token ends the sequence
    ("stop"); ``max_tokens`` first ends it cut ("length"). Constraints never fail open: a
    grammar state allowing no token is an error, never an unmasked step. ``min_tokens`` is
    refused with a constraint (it would mask the only token a complete match allows).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Any = ()
    """Token id -> bias: a mapping or (id, bias) pairs; stored as a tuple of pairs sorted by id."""
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    fit_context: bool = False
    constraint: Any = None
    """None, or a ``kael.constraints.Constraint`` (frozen, hashable)."""

    def __post_init__(self) -> None:
        op = "SamplingParams"
        check_temperature(self.temperature, op)

        def bad(field: str, expected: str) -> SamplingParamError:
            return SamplingParamError(field, f"{op}: {field} must be {expected}, got {getattr(self, field)!r}")

        if not _int(self.max_tokens) or self.max_tokens < 0:
            raise bad("max_tokens", "an int >= 0")
        if not _int(self.top_k) or self.top_k < -1:
            raise bad("top_k", "an int >= -1 (0 and -1 disable it)")
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "a number in (0, 1]")
        if not _number(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "a number in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not _number(getattr(self, name)) or not math.isfinite(getattr(self, name)):
                raise bad(name, "a finite number")
        if self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "> 0")
        object.__setattr__(self, "logit_bias", _bias_pairs(op, self.logit_bias))
        if not _int(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", "an int >= 0")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "a tuple of non-empty strings")
        if not isinstance(self.stop_token_ids, tuple) or not all(_int(t) and t >= 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a tuple of token ids (ints >= 0)")
        for name in ("ignore_eos", "echo", "fit_context"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "a bool")
        if not _int(self.n) or self.n < 1:
            raise bad("n", "an int >= 1")
        if self.seed is not None and not _int(self.seed):
            raise bad("seed", "None or an int")
        if self.logprobs is not None and (not _int(self.logprobs) or self.logprobs < 0):
            raise bad("logprobs", "None or an int >= 0")
        if self.constraint is not None:
            from ..constraints._spec import Constraint  # kael.constraints needs the optional llguidance

            if not isinstance(self.constraint, Constraint):
                raise bad("constraint", "None or a kael.constraints.Constraint (json_schema, regex, choice, grammar)")
            if self.min_tokens:
                raise SamplingParamError(
                    "min_tokens",
                    f"{op}: min_tokens ({self.min_tokens}) cannot be combined with a constraint "
                    f"({self.constraint.field}): it would mask the end token a complete match needs",
                )

    @property
    def greedy(self) -> bool:
        """Whether a token is the argmax of the (processed) logits."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def truncates(self, vocab_size: int) -> bool:
        """Whether top-k, top-p or min-p can drop a token of a vocabulary this size."""
        return 0 < self.top_k < vocab_size or self.top_p < 1 or self.min_p > 0


def _bias_pairs(op: str, bias: Any) -> tuple[tuple[int, float], ...]:
    items = bias.items() if isinstance(bias, Mapping) else bias
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise SamplingParamError(
            "logit_bias", f"{op}: logit_bias must be a mapping of token id to bias, got {bias!r}"
        ) from None
    out: dict[int, float] = {}
    for token, value in pairs:
        if not _int(token) or token < 0:
            raise SamplingParamError(
                "logit_bias", f"{op}: a logit_bias key must be a token id (an int >= 0), got {token!r}"
            )
        if not _number(value) or not math.isfinite(value):
            raise SamplingParamError(
                "logit_bias", f"{op}: logit_bias[{token!r}] must be a finite number, got {value!r}"
            )
        out[int(token)] = float(value)
    return tuple(sorted(out.items()))
