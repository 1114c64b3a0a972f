"""Models: GPT-2 (``GPT``), its KV cache, generation, and checkpoint loading and export."""

from __future__ import annotations

from ._batched import BatchDecoder
from ._generate import generate, sample_next
from ._gpt2 import GPT, GPTConfig
from ._kv_cache import KVCache
from ._loading import from_pretrained, load_gpt2, read_config, save_pretrained

__all__ = [
    "GPT",
    "GPTConfig",
    "KVCache",
    "generate",
    "sample_next",
    "from_pretrained",
    "load_gpt2",
    "read_config",
    "save_pretrained",
    "BatchDecoder",
]
