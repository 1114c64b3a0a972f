"""``Olmo2Config``: the shape of an OLMo 2 model, and its Hugging Face ``config.json``.

OLMo 2 (transformers' ``Olmo2Config``) has Llama's fields and shapes; what differs is in the
layer (``_model.py``): no norm before attention or the MLP, one after each instead
(``post_attention_layernorm``, ``post_feedforward_layernorm``), and q and k RMS-normalised over
the whole projection (``q_norm`` [H*D], ``k_norm`` [Hkv*D]) before the head split and rope.
``attention_bias`` puts a bias on q, k, v and o; the MLP never has one. transformers' defaults
where ``config.json`` is silent: ``rms_norm_eps`` 1e-5 (Llama's reader would take 1e-6),
``eos_token_id`` 50279, untied embeddings. ``read_config`` checks the OLMo 2 fields, then reads
the rest with the Llama reader (``kael.models.llama.config_from_dict``: sizes, rope layouts and
scalings, token ids), so every value kael cannot run is a FormatError naming the file and the field.

``LlamaConfig.qk_norm`` (Qwen3's per-head norms) stays off: OLMo 2's norms are over the whole
projection, which ``Olmo2Attention`` builds itself. Transformers' ``Olmo2Config`` has no sliding
window (OLMo 3's has), so a ``sliding_window`` key is ignored, as transformers ignores it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..._errors import ShapeError
from ..llama import LlamaConfig, config_from_dict, hf_config
from ..llama._config import read_family_config

__all__ = ["Olmo2Config", "read_config", "olmo2_hf_config", "MODEL_TYPE", "DEFAULT_EPS", "DEFAULT_EOS"]

MODEL_TYPE = "olmo2"
#: transformers' Olmo2Config defaults for a config.json without the key.
DEFAULT_EPS = 1e-5
DEFAULT_EOS = 50279


@dataclass(frozen=True)
class Olmo2Config(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"olmo2"`` (post-norm layers, whole-projection q/k norms: ``_model.py``)."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    rms_norm_eps: float = DEFAULT_EPS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.qk_norm:
            raise ShapeError(
                "Olmo2Config: qk_norm (per-head q/k norms) must be off: OLMo 2 normalises whole projections"
            )
        if self.mlp_bias:
            raise ShapeError("Olmo2Config: mlp_bias must be off (the OLMo 2 MLP has no bias)")
        if self.qkv_bias != self.o_bias:
            raise ShapeError("Olmo2Config: attention_bias is on q, k, v and o together (qkv_bias == o_bias)")


def read_config(path: Any) -> Olmo2Config:
    """An Olmo2Config from a Hugging Face olmo2 ``config.json`` (a file or its directory)."""
    d, p, fail = read_family_config(path, "OLMo 2 config", MODEL_TYPE)
    bias = d.get("attention_bias", False)
    if not isinstance(bias, bool):
        fail(f"attention_bias must be true or false, got {bias!r}")
    # The Llama reader, on the fields OLMo 2 shares with llama (attention_bias: q, k, v and o; no MLP bias),
    # with transformers' OLMo 2 defaults where the file is silent.
    base_dict = {
        **d,
        "model_type": "llama",
        "sliding_window": None,
        "mlp_bias": False,
        "rms_norm_eps": d.get("rms_norm_eps", DEFAULT_EPS),
        "eos_token_id": d.get("eos_token_id", DEFAULT_EOS),
    }
    base = config_from_dict(base_dict, p, "OLMo 2 config")
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    return Olmo2Config(**{**values, "model_type": MODEL_TYPE})


def olmo2_hf_config(config: LlamaConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 olmo2 ``config.json`` dictionary for ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama"}), dtype)
    out.pop("mlp_bias", None)
    out.update(
        architectures=["Olmo2ForCausalLM"],
        model_type=MODEL_TYPE,
        attention_bias=config.qkv_bias,
        pad_token_id=None,  # kael keeps no pad id; transformers' default (1) would be a padding row of the table
    )
    return out
