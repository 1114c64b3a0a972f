"""The IBM Granite 3.x family (``model_type`` ``"granite"``, GGUF architecture ``"granite"``), built on the Llama family.

Granite is Llama with four config scalars: the embeddings times ``embedding_multiplier``, each
attention and MLP output times ``residual_multiplier`` before its residual add, the attention's
softmax scale ``attention_multiplier`` and the logits divided by ``logits_scaling``:
``GraniteConfig`` is a ``LlamaConfig`` with them, ``GraniteForCausalLM`` a ``LlamaForCausalLM``
that applies them (its direct decode step ``GraniteDecodeStep`` too) and reads and writes granite
``config.json`` files. ``FAMILIES`` is what the family registry (``kael.models.families``) serves
for ``"granite"``.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._config import MODEL_TYPE, MULTIPLIERS, GraniteConfig, granite_hf_config, read_config
from ._model import GraniteForCausalLM
from ._step import GraniteDecodeStep

__all__ = [
    "GraniteForCausalLM",
    "GraniteConfig",
    "GraniteDecodeStep",
    "read_config",
    "granite_hf_config",
    "from_pretrained",
    "MULTIPLIERS",
    "FAMILIES",
]


from_pretrained = GraniteForCausalLM.from_pretrained
"""A GraniteForCausalLM from a Hugging Face granite checkpoint directory, in eval mode (the Llama loader's
arguments: ``kael.models.llama.from_pretrained``)."""


FAMILIES = (
    ModelFamily(
        MODEL_TYPE,
        from_pretrained,
        description=(
            "Granite 3.x (Hugging Face GraniteForCausalLM checkpoints: Llama with embedding, residual, "
            "attention and logits multipliers)"
        ),
        gguf_architectures=("granite",),
    ),
)
