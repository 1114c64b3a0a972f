"""Models: the causal-LM protocol, the model-family registry, generation, batched decoding, GPT-2, Llama, Qwen3,
Qwen3-MoE, Granite, SmolLM3, OLMo 2, Phi-3, Gemma 3, Gemma 2.

NOTE [model-family seam] (``_protocol.py``): everything that runs a model depends on
``CausalLM``; families (``kael.models.gpt2``, a third party's) are found by their Hugging
Face ``model_type`` through ``from_pretrained``'s registry (``_registry.py``).
"""

from __future__ import annotations

from ..engine import SamplingParams
from ._base import CausalLMBase
from ._batched import BatchDecoder
from ._generate import Sampler, generate, sample_next
from ._generation_config import GenerationConfig, read_generation_config
from ._gguf import load_gguf
from ._gguf_save import save_gguf
from ._paged_cache import KVCacheFull, PagedKVCache
from ._paged_step import PagedStep
from ._protocol import CausalLM, DecodeStep, StepLike
from ._registry import (
    ENTRY_POINT_GROUP,
    ModelFamily,
    families,
    from_pretrained,
    get_family,
    model_type_of,
    read_config_json,
    register_family,
    unregister_family,
)
from ._sampling import (
    TokenLogprob,
    TokenSampler,
    apply_logit_bias,
    apply_penalties,
    filter_logits,
    log_softmax,
    prompt_logprobs,
    top_logprobs,
)
from ._steps import GenericStep, decode_step
from ._weights import WEIGHTS, QuantizedTable
from .gemma2 import Gemma2Config, Gemma2ForCausalLM
from .gemma3 import Gemma3Config, Gemma3ForCausalLM
from .gpt2 import GPT, GPTConfig, load_gpt2, read_config, save_pretrained
from .granite import GraniteConfig, GraniteForCausalLM
from .llama import LlamaConfig, LlamaForCausalLM
from .olmo2 import Olmo2Config, Olmo2ForCausalLM
from .phi3 import Phi3Config, Phi3ForCausalLM
from .qwen3 import Qwen3Config, Qwen3ForCausalLM
from .qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from .smollm3 import SmolLM3Config, SmolLM3ForCausalLM

__all__ = [
    "CausalLM",
    "CausalLMBase",
    "DecodeStep",
    "StepLike",
    "GenericStep",
    "decode_step",
    "ModelFamily",
    "ENTRY_POINT_GROUP",
    "register_family",
    "unregister_family",
    "families",
    "get_family",
    "model_type_of",
    "read_config_json",
    "GenerationConfig",
    "read_generation_config",
    "from_pretrained",
    "WEIGHTS",
    "QuantizedTable",
    "load_gguf",
    "save_gguf",
    "GPT",
    "GPTConfig",
    "LlamaForCausalLM",
    "LlamaConfig",
    "Phi3ForCausalLM",
    "Phi3Config",
    "Qwen3ForCausalLM",
    "Qwen3Config",
    "Qwen3MoeForCausalLM",
    "Qwen3MoeConfig",
    "GraniteForCausalLM",
    "GraniteConfig",
    "SmolLM3ForCausalLM",
    "SmolLM3Config",
    "Olmo2ForCausalLM",
    "Olmo2Config",
    "Gemma3ForCausalLM",
    "Gemma3Config",
    "Gemma2ForCausalLM",
    "Gemma2Config",
    "PagedKVCache",
    "PagedStep",
    "KVCacheFull",
    "generate",
    "sample_next",
    "Sampler",
    "SamplingParams",
    "TokenSampler",
    "TokenLogprob",
    "apply_logit_bias",
    "apply_penalties",
    "filter_logits",
    "log_softmax",
    "prompt_logprobs",
    "top_logprobs",
    "read_config",
    "load_gpt2",
    "save_pretrained",
    "BatchDecoder",
]
