"""What tests/core/test_olmo2.py and test_olmo2_gguf.py share: the small OLMo 2 shapes and ``build``, a random
transformers ``Olmo2ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), with
its norm weights and biases drawn too so that the post-norms, the whole-projection q/k norms and the biases
matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

# eos_token_id: transformers' default 50279 is outside a small vocabulary
SMALL: dict[str, Any] = {**family_checkpoints.SMALL, "eos_token_id": None}
# untied with GQA (4 heads over 2 kv heads); tied with head_dim 24 != 64 / 4 and q/k/v/o biases; tied
# multi-query (one kv head) with a linear rope scaling
SHAPES: dict[str, dict[str, Any]] = {
    "untied-gqa": {"tie_word_embeddings": False},
    "tied-hd24-bias": {"tie_word_embeddings": True, "head_dim": 24, "attention_bias": True},
    "tied-mqa-linear": {
        "tie_word_embeddings": True,
        "num_key_value_heads": 1,
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
    },
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Olmo2ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    and biases drawn too: family_checkpoints.build); returned in eval mode, float32."""
    return family_checkpoints.build(
        "Olmo2ForCausalLM", "Olmo2Config", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
