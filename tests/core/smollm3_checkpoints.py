"""What tests/core/test_smollm3.py and test_smollm3_gguf.py share: the small SmolLM3 shapes and ``build``, a
random transformers ``SmolLM3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing
downloaded), with its norm weights and biases drawn too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {
    **family_checkpoints.SMALL,
    "num_hidden_layers": 4,
    "rope_theta": 10000.0,  # SmolLM3's 2e6 barely turns these short prompts' positions
    "pad_token_id": None,  # transformers' defaults (128004, ...) are outside these small vocabularies
    "bos_token_id": None,
    "eos_token_id": None,
}
# tied with transformers' default pattern (no rope on layer 3: every fourth); untied with q/k/v/o and MLP biases,
# one key/value head (multi-query) and a pattern of its own (no rope on layers 1 and 2)
SHAPES: dict[str, dict[str, Any]] = {
    "tied-default": {"tie_word_embeddings": True},
    "untied-bias-mqa": {
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
        "num_key_value_heads": 1,
        "no_rope_layers": [1, 0, 0, 1],
    },
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers SmolLM3ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    and biases drawn too: family_checkpoints.build); returned in eval mode, float32."""
    return family_checkpoints.build(
        "SmolLM3ForCausalLM", "SmolLM3Config", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
