"""kael's request-centric engine: the pieces between a request and its tokens.

- ``SamplingParams`` (params.py): the one struct saying how a request samples and stops;
- ``LogitsProcessor`` (logits_processors.py): the per-request seam that masks or biases a
  row's logits before sampling, with ``fork`` (n > 1) and ``rollback`` (rejected tokens);
- ``TokenSampler`` and ``sample_rows`` (sampler.py): the one batched sampler, with the one
  top-k rule (NOTE [one top-k rule] in distributions.py);
- ``SequenceStop`` (stop.py): the one stop function (end tokens, ``ignore_eos``, ``min_tokens``,
  stop strings, ``max_tokens``).

See DESIGN.md, "The engine".
"""

from __future__ import annotations

from .distributions import draw, filter_row, log_softmax, softmax, top_logprobs
from .logits_processors import LogitBias, LogitsProcessor, MinTokens, Penalties
from .params import MIN_TEMPERATURE, SamplingParamError, SamplingParams, check_temperature
from .sampler import TokenLogprob, TokenSampler, pick, sample_rows
from .stop import FinishReason, SequenceStop, StopMatcher

__all__ = [
    "MIN_TEMPERATURE",
    "FinishReason",
    "SequenceStop",
    "StopMatcher",
    "LogitBias",
    "LogitsProcessor",
    "MinTokens",
    "Penalties",
    "SamplingParamError",
    "SamplingParams",
    "TokenLogprob",
    "TokenSampler",
    "check_temperature",
    "draw",
    "filter_row",
    "log_softmax",
    "pick",
    "sample_rows",
    "softmax",
    "top_logprobs",
]
