"""The Gemma 3 text family (``model_type`` ``"gemma3_text"``, GGUF architecture ``"gemma3"``), built on the Llama family.

Gemma 3 is Llama with: the embeddings times sqrt(hidden_size), Gemma's ``(1 + weight)`` RMSNorms (four per
layer: before and after attention and MLP), a GeGLU MLP (GELU's tanh approximation), per-head q/k norms, the
softmax scale ``query_pre_attn_scalar ** -0.5``, sliding-window attention on the layers ``layer_types`` marks
``"sliding_attention"`` (every layer but each sixth by default) with their own rotary base, and optional final
logit soft-capping. ``Gemma3Config`` is a ``LlamaConfig`` with those fields, ``Gemma3ForCausalLM`` a
``LlamaForCausalLM`` with Gemma's layers (``GemmaForCausalLM``, which ``kael.models.gemma2`` shares).
``FAMILIES`` is what the family registry (``kael.models.families``) serves for ``"gemma3_text"`` and for
``"gemma3"``, the multimodal ``Gemma3ForConditionalGeneration`` checkpoints of Gemma 3 4B/12B/27B, whose text model
loads as a ``Gemma3ForCausalLM`` (the vision tower and projector are not loaded: NOTE [gemma3 multimodal
checkpoint] in ``_multimodal.py``). GGUF files of either are architecture ``gemma3`` (llama.cpp's converter writes a
multimodal checkpoint's text model as it writes a text-only one), which the ``gemma3_text`` family loads.
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
from ._multimodal import MULTIMODAL_MODEL_TYPE, TEXT_CONFIG_DEFAULTS, multimodal_layout, read_multimodal_config

__all__ = [
    "Gemma3ForCausalLM",
    "Gemma3Config",
    "GemmaForCausalLM",
    "GemmaConfig",
    "read_config",
    "read_multimodal_config",
    "multimodal_layout",
    "TEXT_CONFIG_DEFAULTS",
    "MULTIMODAL_MODEL_TYPE",
    "gemma3_hf_config",
    "default_layer_types",
    "from_pretrained",
    "FAMILIES",
]


from_pretrained = Gemma3ForCausalLM.from_pretrained
"""A Gemma3ForCausalLM from a Hugging Face gemma3_text checkpoint directory, or from a multimodal gemma3 one's text
model, in eval mode (the Llama loader's arguments: ``kael.models.llama.from_pretrained``)."""


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
    ModelFamily(
        MULTIMODAL_MODEL_TYPE,
        from_pretrained,
        description=(
            "Gemma 3 multimodal (Hugging Face Gemma3ForConditionalGeneration checkpoints): the text model, loaded "
            "as gemma3_text; the vision tower and projector are not loaded (text only)"
        ),
        # llama.cpp's converter writes the text model as "gemma3", which the gemma3_text family loads
        gguf_architectures=(),
    ),
)
