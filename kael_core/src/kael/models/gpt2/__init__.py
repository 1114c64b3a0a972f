"""GPT-2, kael's first model family (``model_type`` ``"gpt2"``): the model, its config, its checkpoints.

``FAMILY`` is what the family registry (``kael.models.register_family``) holds for it; a
third-party family package is laid out the same way and registered through the
``kael.models`` entry-point group.
"""

from __future__ import annotations

from .._registry import ModelFamily
from ._checkpoint import from_pretrained, hf_config, load_gpt2, read_config, save_pretrained
from ._config import GPTConfig
from ._model import GPT, MLP, Block, Conv1D, EmbeddingTable, SelfAttention
from ._step import GPT2DecodeStep

__all__ = [
    "GPT",
    "GPTConfig",
    "GPT2DecodeStep",
    "Block",
    "SelfAttention",
    "MLP",
    "Conv1D",
    "EmbeddingTable",
    "from_pretrained",
    "load_gpt2",
    "read_config",
    "save_pretrained",
    "hf_config",
    "FAMILY",
]

FAMILY = ModelFamily(
    "gpt2",
    from_pretrained,
    description="GPT-2 (Hugging Face GPT2LMHeadModel checkpoints, either key layout)",
    gguf_architectures=("gpt2",),
)
