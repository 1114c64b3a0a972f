"""What tests/core/test_qwen3.py and test_qwen3_gguf.py share: the small Qwen3 shapes and ``build``, a
random transformers ``Qwen3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing
downloaded), with its norm weights and biases drawn too so that q_norm / k_norm and the biases matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = dict(family_checkpoints.SMALL)
# tied with head_dim 24 != 64 / 4; untied with q/k/v/o biases and one key/value head (multi-query)
SHAPES: dict[str, dict[str, Any]] = {
    "tied-hd24": {"tie_word_embeddings": True, "head_dim": 24},
    "untied-bias-mqa": {"tie_word_embeddings": False, "head_dim": 16, "attention_bias": True, "num_key_value_heads": 1},
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Qwen3ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    and biases drawn too: family_checkpoints.build); returned in eval mode, float32."""
    return family_checkpoints.build(
        "Qwen3ForCausalLM", "Qwen3Config", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
