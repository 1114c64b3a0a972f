"""Sampling helpers over one row of logits, and prompt logprobs, for callers of ``kael.models``.

The sampler itself is ``kael.engine`` (``SamplingParams``, ``TokenSampler``, ``sample_rows``;
NOTE [sampling order] in kael/engine/sampler.py). These functions apply one of its steps to one
row [V] in float64 NumPy (a host copy; the caller's logits are untouched), each with a direct
NumPy oracle: ``apply_logit_bias``, ``apply_penalties`` and ``filter_logits`` run the engine's
own processors and filter; ``prompt_logprobs`` scores a prompt with one forward pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import _dtype as dt
from .._errors import KaelError, ShapeError
from ..autograd import no_grad
from ..engine import LogitBias, Penalties, SamplingParams, TokenLogprob, TokenSampler, log_softmax, top_logprobs
from ..engine.distributions import filter_row, row
from ..ops import tensor

__all__ = [
    "TokenLogprob",
    "TokenSampler",
    "apply_logit_bias",
    "apply_penalties",
    "filter_logits",
    "log_softmax",
    "prompt_logprobs",
    "top_logprobs",
]


def _token_id(op: str, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 0:
        raise KaelError(f"{op}: {what} must be a token id (an int >= 0), got {value!r}")
    return int(value)


def apply_logit_bias(logits: Any, logit_bias: Mapping[int, float]) -> np.ndarray:
    """``logits + bias`` for the biased token ids (each id must be below V)."""
    x = row(logits, "apply_logit_bias")
    pairs = SamplingParams(logit_bias=logit_bias).logit_bias
    if pairs:
        LogitBias(pairs).apply(x, ())
    return x


def apply_penalties(
    logits: Any,
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    *,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 1.0,
) -> np.ndarray:
    """The repetition, frequency and presence penalties (``kael.engine.Penalties``) applied to
    one row of logits, for a sequence with these prompt and generated tokens."""
    x = row(logits, "apply_penalties")
    SamplingParams(
        presence_penalty=presence_penalty, frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty
    )  # checks the values
    prompt = [_token_id("apply_penalties", "a token", t) for t in prompt_tokens]
    output = [_token_id("apply_penalties", "a token", t) for t in output_tokens]
    Penalties(prompt, presence_penalty, frequency_penalty, repetition_penalty).apply(x, output)
    return x


def filter_logits(
    logits: Any, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> np.ndarray:
    """``logits / temperature`` with the tokens that top-k, top-p and min-p drop set to -inf
    (temperature > 0; top_k 0 or -1, top_p 1 and min_p 0 drop nothing): the engine's filter."""
    SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)  # checks the values
    if temperature == 0:
        raise KaelError("filter_logits: temperature 0 is greedy (an argmax): there is nothing to filter")
    return filter_row(row(logits, "filter_logits"), temperature, top_k, top_p, min_p)


def prompt_logprobs(model: Any, ids: Sequence[int], top_n: int = 0) -> list[TokenLogprob | None]:
    """Each prompt token's log-probability given the tokens before it, with the ``top_n`` most
    likely tokens at that position, from one forward pass ``model(ids)`` (no cache); the first
    token has none (None). ``model`` is a causal LM (``CausalLM``); ``ids`` fit its context."""
    ids = [_token_id("prompt_logprobs", "a prompt token", t) for t in ids]
    if not ids:
        raise KaelError("prompt_logprobs: the prompt is empty")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise KaelError(f"prompt_logprobs: top_n must be an int >= 0, got {top_n!r}")
    out: list[TokenLogprob | None] = [None]
    if len(ids) == 1:
        return out
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with no_grad():
            logits = model(tensor([ids[:-1]], dtype=dt.int64, device=model.device))
    finally:
        if was_training:
            model.train()
    host = np.asarray(logits)
    v = host.shape[-1]
    if host.shape[:2] != (1, len(ids) - 1):
        raise ShapeError(f"prompt_logprobs: the model gave logits {list(host.shape)} for {len(ids) - 1} tokens")
    for k in range(1, len(ids)):
        if ids[k] >= v:
            raise ShapeError(f"prompt_logprobs: token id {ids[k]} is out of range for a vocabulary of {v}")
        lp = log_softmax(host[0, k - 1])
        out.append(TokenLogprob(ids[k], float(lp[ids[k]]), top_logprobs(lp, top_n)))
    return out
