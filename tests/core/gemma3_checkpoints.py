"""What tests/core/test_gemma3.py and test_gemma3_gguf.py share: the small Gemma 3 shapes and ``build``, a random
transformers ``Gemma3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), with
its norm weights drawn around 0 (Gemma's norms scale by 1 + weight) so that every norm matters.

Windows of 4 to 8 positions, shorter than the test prompts, so the sliding layers' masks matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 200,
    "max_position_embeddings": 96,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-6,
    "sliding_window": 5,
    "query_pre_attn_scalar": 24,
    "rope_theta": 1000.0,
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
    drawn N(0, 0.3), biases N(0, 0.2), seeded); returned in eval mode, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Gemma3TextConfig(**{**SMALL, **overrides})
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    (model.to(save_dtype) if save_dtype is not None else model).save_pretrained(directory)
    return model.float()
