"""Small random-weight Llama-family checkpoints for the tests, built offline with transformers.

``build(directory, family, **overrides)`` makes a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` /
``MistralForCausalLM`` from a small config (hidden 64, 2 layers, 4 heads, 2 key/value heads,
vocab 320, context 128) with ``initializer_range=0.2``, so that greedy choices are well
separated, seeded with ``torch.manual_seed``, saves it with ``save_pretrained`` and returns
the transformers model in eval mode. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SMALL", "build", "hf_config"]

SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 320,
    "max_position_embeddings": 128,
    "initializer_range": 0.2,
    "rms_norm_eps": 1e-6,
}


def hf_config(family: str, **overrides: Any) -> Any:
    """A transformers config of ``family`` ('llama', 'qwen2', 'mistral') with the small shape and overrides."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config, "mistral": transformers.MistralConfig}
    kw = {**SMALL, **overrides}
    if family == "mistral":
        kw.setdefault("sliding_window", None)
    return cls[family](**kw)


def build(directory: Path, family: str = "llama", *, seed: int = 0, save_dtype: Any = None, **overrides: Any) -> Any:
    """Save a random ``family`` model to ``directory`` (in ``save_dtype``, a torch dtype, if given); return it."""
    import torch
    import transformers

    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }
    torch.manual_seed(seed)
    model = cls[family](hf_config(family, **overrides)).eval()
    if family == "qwen2":  # its q/k/v biases start at zero: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.2)
    if save_dtype is not None:
        model = model.to(save_dtype)
    model.save_pretrained(directory)
    return model
