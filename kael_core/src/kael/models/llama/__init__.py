"""The Llama family (``model_type`` ``"llama"``, ``"qwen2"``, ``"mistral"``): model, config, checkpoints, step.

RMSNorm, rotary embeddings, SwiGLU and grouped-query attention over kael's fused ops
(``rms_norm``, ``rope``, ``silu_mul``, ``attention`` with fewer key/value heads).
``FAMILIES`` are what the family registry (``kael.models.families``) serves for the three
model types; they share one loader, which reads each type's ``config.json`` differences.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._checkpoint import from_pretrained, save_pretrained
from ._config import MODEL_TYPES, ROPE_TYPES, LlamaConfig, RopeScaling, config_from_dict, hf_config, read_config
from ._layout import CheckpointLayout
from ._model import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    Projection,
    Table,
)
from ._rope import attention_scaling, inverse_frequencies, rope_tables
from ._step import LlamaDecodeStep, Multipliers

__all__ = [
    "LlamaForCausalLM",
    "LlamaConfig",
    "RopeScaling",
    "LlamaModel",
    "LlamaDecoderLayer",
    "LlamaAttention",
    "LlamaMLP",
    "LlamaDecodeStep",
    "Multipliers",
    "CheckpointLayout",
    "Projection",
    "Table",
    "from_pretrained",
    "save_pretrained",
    "read_config",
    "config_from_dict",
    "hf_config",
    "inverse_frequencies",
    "attention_scaling",
    "rope_tables",
    "MODEL_TYPES",
    "ROPE_TYPES",
    "FAMILIES",
]

_DESCRIPTIONS = {
    "llama": "Llama (Hugging Face LlamaForCausalLM checkpoints: RMSNorm, rotary, SwiGLU, grouped-query attention)",
    "qwen2": "Qwen2 (Hugging Face Qwen2ForCausalLM checkpoints: Llama with q/k/v biases)",
    "mistral": "Mistral (Hugging Face MistralForCausalLM checkpoints without a sliding window shorter than the context)",
}

# llama.cpp's converter writes Mistral checkpoints as GGUF architecture "llama" (they load as the llama family).
_GGUF = {"llama": ("llama",), "qwen2": ("qwen2",), "mistral": ()}

FAMILIES = tuple(
    ModelFamily(mt, from_pretrained, description=_DESCRIPTIONS[mt], gguf_architectures=_GGUF[mt]) for mt in MODEL_TYPES
)
