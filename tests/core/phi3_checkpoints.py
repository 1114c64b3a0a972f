"""What tests/core/test_phi3.py and test_phi3_gguf.py share: the small Phi-3 shapes and ``build``, a random
transformers ``Phi3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), norm
weights drawn too.

Shapes: GQA untied with the default rope; tied multi-query with longrope whose ``original_max_position_embeddings``
(16) is shorter than the longer prompts, so both factor lists run; Phi-4-mini's partial rotary (0.75) with
longrope, untied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SHAPES", "SMALL", "ORIGINAL", "longrope", "build"]

SMALL: dict[str, Any] = {**family_checkpoints.SMALL, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
ORIGINAL = 16  # the longrope shapes' original_max_position_embeddings


def longrope(rotary_dim: int, seed: int = 3) -> dict[str, Any]:
    """A longrope ``rope_parameters`` dict: factors [rotary_dim / 2] spread over (1, 4) (long) and (1, 1.5) (short),
    multiples of 1/1024 (exact in a GGUF file's F32 factor tensors)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [round(float(x) * 1024) / 1024 for x in rng.uniform(1.0, 1.5, n)],
        "long_factor": [round(float(x) * 1024) / 1024 for x in rng.uniform(1.0, 4.0, n)],
    }


SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied-default": {"tie_word_embeddings": False},
    "mqa-tied-longrope": {
        "tie_word_embeddings": True,
        "num_key_value_heads": 1,
        "original_max_position_embeddings": ORIGINAL,
        "rope_parameters": longrope(16),
    },
    "partial-longrope": {
        "tie_word_embeddings": False,
        "original_max_position_embeddings": ORIGINAL,
        "rope_parameters": {**longrope(12, seed=4), "partial_rotary_factor": 0.75},
    },
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Phi3ForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm weights
    drawn too: family_checkpoints.build); returned in eval mode, float32."""
    return family_checkpoints.build(
        "Phi3ForCausalLM", "Phi3Config", SMALL, directory, seed=seed, save_dtype=save_dtype, **overrides
    )
