"""What gemma2_checkpoints.py and gemma3_checkpoints.py share: the small shape both Gemma families start from
(``SMALL``: three layers, head_dim 16, a window of 5 positions, shorter than the test prompts) and ``build``:
family_checkpoints.build with the norm weights drawn around 0 (Gemma's norms scale by 1 + weight) so that every
norm matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SMALL", "build"]

SMALL: dict[str, Any] = {
    **family_checkpoints.SMALL,
    "num_hidden_layers": 3,
    "head_dim": 16,
    "sliding_window": 5,
    "query_pre_attn_scalar": 24,
    "rope_theta": 1000.0,
}


def build(
    transformers_class_name: str, config_class_name: str, small: dict[str, Any], directory: Path, **kw: Any
) -> Any:
    """family_checkpoints.build of ``transformers.<transformers_class_name>`` (``seed``, ``save_dtype`` and the
    config overrides in ``kw``) with the norm weights drawn N(0, 0.3); returned in eval mode, float32."""
    return family_checkpoints.build(transformers_class_name, config_class_name, small, directory, norm_mean=0.0, **kw)
