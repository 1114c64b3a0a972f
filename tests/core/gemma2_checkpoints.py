"""What tests/core/test_gemma2.py and test_gemma2_gguf.py share: the small Gemma 2 shapes and ``build``, a random
transformers ``Gemma2ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded), with its
norm weights drawn around 0 (Gemma's norms scale by 1 + weight) so that every norm matters.

Windows of 4 to 8 positions, shorter than the test prompts; soft-caps small enough to bend the random scores
and logits (transformers' defaults, 50 and 30, would leave them almost linear).
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
    drawn N(0, 0.3), biases N(0, 0.2), seeded); returned in eval mode, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Gemma2Config(**{**SMALL, **overrides})
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    (model.to(save_dtype) if save_dtype is not None else model).save_pretrained(directory)
    return model.float()
