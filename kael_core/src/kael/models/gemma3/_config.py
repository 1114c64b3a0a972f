"""``GemmaConfig`` and ``Gemma3Config``: the shape of a Gemma 2 / Gemma 3 (text) model, and their ``config.json``.

Gemma is the Llama family's shape with these fields (transformers' ``Gemma3TextConfig`` and
``Gemma2Config`` names):

* ``query_pre_attn_scalar``: the softmax scale is ``query_pre_attn_scalar ** -0.5`` (not 1/sqrt(head_dim));
* ``layer_types``: one of ``"sliding_attention"`` / ``"full_attention"`` per layer; a sliding layer's
  query at position p attends to the keys at p - sliding_window + 1 .. p (transformers' mask:
  ``kv_idx > q_idx - sliding_window``). When null: Gemma 3 slides on every layer but each
  ``sliding_window_pattern``-th (default 6: layer i is full when (i + 1) % 6 == 0), Gemma 2 on the even layers;
* ``attn_logit_softcapping`` (Gemma 2: scores = cap * tanh(scores / cap) before the mask and softmax) and
  ``final_logit_softcapping`` (the logits likewise);
* Gemma 3 only: q_norm / k_norm per head (``qk_norm``) and two rotary settings, ``full_attention``'s
  (``rope_theta``, default 1e6, with its scaling) and ``sliding_attention``'s (``sliding_rope_theta``,
  default 1e4: the legacy ``rope_local_base_freq``), read from transformers 5's per-layer-type
  ``rope_parameters`` dict or the legacy ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling`` keys.

The activation is GELU's tanh approximation (``hidden_activation`` "gelu_pytorch_tanh"), the norms are
Gemma's ``(1 + weight)`` RMSNorm (NOTE in ``_model.py``). ``read_gemma_config`` checks the Gemma fields and
reads the rest with the Llama reader (``kael.models.llama.config_from_dict``), so every value kael cannot
run is a FormatError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..._errors import FormatError, ShapeError
from .._registry import read_config_json
from ..llama import LlamaConfig, RopeScaling, config_from_dict, hf_config
from ..llama._config import _rope, read_family_config

__all__ = [
    "GemmaConfig",
    "Gemma3Config",
    "read_config",
    "read_gemma_config",
    "gemma_config_from_dict",
    "gemma_hf_config",
    "gemma3_hf_config",
    "default_layer_types",
    "MODEL_TYPE",
    "LAYER_TYPES",
    "ACTIVATIONS",
]

MODEL_TYPE = "gemma3_text"
LAYER_TYPES = ("sliding_attention", "full_attention")
#: The ``hidden_activation`` values kael runs: GELU with the tanh approximation.
ACTIVATIONS = ("gelu_pytorch_tanh",)


def default_layer_types(layers: int, pattern: int) -> tuple[str, ...]:
    """transformers' default: layer i is full when (i + 1) % pattern == 0, else sliding."""
    return tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers))


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


@dataclass(frozen=True)
class GemmaConfig(LlamaConfig):
    """The fields Gemma 2 and Gemma 3 share (an abstract base: its subclasses name the model types)."""

    model_types: ClassVar[tuple[str, ...]] = ()
    #: The period of the default ``layer_types`` (every ``pattern``-th layer full).
    default_pattern: ClassVar[int] = 6

    tie_word_embeddings: bool = True
    query_pre_attn_scalar: float = 256.0
    sliding_window: int = 4096
    layer_types: tuple[str, ...] | None = None
    sliding_rope_theta: float = 10000.0
    """The rotary base of the sliding layers (Gemma 3's ``rope_local_base_freq``; Gemma 2: ``rope_theta``)."""
    sliding_rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        name = type(self).__name__
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_hidden_layers, self.default_pattern))
        types = self.layer_types
        if types is None or len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            raise ShapeError(
                f"{name}: layer_types must be {self.num_hidden_layers} of {list(LAYER_TYPES)}, got {types!r}"
            )
        w = self.sliding_window
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ShapeError(f"{name}: sliding_window must be a positive int, got {w!r}")
        if not _finite(self.query_pre_attn_scalar) or self.query_pre_attn_scalar <= 0:
            raise ShapeError(
                f"{name}: query_pre_attn_scalar must be a finite number > 0, got {self.query_pre_attn_scalar!r}"
            )
        th = self.sliding_rope_theta
        if not _finite(th) or th <= 1:
            raise ShapeError(f"{name}: sliding_rope_theta must be a finite number > 1, got {th!r}")
        for cap_name in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = getattr(self, cap_name)
            if cap is not None and (not _finite(cap) or cap <= 0):
                raise ShapeError(f"{name}: {cap_name} must be null or a finite number > 0, got {cap!r}")

    @property
    def scale(self) -> float:
        """The softmax scale ``query_pre_attn_scalar ** -0.5``."""
        s: float = float(self.query_pre_attn_scalar) ** -0.5  # transformers' expression, to the last bit
        return s

    def sliding(self, layer: int) -> bool:
        """Whether ``layer`` attends within the sliding window."""
        types = self.layer_types
        assert types is not None
        return types[layer] == "sliding_attention"

    def rope_config(self, layer_type: str) -> LlamaConfig:
        """A LlamaConfig whose rotary fields are ``layer_type``'s (what ``kael.models.llama``'s tables read)."""
        if layer_type == "full_attention":
            return self
        return dataclasses.replace(self, rope_theta=self.sliding_rope_theta, rope_scaling=self.sliding_rope_scaling)


@dataclass(frozen=True)
class Gemma3Config(GemmaConfig):
    """A ``GemmaConfig`` of model type ``"gemma3_text"``: q/k norms, every sixth layer full by default."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)
    default_pattern: ClassVar[int] = 6

    model_type: str = MODEL_TYPE
    qk_norm: bool = True
    rope_theta: float = 1_000_000.0


def _cap(d: dict[str, Any], key: str, default: float | None, fail: Any) -> float | None:
    v = d.get(key, default)
    if v is not None and (not _finite(v) or v <= 0):
        fail(f"{key} must be null or a finite number > 0, got {v!r}")
    return None if v is None else float(v)


def read_gemma_config(path: Any, what: str, model_type: str, cls: type[GemmaConfig], *, gemma3: bool) -> GemmaConfig:
    """A ``cls`` from a Hugging Face ``model_type`` ``config.json`` (a file or its directory); errors are
    FormatErrors naming ``what`` ("Gemma3 config", ...), the file and the field."""
    d, p, _ = read_family_config(path, what, model_type)
    return gemma_config_from_dict(d, p, what, model_type, cls, gemma3=gemma3)


def gemma_config_from_dict(
    d: dict[str, Any], p: Path, what: str, model_type: str, cls: type[GemmaConfig], *, gemma3: bool
) -> GemmaConfig:
    """A ``cls`` from the ``model_type`` dictionary ``d`` read from the file ``p`` (a ``config.json``, or the
    ``text_config`` inside one); errors are FormatErrors naming ``what``, the file and the field."""
    where = repr(os.fspath(p))

    def fail(msg: str) -> Any:
        raise FormatError(f"{what} {where}: {msg}")

    act = d.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        fail(f"hidden_activation {act!r} is not supported (expected one of {list(ACTIVATIONS)})")
    if d.get("use_bidirectional_attention") not in (None, False):
        fail(f"use_bidirectional_attention {d['use_bidirectional_attention']!r} is not supported (kael is causal)")
    for key in ("attention_bias", "tie_word_embeddings"):
        if not isinstance(d.get(key, key == "tie_word_embeddings"), bool):
            fail(f"{key} must be true or false, got {d[key]!r}")
    layers = d.get("num_hidden_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        fail(f"num_hidden_layers must be a positive integer, got {layers!r}")
    assert isinstance(layers, int)
    w = d.get("sliding_window", 4096)
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        fail(f"sliding_window must be a positive integer, got {w!r}")
    scalar = d.get("query_pre_attn_scalar", 256)
    if not _finite(scalar) or scalar <= 0:
        fail(f"query_pre_attn_scalar must be a finite number > 0, got {scalar!r}")
    types = d.get("layer_types")
    if types is None:
        pattern = cls.default_pattern  # transformers' Gemma 2: alternating; Gemma 3: the config's period
        if gemma3:
            pattern = d.get("sliding_window_pattern", d.get("_sliding_window_pattern", pattern))
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            fail(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        types = list(default_layer_types(layers, pattern))
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        fail(f"layer_types must be a list of {layers} values of {list(LAYER_TYPES)}, got {types!r}")
    attn_cap = _cap(d, "attn_logit_softcapping", None if gemma3 else 50.0, fail)
    if gemma3 and attn_cap is not None:
        # transformers' Gemma3Attention never applies it, llama.cpp's converter refuses it: so does kael
        fail(f"attn_logit_softcapping {attn_cap!r} is not supported for gemma3_text (it must be null)")
    base = dict(d, model_type="llama", hidden_act="silu", sliding_window=None, mlp_bias=False)
    base["tie_word_embeddings"] = d.get("tie_word_embeddings", True)
    sliding_theta, sliding_scaling = 10000.0, RopeScaling()
    if gemma3:
        full, sliding = _gemma3_rope(d, fail)
        base.pop("rope_scaling", None)
        base["rope_parameters"] = full
        sliding_theta, sliding_scaling = _rope({"rope_parameters": sliding}, _prefixed(fail, "sliding_attention"))
    base_cfg = config_from_dict(base, p, what)
    values = {f.name: getattr(base_cfg, f.name) for f in dataclasses.fields(LlamaConfig)}
    if not gemma3:
        sliding_theta, sliding_scaling = base_cfg.rope_theta, base_cfg.rope_scaling
    bias = bool(d.get("attention_bias", False))
    return cls(
        **{**values, "model_type": model_type, "qkv_bias": bias, "o_bias": bias, "qk_norm": gemma3},
        query_pre_attn_scalar=float(scalar),
        sliding_window=w,
        layer_types=tuple(types),
        sliding_rope_theta=sliding_theta,
        sliding_rope_scaling=sliding_scaling,
        attn_logit_softcapping=attn_cap,
        final_logit_softcapping=_cap(d, "final_logit_softcapping", None if gemma3 else 30.0, fail),
    )


def _prefixed(fail: Any, key: str) -> Any:
    def inner(msg: str) -> Any:
        return fail(f"rope_parameters[{key!r}]: {msg}")

    return inner


def _gemma3_rope(d: dict[str, Any], fail: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The full and sliding layers' rope dicts: transformers 5's ``rope_parameters`` keyed by layer type, or the
    legacy ``rope_theta`` (+ ``rope_scaling``, full layers only) and ``rope_local_base_freq``."""
    params = d.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict) or not set(params) <= set(LAYER_TYPES):
            fail(f"rope_parameters must be an object keyed by {list(LAYER_TYPES)}, got {params!r}")
        full, sliding = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(sliding, dict):
            fail(f"rope_parameters must hold an object (or null) per layer type, got {params!r}")
    else:
        scaling = d.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            fail(f"rope_scaling must be an object or null, got {scaling!r}")
        full, sliding = dict(scaling), {}
        if "rope_theta" in d:
            full["rope_theta"] = d["rope_theta"]
        if "rope_local_base_freq" in d:
            sliding["rope_theta"] = d["rope_local_base_freq"]
    return {"rope_theta": 1_000_000.0, **full}, {"rope_theta": 10000.0, **sliding}


def read_config(path: Any) -> Gemma3Config:
    """A Gemma3Config from a Hugging Face gemma3_text ``config.json`` (a file or its directory), or from a
    multimodal gemma3 one's ``text_config`` (``kael.models.gemma3.read_multimodal_config``)."""
    from ._multimodal import MULTIMODAL_MODEL_TYPE, read_multimodal_config

    d, p = read_config_json(path, "Gemma3 config")
    if d.get("model_type") == MULTIMODAL_MODEL_TYPE:
        return read_multimodal_config(p)
    cfg = read_gemma_config(p, "Gemma3 config", MODEL_TYPE, Gemma3Config, gemma3=True)
    assert isinstance(cfg, Gemma3Config)
    return cfg


def _int_if_whole(v: float) -> float | int:
    """transformers' config field is an int: a whole number is written as one."""
    return int(v) if float(v).is_integer() else v


def _rope_dict(theta: float, scaling: RopeScaling) -> dict[str, Any]:
    return {"rope_type": scaling.rope_type, "rope_theta": theta, **scaling.params}


def gemma_hf_config(config: GemmaConfig, dtype: str, architecture: str) -> dict[str, Any]:
    """The fields a transformers 5 gemma2 / gemma3_text ``config.json`` shares (``architecture``'s)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama", "qk_norm": False}), dtype)
    for key in ("hidden_act", "mlp_bias"):
        out.pop(key, None)
    out.update(
        architectures=[architecture],
        model_type=config.model_type,
        hidden_activation=ACTIVATIONS[0],
        attention_bias=config.qkv_bias,
        query_pre_attn_scalar=_int_if_whole(config.query_pre_attn_scalar),
        sliding_window=config.sliding_window,
        layer_types=list(config.layer_types or ()),
        attn_logit_softcapping=config.attn_logit_softcapping,
        final_logit_softcapping=config.final_logit_softcapping,
        pad_token_id=None,
    )
    return out


def gemma3_hf_config(config: GemmaConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 gemma3_text ``config.json`` dictionary for ``config`` (per-layer-type rope_parameters)."""
    out = gemma_hf_config(config, dtype, "Gemma3ForCausalLM")
    out["rope_parameters"] = {
        "full_attention": _rope_dict(config.rope_theta, config.rope_scaling),
        "sliding_attention": _rope_dict(config.sliding_rope_theta, config.sliding_rope_scaling),
    }
    out["use_bidirectional_attention"] = False
    return out
