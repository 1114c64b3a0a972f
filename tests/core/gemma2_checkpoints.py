"""What tests/core/test_gemma2.py and test_gemma2_gguf.py share: the small Gemma 2 shapes and ``build``, a random
transformers ``Gemma2ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), with its
norm weights drawn around 0 (Gemma's norms scale by 1 + weight) so that every norm matters.

Windows of 4 to 8 positions, shorter than the test prompts; soft-caps small enough to bend the random scores
and logits (transformers' defaults, 50 and 30, would leave them almost linear).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gemma_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {
    **gemma_checkpoints.SMALL,
    "attn_logit_softcapping": 2.0,
    "final_logit_softcapping": 4.0,
}
# GQA, alternating layers (sliding, full, sliding); multi-query, window 8, full layers first and last, linear
# rope scaling, q/k/v/o biases, transformers' default caps; multi-head, head_dim 24, every layer sliding (window 4)
SHAPES: dict[str, dict[str, Any]] = {
    "gqa": {},
    "mqa-bias": {
        "num_key_value_heads": 1,
        "sliding_window": 8,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "attention_bias": True,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "mha-all-sliding": {
        "num_key_value_heads": 4,
        "head_dim": 24,
        "sliding_window": 4,
        "layer_types": ["sliding_attention"] * 3,
    },
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Gemma2ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    drawn N(0, 0.3), biases N(0, 0.2), seeded: gemma_checkpoints.build); returned in eval mode, float32."""
    return gemma_checkpoints.build(
        "Gemma2ForCausalLM", "Gemma2Config", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
