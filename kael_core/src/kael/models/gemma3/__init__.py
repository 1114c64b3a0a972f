"""The Gemma 3 text family (``model_type`` ``"gemma3_text"``, GGUF architecture ``"gemma3"``), built on the Llama family.

Gemma 3 is Llama with: the embeddings times sqrt(hidden_size), Gemma's ``(1 + weight)`` RMSNorms (four per
layer: before and after attention and MLP), a GeGLU MLP (GELU's tanh approximation), per-head q/k norms, the
softmax scale ``query_pre_attn_scalar ** -0.5``, sliding-window attention on the layers ``layer_types`` marks
``"sliding_attention"`` (every layer but each sixth by default) with their own rotary base, and optional final
logit soft-capping. ``Gemma3Config`` is a ``LlamaConfig`` with those fields, ``Gemma3ForCausalLM`` a
``LlamaForCausalLM`` with Gemma's layers (``GemmaForCausalLM``, which ``kael.models.gemma2`` shares).
``FAMILIES`` is what the family registry (``kael.models.families``) serves for ``"gemma3_text"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import (
    MODEL_TYPE,
    Gemma3Config,
    GemmaConfig,
    default_layer_types,
    gemma3_hf_config,
    read_config,
)
from ._model import Gemma3ForCausalLM, GemmaForCausalLM

__all__ = [
    "Gemma3ForCausalLM",
    "Gemma3Config",
    "GemmaForCausalLM",
    "GemmaConfig",
    "read_config",
    "gemma3_hf_config",
    "default_layer_types",
    "from_pretrained",
    "FAMILIES",
]


from_pretrained = Gemma3ForCausalLM.from_pretrained
"""A Gemma3ForCausalLM from a Hugging Face gemma3_text checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "Gemma 3 text (Hugging Face Gemma3ForCausalLM checkpoints: Llama with scaled embeddings, (1 + w) "
            "norms around attention and MLP, GeGLU, q/k norms and sliding-window layers)"
        ),
        gguf_architectures=("gemma3",),
    ),
)
