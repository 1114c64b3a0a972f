"""``Qwen3Config``: the shape of a Qwen3 (dense) model, and its Hugging Face ``config.json``.

Qwen3 is the Llama family's model with three differences: each query and key head is
RMS-normalised over ``head_dim`` before rope (``qk_norm``: ``self_attn.q_norm`` and
``k_norm``), ``head_dim`` is an explicit field (it may differ from hidden / heads), and
``attention_bias`` puts a bias on q, k, v and o (false in the released models); the MLP has
no bias. ``read_config`` checks the Qwen3-only fields, then reads the rest with the Llama
reader (``kael.models.llama.config_from_dict``: rope layouts, sizes, token ids), so every
value kael cannot run is a FormatError naming the file and the field.

Sliding windows: transformers applies ``sliding_window`` only with ``use_sliding_window``
true, and then to the layers ``layer_types`` marks ``"sliding_attention"`` (by default those
from ``max_window_layers`` on): the config's ``layer_windows`` (``llama/_windows.py``), each such layer
attending to its window only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..llama import LlamaConfig, config_from_dict, hf_config
from ..llama._config import read_family_config
from ..llama._windows import family_layer_windows, window_fields

__all__ = ["Qwen3Config", "read_config", "qwen3_hf_config", "MODEL_TYPE"]

MODEL_TYPE = "qwen3"


@dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"qwen3"``, with the per-head q/k norms on."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    qk_norm: bool = True


def read_config(path: Any) -> Qwen3Config:
    """A Qwen3Config from a Hugging Face qwen3 ``config.json`` (a file or its directory)."""
    d, p, fail = read_family_config(path, "Qwen3 config", MODEL_TYPE)
    bias = d.get("attention_bias", False)
    if not isinstance(bias, bool):
        fail(f"attention_bias must be true or false, got {bias!r}")
    # The Llama reader, on the fields Qwen3 shares with llama (attention_bias: q, k, v and o; no MLP bias).
    base = config_from_dict({**d, "model_type": "llama", "sliding_window": None, "mlp_bias": False}, p, "Qwen3 config")
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    windows = family_layer_windows(
        d, lambda: _window_layer_types(d), base.num_hidden_layers, base.max_position_embeddings, fail
    )
    return Qwen3Config(**{**values, "model_type": MODEL_TYPE, "qk_norm": True, "layer_windows": windows})


def _window_layer_types(d: dict[str, Any]) -> list[str] | None:
    """transformers' Qwen3 default ``layer_types``: sliding from ``max_window_layers`` on."""
    layers = d.get("num_hidden_layers")
    if not isinstance(layers, int):
        return None
    start = d.get("max_window_layers", layers)
    return ["sliding_attention" if isinstance(start, int) and i >= start else "full_attention" for i in range(layers)]


def qwen3_hf_config(config: LlamaConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 qwen3 ``config.json`` dictionary for ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama", "qk_norm": False, "layer_windows": ()}), dtype)
    out.pop("mlp_bias", None)
    out.update(
        architectures=["Qwen3ForCausalLM"],
        model_type=MODEL_TYPE,
        attention_bias=config.qkv_bias,
        **window_fields(config),
    )
    return out
