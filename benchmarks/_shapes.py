"""The model shapes the benchmarks build with random weights (transformers' config keyword arguments)."""

from __future__ import annotations

from typing import Any

__all__ = ["GPT2_SMALL", "SMOLLM2_135M"]

GPT2_SMALL: dict[str, Any] = {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
"""GPT-2 small (124M parameters), a ``transformers.GPT2Config``."""

SMOLLM2_135M: dict[str, Any] = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 2048,
}
"""SmolLM2-135M's shape, a ``transformers.LlamaConfig``."""
