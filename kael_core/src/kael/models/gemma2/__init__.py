"""The Gemma 2 family (``model_type`` ``"gemma2"``, GGUF architecture ``"gemma2"``), built on Gemma 3's model.

Gemma 2 is Gemma 3's layer (scaled embeddings, (1 + w) norms before and after attention and MLP, GeGLU, the
softmax scale ``query_pre_attn_scalar ** -0.5``, sliding-window layers) without q/k norms, with attention and
final logit soft-capping and alternating sliding / full layers: ``Gemma2Config`` is a
``kael.models.gemma3.GemmaConfig``, ``Gemma2ForCausalLM`` a ``kael.models.gemma3.GemmaForCausalLM``.
``FAMILIES`` is what the family registry (``kael.models.families``) serves for ``"gemma2"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, Gemma2Config, gemma2_hf_config, read_config
from ._model import Gemma2ForCausalLM

__all__ = ["Gemma2ForCausalLM", "Gemma2Config", "read_config", "gemma2_hf_config", "from_pretrained", "FAMILIES"]


from_pretrained = Gemma2ForCausalLM.from_pretrained
"""A Gemma2ForCausalLM from a Hugging Face gemma2 checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "Gemma 2 (Hugging Face Gemma2ForCausalLM checkpoints: Gemma 3's layers without q/k norms, with "
            "attention and final logit soft-capping and alternating sliding-window layers)"
        ),
        gguf_architectures=("gemma2",),
    ),
)
