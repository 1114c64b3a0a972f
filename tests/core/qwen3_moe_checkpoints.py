"""What tests/core/test_qwen3_moe.py shares: the small Qwen3-MoE shapes and ``build``, a random transformers
``Qwen3MoeForCausalLM`` saved as a Hugging Face checkpoint (built offline, nothing downloaded; transformers 5
saves its fused expert tensors as one ``mlp.experts.J.{gate,up,down}_proj.weight`` per expert), with its norm
weights, biases and routers drawn so that q_norm / k_norm, the biases and the routing all matter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_checkpoints

__all__ = ["SHAPES", "SMALL", "build"]

SMALL: dict[str, Any] = {**family_checkpoints.SMALL, "head_dim": 16, "moe_intermediate_size": 32}
# untied GQA with every layer sparse and renormalised weights; tied multi-query with q/k/v/o biases and
# every second layer sparse (decoder_sparse_step 2); dense layers listed in mlp_only_layers, one expert a token
SHAPES: dict[str, dict[str, Any]] = {
    "untied-gqa-norm": {"tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
                        "norm_topk_prob": True},
    "tied-mqa-step2": {"tie_word_embeddings": True, "num_hidden_layers": 3, "num_key_value_heads": 1,
                       "attention_bias": True, "num_experts": 4, "num_experts_per_tok": 3, "decoder_sparse_step": 2},
    "mlp-only-top1": {"tie_word_embeddings": False, "num_hidden_layers": 3, "num_experts": 6,
                      "num_experts_per_tok": 1, "mlp_only_layers": [0, 2]},
}  # fmt: skip


def build(directory: Path, *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """A random transformers Qwen3MoeForCausalLM of ``SMALL`` and ``overrides`` saved to ``directory`` (norm
    weights around 1, biases around 0, routers N(0, 1): decisive routing; family_checkpoints.build); returned in
    eval mode, float32."""
    return family_checkpoints.build(
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        SMALL,
        directory,
        seed=seed,
        save_dtype=save_dtype,
        other_draws={"mlp.gate.weight": (0.0, 1.0)},
        **overrides,
    )
