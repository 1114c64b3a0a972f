"""What tests/core/test_qwen3.py and test_qwen3_gguf.py share: the small Qwen3 shapes and ``build``, a
random transformers ``Qwen3ForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing
downloaded), with its norm weights and biases drawn too so that q_norm / k_norm and the biases matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 200,
    "max_position_embeddings": 96,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-6,
}
# tied with head_dim 24 != 64 / 4; untied with q/k/v/o biases and one key/value head (multi-query)
SHAPES: dict[str, dict[str, Any]] = {
    "tied-hd24": {"tie_word_embeddings": True, "head_dim": 24},
    "untied-bias-mqa": {"tie_word_embeddings": False, "head_dim": 16, "attention_bias": True, "num_key_value_heads": 1},
}


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Qwen3ForCausalLM saved to ``directory`` (norm weights and biases drawn too, so
    that q_norm / k_norm matter); returned in eval mode, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**SMALL, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
    (model.to(save_dtype) if save_dtype is not None else model).save_pretrained(directory)
    return model.float()
