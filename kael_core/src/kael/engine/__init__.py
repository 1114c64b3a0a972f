"""kael's request-centric engine: the pieces between a request and its tokens.

- ``SamplingParams`` (params.py): the one struct saying how a request samples and stops;
- ``LogitsProcessor`` (logits_processors.py): the per-request seam that masks or biases a
  row's logits before sampling, with ``fork`` (n > 1) and ``rollback`` (rejected tokens);
- ``TokenSampler`` and ``sample_rows`` (sampler.py): the one batched sampler, with the one
  top-k rule (NOTE [one top-k rule] in distributions.py);
- ``SequenceStop`` (stop.py): the one stop function (end tokens, ``ignore_eos``, ``min_tokens``,
  stop strings, ``max_tokens``);
- ``Request`` (request.py): a sequence's ids, how many are computed, its params and status;
- ``Scheduler`` (scheduler.py): each step's plan of "n new tokens per row" under a token budget
  (chunked prefill, preemption of the newest request, resumption as a prefill);
- ``KVManager`` (kv_manager.py): rows and blocks of a ``BatchDecoder``'s paged cache;
- ``ModelRunner`` (runner.py): one forward pass per plan;
- ``Detokenizer`` (detokenize.py): a sequence's text as its tokens arrive (incremental UTF-8,
  stop strings cut by its ``SequenceStop``);
- ``Proposer``/``NgramProposer`` (proposers.py), ``DraftModelProposer`` (draft_proposer.py: a
  smaller model's greedy drafts) and ``Speculator`` (speculative.py): drafts verified in one
  multi-token step, outputs identical to plain decoding;
- ``EngineCore`` (core.py): the step that ties them (schedule, run, sample, stop).

See DESIGN.md, "The engine".
"""

from __future__ import annotations

from .core import EngineCore, StepEvent
from .detokenize import Detokenizer
from .distributions import draw, filter_row, log_softmax, softmax, top_logprobs
from .draft_proposer import DraftModelProposer
from .kv_manager import KVBackend, KVManager
from .logits_processors import LogitBias, LogitsProcessor, MinTokens, Penalties
from .params import MIN_TEMPERATURE, SamplingParamError, SamplingParams, check_temperature
from .proposers import NgramProposer, Proposer, ngram_lookup
from .request import Picker, Request, RequestError, RequestStatus, check_fits
from .runner import ModelRunner, Runner, StepLogits, isolate_rows
from .sampler import TokenLogprob, TokenSampler, pick, sample_rows
from .scheduler import ScheduledRow, Scheduler, SchedulerOutput
from .speculative import MAX_DRAFT_TOKENS, SpecState, Speculator, speculator_for
from .stop import FinishReason, SequenceStop, StopMatcher

__all__ = [
    "DraftModelProposer",
    "NgramProposer",
    "Proposer",
    "MAX_DRAFT_TOKENS",
    "SpecState",
    "Speculator",
    "speculator_for",
    "ngram_lookup",
    "MIN_TEMPERATURE",
    "Detokenizer",
    "EngineCore",
    "KVBackend",
    "KVManager",
    "ModelRunner",
    "Picker",
    "Request",
    "RequestError",
    "RequestStatus",
    "Runner",
    "ScheduledRow",
    "Scheduler",
    "SchedulerOutput",
    "StepEvent",
    "StepLogits",
    "check_fits",
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
    "isolate_rows",
    "log_softmax",
    "pick",
    "sample_rows",
    "softmax",
    "top_logprobs",
]
