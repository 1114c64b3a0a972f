"""What the *_checkpoints.py of the families (qwen3, granite, smollm3, olmo2, phi3, qwen3_moe, gemma2,
gemma3) share: the small shape their families start from (``SMALL``) and ``build``, a random transformers model
of a named class saved as a Hugging Face checkpoint (built offline, nothing downloaded), with its norm weights
and biases drawn too so that they matter (Gemma's norms, which scale by 1 + weight, drawn around 0:
``norm_mean``; Qwen3-MoE's routers as well: ``other_draws``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SMALL", "build"]

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


def build(
    transformers_class_name: str,
    config_class_name: str,
    small: dict[str, Any],
    directory: Path,
    *,
    seed: int = 0,
    save_dtype: Any = None,
    norm_mean: float = 1.0,
    other_draws: dict[str, tuple[float, float]] | None = None,
    **overrides: Any,
) -> Any:
    """A random ``transformers.<transformers_class_name>`` of ``transformers.<config_class_name>(**small,
    **overrides)`` saved to ``directory`` (norm weights drawn N(norm_mean, 0.3), biases N(0, 0.2), seeded with
    ``torch.manual_seed(seed)``; a weight whose name ends with a key of ``other_draws`` drawn N(mean, std) of its
    value; stored in ``save_dtype`` when given); returned in eval mode, float32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, config_class_name)(**{**small, **overrides})
    model = getattr(transformers, transformers_class_name)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(norm_mean, 0.3)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.2)
            else:
                for suffix, (mean, std) in (other_draws or {}).items():
                    if name.endswith(suffix):
                        p.normal_(mean, std)
                        break
    (model.to(save_dtype) if save_dtype is not None else model).save_pretrained(directory)
    return model.float()
