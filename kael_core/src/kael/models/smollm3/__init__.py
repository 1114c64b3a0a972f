"""The SmolLM3 family (``model_type`` ``"smollm3"``, GGUF architecture ``"smollm3"``), built on the Llama family.

SmolLM3 is Llama with rotary embeddings skipped on some layers (``no_rope_layers``: by default
every fourth): ``SmolLM3Config`` is a ``LlamaConfig`` with the per-layer flags,
``SmolLM3ForCausalLM`` a ``LlamaForCausalLM`` that turns rope off on those layers and reads and
writes smollm3 ``config.json`` files. ``FAMILIES`` is what the family registry
(``kael.models.families``) serves for ``"smollm3"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import DEFAULT_THETA, MODEL_TYPE, SmolLM3Config, no_rope_layers, read_config, smollm3_hf_config
from ._model import SmolLM3ForCausalLM

__all__ = [
    "SmolLM3ForCausalLM",
    "SmolLM3Config",
    "read_config",
    "smollm3_hf_config",
    "no_rope_layers",
    "from_pretrained",
    "DEFAULT_THETA",
    "FAMILIES",
]


from_pretrained = SmolLM3ForCausalLM.from_pretrained
"""A SmolLM3ForCausalLM from a Hugging Face smollm3 checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description="SmolLM3 (Hugging Face SmolLM3ForCausalLM checkpoints: Llama without rope on its no_rope_layers)",
        gguf_architectures=("smollm3",),
    ),
)
