"""What tests/core/test_gemma3.py and test_gemma3_gguf.py share: the small Gemma 3 shapes and ``build``, a random
transformers ``Gemma3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), with
its norm weights drawn around 0 (Gemma's norms scale by 1 + weight) so that every norm matters.

Windows of 4 to 8 positions, shorter than the test prompts, so the sliding layers' masks matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gemma_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {
    **gemma_checkpoints.SMALL,
    "rope_local_base_freq": 50.0,
}
# GQA, every third layer full (sliding, sliding, full); multi-query with a full layer first and a window of 8,
# linear rope scaling on the full layers, final soft-capping and q/k/v/o biases; multi-head, head_dim 24 != 64/4,
# every layer sliding (window 4) through sliding_window_pattern
SHAPES: dict[str, dict[str, Any]] = {
    "gqa": {"sliding_window_pattern": 3},
    "mqa-full-first": {
        "num_key_value_heads": 1,
        "sliding_window": 8,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "final_logit_softcapping": 3.0,
        "attention_bias": True,
    },
    "mha-all-sliding": {"num_key_value_heads": 4, "head_dim": 24, "sliding_window": 4, "sliding_window_pattern": 7},
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Gemma3ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    drawn N(0, 0.3), biases N(0, 0.2), seeded: gemma_checkpoints.build); returned in eval mode, float32."""
    return gemma_checkpoints.build(
        "Gemma3ForCausalLM", "Gemma3TextConfig", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
