"""What tests/core/test_granite.py and test_granite_gguf.py share: the small Granite shapes and ``build``, a
random transformers ``GraniteForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing
downloaded), with its norm weights and biases drawn too and every multiplier away from 1 so that each matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["MULTIPLIERS", "SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = dict(family_checkpoints.SMALL)
#: Granite 3.x's kind of values (embedding 12, residual 0.22, attention 1/64 in the released 2B), scaled to these
#: small random models so that the logits stay of order 1.
MULTIPLIERS: dict[str, float] = {
    "embedding_multiplier": 3.0,
    "residual_multiplier": 0.3,
    "attention_multiplier": 0.05,
    "logits_scaling": 2.5,
}
# tied, grouped-query; untied with q/k/v/o and MLP biases and one key/value head (multi-query)
SHAPES: dict[str, dict[str, Any]] = {
    "tied-gqa": {"tie_word_embeddings": True, **MULTIPLIERS},
    "untied-bias-mqa": {
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
        "num_key_value_heads": 1,
        **MULTIPLIERS,
        "attention_multiplier": 0.3,
        "logits_scaling": 0.5,
    },
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers GraniteForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    and biases drawn too: family_checkpoints.build); returned in eval mode, float32."""
    return family_checkpoints.build(
        "GraniteForCausalLM", "GraniteConfig", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
