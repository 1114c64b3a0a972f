"""``GraniteConfig``: the shape of an IBM Granite 3.x model, and its Hugging Face ``config.json``.

Granite is the Llama family's model with four scalars (transformers' ``GraniteConfig``):
``embedding_multiplier`` scales the token embeddings, ``residual_multiplier`` each attention and
MLP output before its residual add, ``attention_multiplier`` is the softmax scale (in place of
1/sqrt(head_dim)) and the logits are divided by ``logits_scaling``. ``attention_bias`` puts a
bias on q, k, v and o, ``mlp_bias`` on the MLP, as Llama's. ``read_config`` checks the four
scalars, then reads the rest with the Llama reader (``kael.models.llama.config_from_dict``), so
every value kael cannot run is a FormatError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from ..._errors import FormatError, ShapeError
from .._registry import read_config_json
from ..llama import LlamaConfig, config_from_dict, hf_config

__all__ = ["GraniteConfig", "read_config", "granite_hf_config", "MODEL_TYPE", "MULTIPLIERS"]

MODEL_TYPE = "granite"
#: The scalars of a Granite config (transformers' names), each a finite number, 1.0 when absent.
MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


@dataclass(frozen=True)
class GraniteConfig(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"granite"`` with its multipliers (transformers' field names)."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    logits_scaling: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in MULTIPLIERS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ShapeError(f"GraniteConfig: {name} must be a finite number, got {v!r}")
        if self.logits_scaling == 0:
            raise ShapeError("GraniteConfig: logits_scaling must not be 0 (the logits are divided by it)")


def read_config(path: Any) -> GraniteConfig:
    """A GraniteConfig from a Hugging Face granite ``config.json`` (a file or its directory)."""
    d, p = read_config_json(path, "Granite config")
    where = repr(os.fspath(p))

    def fail(msg: str) -> Any:
        raise FormatError(f"Granite config {where}: {msg}")

    if d.get("model_type") != MODEL_TYPE:
        fail(f"model_type is {d.get('model_type')!r}, expected {MODEL_TYPE!r}")
    scalars: dict[str, float] = {}
    for name in MULTIPLIERS:
        v = d.get(name, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            fail(f"{name} must be a finite number, got {v!r}")
        scalars[name] = float(v)
    if scalars["logits_scaling"] == 0:
        fail("logits_scaling must not be 0 (the logits are divided by it)")
    # The Llama reader, on the fields Granite shares with llama (attention_bias: q, k, v and o; mlp_bias).
    base = config_from_dict({**d, "model_type": "llama"}, p, "Granite config")
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    return GraniteConfig(**{**values, "model_type": MODEL_TYPE, **scalars})


def granite_hf_config(config: GraniteConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 granite ``config.json`` dictionary for ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama"}), dtype)
    out.update(architectures=["GraniteForCausalLM"], model_type=MODEL_TYPE)
    out.update({name: getattr(config, name) for name in MULTIPLIERS})
    return out
