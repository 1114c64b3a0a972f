"""Two tiny random causal LMs of the same vocabulary, one per family kael ships (for engine-level tests).

``tiny_causal_lm("gpt2" | "llama")``: a 2-layer GPT-2 (4 heads, 32 wide) or a 2-layer Llama (GQA: 4
heads over 2 K/V heads, 32 wide, init 0.1 so greedy picks are clear-cut), vocabulary ``V``, context
``CTX``, seeded.
"""

from __future__ import annotations

from typing import Any

import kael
from kael.models import GPT, LlamaConfig, LlamaForCausalLM

__all__ = ["CTX", "V", "tiny_causal_lm"]

V, CTX = 97, 96


def tiny_causal_lm(family: str) -> Any:
    """The tiny random model of ``family`` (``"gpt2"`` or ``"llama"``)."""
    if family == "gpt2":
        return GPT(V, CTX, 2, 4, 32, generator=kael.Generator().manual_seed(0))
    cfg = LlamaConfig(
        vocab_size=V,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CTX,
    )
    return LlamaForCausalLM(cfg, generator=kael.Generator().manual_seed(1), initializer_range=0.1)
