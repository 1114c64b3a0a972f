"""``LlamaConfig``: the shape of a Llama-family model (llama, qwen2, mistral) and its ``config.json``.

``read_config`` reads a Hugging Face ``config.json`` of any of the three families, in
either rotary layout transformers writes: 4.x's top-level ``rope_theta`` plus an optional
``rope_scaling`` dict, or 5.x's ``rope_parameters`` dict (``rope_type``, ``rope_theta`` and
the scaling fields together). Every value kael cannot run is a FormatError naming the file
and the field, never silently ignored: a llama sliding window shorter than the context, an
activation other than SiLU, a partial rotary factor, an unknown rope type. Mistral's and qwen2's
sliding windows are ``layer_windows`` (``_windows.py``).

The three families differ only in biases and defaults: llama's ``attention_bias`` puts a
bias on q, k, v and o, qwen2 always has one on q, k, v (never o), mistral has none;
``mlp_bias`` (llama) on gate, up and down.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..._errors import FormatError, KaelError, ShapeError
from .._registry import read_config_json
from ._windows import layer_windows, window_fields

__all__ = [
    "LlamaConfig",
    "RopeScaling",
    "read_config",
    "config_from_dict",
    "hf_config",
    "read_family_config",
    "MODEL_TYPES",
    "ROPE_TYPES",
]

MODEL_TYPES = ("llama", "qwen2", "mistral")
#: The rotary scalings kael computes (transformers' ``ROPE_INIT_FUNCTIONS`` names), with their required fields.
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("original_max_position_embeddings",),  # factor: max_position_embeddings / original when absent
}
# Fields a rope dict may carry besides rope_type/type and rope_theta (checked for type, else kept as read).
_ROPE_NUMBERS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
)
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


@dataclass(frozen=True)
class RopeScaling:
    """A rotary scaling: ``rope_type`` (a ``ROPE_TYPES`` key) and its numeric parameters."""

    rope_type: str = "default"
    params: dict[str, float | int | bool] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.params.get(name, default)


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-family model; field names are those of transformers' ``LlamaConfig``.

    A family built on this one (``kael.models.qwen3``) subclasses it with its own ``model_types``.
    """

    model_types: ClassVar[tuple[str, ...]] = MODEL_TYPES
    """The ``model_type`` values this class describes."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    dtype: str | None = None
    rope_freq_factors: tuple[float, ...] | None = None
    """Per-dimension divisors of the rotary inverse frequencies [head_dim / 2] (a GGUF file's ``rope_freqs``
    tensor, llama.cpp's ``freq_factors``, as its converter writes Llama 3.1's scaling); no Hugging Face field."""
    qk_norm: bool = False
    """Each query and key head is RMS-normalised over head_dim before rope (``self_attn.q_norm`` and
    ``k_norm``, weights [head_dim]): Qwen3's attention; no Hugging Face field (the model type implies it)."""
    layer_windows: tuple[int, ...] = ()
    """Each layer's sliding window (0: the whole context), or () when no layer has one (``_windows.py``): the query
    at position p of a layer with window W sees keys p-W+1..p (Mistral's ``sliding_window``, qwen2's and qwen3's
    ``use_sliding_window`` layers)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            _positive(name, getattr(self, name))
        _positive("max_position_embeddings", self.max_position_embeddings)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _positive("num_key_value_heads", self.num_key_value_heads)
        if self.num_attention_heads % self.kv_heads:
            raise ShapeError(
                f"LlamaConfig: num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.kv_heads}"
            )
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ShapeError(
                    f"LlamaConfig: hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                    f"{self.num_attention_heads} (give head_dim)"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        _positive("head_dim", self.head_dim)
        if self.dim % 2:
            raise ShapeError(f"LlamaConfig: head_dim must be even for rotary embeddings, got {self.dim}")
        eps = self.rms_norm_eps
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ShapeError(f"LlamaConfig: rms_norm_eps must be a number in (0, 1), got {eps!r}")
        th = self.rope_theta
        if isinstance(th, bool) or not isinstance(th, (int, float)) or not math.isfinite(th) or th <= 1:
            raise ShapeError(f"LlamaConfig: rope_theta must be a finite number > 1, got {th!r}")
        ws = self.layer_windows
        if ws and (
            len(ws) != self.num_hidden_layers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in ws)
        ):
            raise ShapeError(
                f"LlamaConfig: layer_windows must be () or {self.num_hidden_layers} integers >= 0 (0: no window), "
                f"got {ws!r}"
            )
        if self.model_type not in self.model_types:
            raise ShapeError(
                f"{type(self).__name__}: model_type must be one of {list(self.model_types)}, got {self.model_type!r}"
            )
        if self.rope_scaling.rope_type not in ROPE_TYPES:
            raise ShapeError(f"LlamaConfig: rope type {self.rope_scaling.rope_type!r} is not supported")
        ff = self.rope_freq_factors
        if ff is not None and (
            len(ff) != self.dim // 2
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0 for x in ff)
        ):
            raise ShapeError(
                f"LlamaConfig: rope_freq_factors must be {self.dim // 2} finite positive numbers (head_dim / 2), "
                f"got {len(ff)} values"
            )

    @property
    def kv_heads(self) -> int:
        """``num_key_value_heads`` (set from the heads when absent)."""
        n = self.num_key_value_heads
        assert n is not None
        return n

    @property
    def dim(self) -> int:
        """``head_dim`` (set from hidden_size / heads when absent)."""
        d = self.head_dim
        assert d is not None
        return d

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """The end-of-sequence ids as a tuple (empty when none)."""
        e = self.eos_token_id
        return () if e is None else (e,) if isinstance(e, int) else tuple(e)


def _positive(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ShapeError(f"LlamaConfig: {name} must be a positive int, got {v!r}")


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _rope(d: dict[str, Any], fail: Any) -> tuple[float, RopeScaling]:
    """rope_theta and the scaling, from 5.x's ``rope_parameters`` or 4.x's ``rope_theta``/``rope_scaling``."""
    params = d.get("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params, key = d.get("rope_scaling"), "rope_scaling"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        fail(f"{key} must be an object or null, got {params!r}")
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    if not _number(theta) or theta <= 1:
        fail(f"rope_theta must be a finite number > 1, got {theta!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        fail(f"{key}: rope type {kind!r} is not supported (expected one of {list(ROPE_TYPES)})")
    out: dict[str, float | int | bool] = {}
    if kind in ("llama3", "yarn") and params.get("original_max_position_embeddings") is None:
        # transformers' standardize_rope_params: the top-level value, else the context
        orig = d.get("original_max_position_embeddings", d.get("max_position_embeddings", 2048))
        params = {**params, "original_max_position_embeddings": orig}
    for name, v in params.items():
        if name in ("rope_type", "type", "rope_theta"):
            continue
        if name == "partial_rotary_factor":
            if v != 1 and v != 1.0:
                fail(f"{key}: partial_rotary_factor {v!r} is not supported (only 1.0)")
            continue
        if name == "original_max_position_embeddings":
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(f"{key}: original_max_position_embeddings must be a positive integer, got {v!r}")
            out[name] = v
        elif name == "truncate":
            if not isinstance(v, bool):
                fail(f"{key}: truncate must be true or false, got {v!r}")
            out[name] = v
        elif name in _ROPE_NUMBERS:
            if v is None:
                continue
            if not _number(v) or (name == "factor" and v <= 0):
                fail(f"{key}: {name} must be a finite number{' > 0' if name == 'factor' else ''}, got {v!r}")
            out[name] = v
    for name in ROPE_TYPES[kind]:
        if name not in out:
            fail(f"{key}: rope type {kind!r} needs {name!r}, got {params.get(name)!r}")
    if kind == "llama3" and out["high_freq_factor"] == out["low_freq_factor"]:
        fail(f"{key}: llama3 needs high_freq_factor != low_freq_factor, both are {out['low_freq_factor']!r}")
    return float(theta), RopeScaling(kind, out)


def read_config(path: Any) -> LlamaConfig:
    """A LlamaConfig from a Hugging Face llama/qwen2/mistral ``config.json`` (a file or its directory)."""
    d, p = read_config_json(path, "Llama config")
    return config_from_dict(d, p)


def config_from_dict(d: dict[str, Any], p: Path, what: str = "Llama config") -> LlamaConfig:
    """A LlamaConfig from the dictionary of the ``config.json`` at ``p`` (errors: FormatError naming
    ``what``, the file and the field); the reader a family built on this one calls on its own dict."""
    where = repr(os.fspath(p))

    def fail(msg: str) -> Any:
        raise FormatError(f"{what} {where}: {msg}")

    mt = d.get("model_type")
    if not isinstance(mt, str) or mt not in MODEL_TYPES:
        fail(f"model_type is {mt!r}, expected one of {list(MODEL_TYPES)}")
    assert isinstance(mt, str)
    sizes: dict[str, int] = {}
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in d:
            fail(f"missing key {key!r}")
        sizes[key] = _int_field(d, key, fail)
    kv = _int_field(d, "num_key_value_heads", fail, sizes["num_attention_heads"])
    if sizes["num_attention_heads"] % kv:
        fail(f"num_attention_heads {sizes['num_attention_heads']} is not a multiple of num_key_value_heads {kv}")
    hd = d.get("head_dim")
    if hd is None:
        if sizes["hidden_size"] % sizes["num_attention_heads"]:
            fail(
                f"hidden_size {sizes['hidden_size']} is not divisible by num_attention_heads "
                f"{sizes['num_attention_heads']} and there is no head_dim"
            )
        hd = sizes["hidden_size"] // sizes["num_attention_heads"]
    else:
        hd = _int_field(d, "head_dim", fail)
    if hd % 2:
        fail(f"head_dim must be even for rotary embeddings, got {hd!r}")
    ctx = _int_field(d, "max_position_embeddings", fail, 2048)
    eps = d.get("rms_norm_eps", 1e-6)
    if not _number(eps) or not 0 < eps < 1:
        fail(f"rms_norm_eps must be a number in (0, 1), got {eps!r}")
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        fail(f"hidden_act {act!r} is not supported (expected 'silu')")
    theta, scaling = _rope(d, fail)
    if "partial_rotary_factor" in d and d["partial_rotary_factor"] not in (None, 1, 1.0):
        fail(f"partial_rotary_factor {d['partial_rotary_factor']!r} is not supported (only 1.0)")
    windows = layer_windows(d, mt, sizes["num_hidden_layers"], ctx, fail)
    flags = {}
    for key in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
        v = d.get(key, False)
        if not isinstance(v, bool):
            fail(f"{key} must be true or false, got {v!r}")
        flags[key] = v
    # What transformers' modules build, whatever the config says: qwen2 has q/k/v biases and mistral
    # none; only llama reads attention_bias and mlp_bias.
    if mt == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = flags["attention_bias"] and mt == "llama"
    mlp_bias = flags["mlp_bias"] and mt == "llama"
    bos = d.get("bos_token_id")
    if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int) or bos < 0):
        fail(f"bos_token_id must be a non-negative integer or null, got {bos!r}")
    eos = d.get("eos_token_id")
    if isinstance(eos, list):
        if not eos or any(isinstance(e, bool) or not isinstance(e, int) or e < 0 for e in eos):
            fail(f"eos_token_id must be a non-negative integer, a non-empty list of them, or null, got {eos!r}")
        eos = tuple(eos)
    elif eos is not None and (isinstance(eos, bool) or not isinstance(eos, int) or eos < 0):
        fail(f"eos_token_id must be a non-negative integer, a list of them, or null, got {eos!r}")
    dtype = d.get("dtype", d.get("torch_dtype"))
    if dtype is not None and not isinstance(dtype, str):
        fail(f"dtype must be a string or null, got {dtype!r}")
    return LlamaConfig(
        vocab_size=sizes["vocab_size"],
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_hidden_layers"],
        num_attention_heads=sizes["num_attention_heads"],
        num_key_value_heads=kv,
        head_dim=hd,
        max_position_embeddings=ctx,
        rms_norm_eps=float(eps),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=flags["tie_word_embeddings"],
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        model_type=mt,
        bos_token_id=bos,
        eos_token_id=eos,
        dtype=dtype,
        layer_windows=windows,
    )


def _int_field(d: dict[str, Any], key: str, fail: Any, default: int | None = None) -> int:
    v = d.get(key, default)
    if v is None and default is not None:
        v = default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        fail(f"{key} must be a positive integer, got {v!r}")
    assert isinstance(v, int)
    return v


def read_family_config(path: Any, what: str, model_type: str) -> tuple[dict[str, Any], Path, Callable[[str], Any]]:
    """The dictionary and path of a ``model_type`` ``config.json`` (a file or its directory) of a family built on
    this one, and its ``fail(message)``: a FormatError naming ``what`` ("Qwen3 config", ...) and the file."""
    d, p = read_config_json(path, what)
    where = repr(os.fspath(p))

    def fail(msg: str) -> Any:
        raise FormatError(f"{what} {where}: {msg}")

    if d.get("model_type") != model_type:
        fail(f"model_type is {d.get('model_type')!r}, expected {model_type!r}")
    return d, p, fail


def hf_config(config: LlamaConfig, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 ``config.json`` dictionary for ``config`` (its ``rope_parameters`` layout); a KaelError
    for a config with ``rope_freq_factors`` (a GGUF file's, which no Hugging Face rope type expresses)."""
    if config.rope_freq_factors is not None:
        raise KaelError(
            "hf_config: this model's rotary frequencies come from a GGUF file's rope_freqs tensor, which no "
            "Hugging Face rope type expresses; save it with save_gguf instead"
        )
    rope: dict[str, Any] = {"rope_type": config.rope_scaling.rope_type, "rope_theta": config.rope_theta}
    rope.update(config.rope_scaling.params)
    eos = config.eos_token_id
    out: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[config.model_type]],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
        "use_cache": True,
        "dtype": dtype,
        "attention_dropout": 0.0,
    }
    if config.model_type == "llama":
        out.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
        if config.layer_windows:
            raise KaelError(
                "hf_config: a llama config.json cannot hold sliding windows (transformers' Llama has none); "
                "give the config model_type 'mistral' or 'qwen2'"
            )
    else:
        out.update(window_fields(config))
    return out
