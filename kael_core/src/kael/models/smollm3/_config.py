"""``SmolLM3Config``: the shape of a SmolLM3 model, and its Hugging Face ``config.json``.

SmolLM3 is the Llama family's model with rotary embeddings skipped on some layers:
``no_rope_layers`` lists one flag per layer (1: the layer rotates q and k, 0: it does not). As
transformers' ``SmolLM3Config`` does, an absent (null) list is derived from
``no_rope_layer_interval`` (default 4): layer i uses rope unless ``(i + 1) % interval == 0``, so
every fourth layer has none. The rest is Llama's (``attention_bias`` on q, k, v and o,
``mlp_bias``), with transformers' SmolLM3 defaults: tied embeddings and ``rope_theta`` 2,000,000.
``read_config`` checks the SmolLM3-only fields, then reads the rest with the Llama reader
(``kael.models.llama.config_from_dict``), so every value kael cannot run is a FormatError naming
the file and the field.

Sliding windows: transformers applies ``sliding_window`` only with ``use_sliding_window`` true,
to the layers ``layer_types`` marks ``"sliding_attention"`` (by default the no-rope layers): the
config's ``layer_windows`` (``llama/_windows.py``), each such layer attending to its window only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..._errors import ShapeError
from ..llama import LlamaConfig, config_from_dict, hf_config
from ..llama._config import read_family_config
from ..llama._windows import family_layer_windows, window_fields

__all__ = ["SmolLM3Config", "read_config", "smollm3_hf_config", "no_rope_layers", "MODEL_TYPE", "DEFAULT_THETA"]

MODEL_TYPE = "smollm3"
#: transformers' SmolLM3Config.default_theta: the rope_theta of a config.json that gives none.
DEFAULT_THETA = 2000000.0


def no_rope_layers(layers: int, interval: int = 4) -> tuple[int, ...]:
    """transformers' default flags: 1 (rope) on every layer but each ``interval``-th (layer i with (i + 1) % interval == 0)."""
    return tuple(int((i + 1) % interval != 0) for i in range(layers))


@dataclass(frozen=True)
class SmolLM3Config(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"smollm3"`` with ``no_rope_layers`` (None: every fourth layer has no rope)."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    rope_theta: float = DEFAULT_THETA
    tie_word_embeddings: bool = True
    no_rope_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        flags = self.no_rope_layers
        if flags is None:
            object.__setattr__(self, "no_rope_layers", no_rope_layers(self.num_hidden_layers))
        elif len(flags) != self.num_hidden_layers or any(type(f) is not int or f not in (0, 1) for f in flags):
            raise ShapeError(
                f"SmolLM3Config: no_rope_layers must be {self.num_hidden_layers} flags 0 or 1 (one per layer), "
                f"got {flags!r}"
            )

    @property
    def rope_layers(self) -> tuple[bool, ...]:
        """Whether each layer rotates q and k (``no_rope_layers`` as booleans)."""
        flags = self.no_rope_layers
        assert flags is not None
        return tuple(bool(f) for f in flags)


def read_config(path: Any) -> SmolLM3Config:
    """A SmolLM3Config from a Hugging Face smollm3 ``config.json`` (a file or its directory)."""
    d, p, fail = read_family_config(path, "SmolLM3 config", MODEL_TYPE)
    layers = d.get("num_hidden_layers", 36)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        fail(f"num_hidden_layers must be a positive integer, got {layers!r}")
    flags = d.get("no_rope_layers")
    if flags is None:
        interval = d.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            fail(f"no_rope_layer_interval must be a positive integer, got {interval!r}")
        flags = list(no_rope_layers(layers, interval))
    elif (
        not isinstance(flags, list) or len(flags) != layers or any(type(f) is not int or f not in (0, 1) for f in flags)
    ):
        fail(f"no_rope_layers must be a list of {layers} flags 0 or 1 (one per layer), got {flags!r}")
    # transformers' SmolLM3 defaults where config.json is silent: tied embeddings, rope_theta 2e6.
    params = d.get("rope_parameters") or d.get("rope_scaling")
    theta = d.get("rope_theta", params.get("rope_theta") if isinstance(params, dict) else None)
    base_dict = {
        **d,
        "model_type": "llama",
        "sliding_window": None,
        "rope_theta": DEFAULT_THETA if theta is None else theta,
        "tie_word_embeddings": d.get("tie_word_embeddings", True),
    }
    base = config_from_dict(base_dict, p, "SmolLM3 config")
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    # transformers: with layer_types null, the no-rope layers slide
    windows = family_layer_windows(
        d,
        lambda: ["full_attention" if f else "sliding_attention" for f in flags],
        layers,
        base.max_position_embeddings,
        fail,
    )
    return SmolLM3Config(
        **{**values, "model_type": MODEL_TYPE, "no_rope_layers": tuple(flags), "layer_windows": windows}
    )


def smollm3_hf_config(config: SmolLM3Config, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 smollm3 ``config.json`` dictionary for ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama", "layer_windows": ()}), dtype)
    out.update(
        architectures=["SmolLM3ForCausalLM"],
        model_type=MODEL_TYPE,
        no_rope_layers=list(config.no_rope_layers or ()),
        **window_fields(config),
        pad_token_id=None,  # kael keeps no pad id; transformers' default (128004) is outside a small vocabulary
    )
    return out
