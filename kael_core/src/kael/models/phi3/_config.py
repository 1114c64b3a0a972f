"""``Phi3Config``: the shape of a Phi-3 model (Phi-3, Phi-3.5-mini, Phi-4-mini), and its ``config.json``.

Phi-3 is the Llama family's model with q/k/v in one projection and gate/up in one (``_model.py``), no biases,
and two rotary options transformers' ``Phi3Config`` reads:

* ``partial_rotary_factor`` (Phi-4-mini: 0.75): only the first ``rotary_dim = int(head_dim * factor)``
  dims of each q and k head rotate, the rest pass through;
* ``rope_type`` ``"longrope"`` (older configs: ``"su"`` or ``"yarn"``, which transformers renames to
  longrope; any other type but ``"default"`` is refused, as transformers refuses it): the inverse
  frequencies ``1 / (f[i] * base ** (2i / rotary_dim))`` with ``f`` the ``short_factor`` or the
  ``long_factor`` list (``rotary_dim / 2`` numbers each), and cos/sin times the attention factor
  (``attention_factor``, else ``sqrt(1 + ln(factor) / ln(original))`` when ``factor`` — given, else
  ``max_position_embeddings / original`` — is above 1, else 1). ``original`` is the top-level
  ``original_max_position_embeddings`` (default 4096), which transformers prefers over a value inside the
  rope dict. Which list a forward pass uses: NOTE [longrope factors] in ``_rope.py``.

``sliding_window``: transformers masks keys more than ``sliding_window - 1`` positions back whenever it is set,
on every layer: a window shorter than ``max_position_embeddings`` is every layer's ``layer_windows`` entry
(Phi-3-mini-4k's 2047; Phi-3.5-mini's and Phi-4-mini's windows cover their context: no window).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..._errors import ShapeError
from ..llama import LlamaConfig, config_from_dict, hf_config
from ..llama._config import read_family_config

__all__ = ["Phi3Config", "LongRope", "read_config", "phi3_hf_config", "MODEL_TYPE", "DEFAULT_ORIGINAL"]

MODEL_TYPE = "phi3"
DEFAULT_ORIGINAL = 4096  # transformers' Phi3Config.original_max_position_embeddings
_RENAMED = ("su", "yarn")  # transformers' older names of longrope in Phi-3 configs
# transformers' Phi3Config defaults where they differ from the Llama reader's
_DEFAULTS = {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "bos_token_id": 1, "eos_token_id": 32000}


@dataclass(frozen=True)
class LongRope:
    """A longrope scaling: the per-frequency divisors [rotary_dim / 2] for short and long sequences, the
    pretraining length that separates them, and ``factor`` / ``attention_factor`` as the config gave them."""

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float | None = None
    attention_factor: float | None = None


@dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    """A ``LlamaConfig`` of model type ``"phi3"`` with a partial rotary factor and an optional longrope scaling
    (``rope_scaling`` stays ``"default"``: the Phi-3 rope is ``longrope``'s, ``kael.models.phi3._rope``)."""

    model_types: ClassVar[tuple[str, ...]] = (MODEL_TYPE,)

    model_type: str = MODEL_TYPE
    rms_norm_eps: float = 1e-5
    partial_rotary_factor: float = 1.0
    longrope: LongRope | None = None
    sliding_window: int | None = None
    """Kept for ``config.json`` (None, or a window covering the context: kael attends to all of it)."""
    original_max_position_embeddings: int = DEFAULT_ORIGINAL
    """The top-level field transformers keeps (a longrope's own value is the one that counts)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        f = self.partial_rotary_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ShapeError(f"Phi3Config: partial_rotary_factor must be a number in (0, 1], got {f!r}")
        r = self.rotary_dim
        if r < 2 or r % 2:
            raise ShapeError(
                f"Phi3Config: the rotary dims int(head_dim * partial_rotary_factor) = {r} must be even >= 2"
            )
        if self.rope_scaling.rope_type != "default" or self.rope_freq_factors is not None:
            raise ShapeError("Phi3Config: the rope is default or longrope (rope_scaling must stay default)")
        lr = self.longrope
        if lr is not None:
            for name in ("short_factor", "long_factor"):
                v = getattr(lr, name)
                if len(v) != r // 2 or not all(_number(x) and x > 0 for x in v):
                    raise ShapeError(f"Phi3Config: longrope {name} must be {r // 2} finite positive numbers")
            o = lr.original_max_position_embeddings
            if isinstance(o, bool) or not isinstance(o, int) or o < 1:
                raise ShapeError(f"Phi3Config: original_max_position_embeddings must be a positive int, got {o!r}")
            for name in ("factor", "attention_factor"):
                v = getattr(lr, name)
                if v is not None and not (_number(v) and v > 0):
                    raise ShapeError(f"Phi3Config: longrope {name} must be a finite number > 0, got {v!r}")
        w = self.sliding_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise ShapeError(f"Phi3Config: sliding_window must be None or a positive int, got {w!r}")
        if w is not None and w < self.max_position_embeddings and not self.layer_windows:
            object.__setattr__(self, "layer_windows", (w,) * self.num_hidden_layers)  # every layer slides

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rotate: ``int(head_dim * partial_rotary_factor)`` (transformers' rule)."""
        return int(self.dim * self.partial_rotary_factor)

    @property
    def attention_scale(self) -> float:
        """The factor cos and sin are multiplied by (1 without longrope)."""
        lr = self.longrope
        if lr is None:
            return 1.0
        if lr.attention_factor is not None:
            return float(lr.attention_factor)
        orig = lr.original_max_position_embeddings
        factor = lr.factor if lr.factor is not None else self.max_position_embeddings / orig
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def read_config(path: Any) -> Phi3Config:
    """A Phi3Config from a Hugging Face phi3 ``config.json`` (a file or its directory)."""
    d, p, fail = read_family_config(path, "Phi3 config", MODEL_TYPE)
    d = {**_DEFAULTS, **d}
    # transformers: a truthy rope_scaling wins over rope_parameters (Phi3Config.convert_rope_params_to_dict)
    key = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    params = d.get(key) or {}
    if not isinstance(params, dict):
        fail(f"{key} must be an object or null, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    kind = "longrope" if kind in _RENAMED else kind
    if kind not in ("default", "longrope"):
        fail(f"{key}: rope type {kind!r} is not supported (expected 'default' or 'longrope', or 'su'/'yarn')")
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if not _number(partial) or not 0 < partial <= 1:
        fail(f"partial_rotary_factor must be a number in (0, 1], got {partial!r}")
    heads, hidden = d.get("num_attention_heads"), d.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0 and d.get("head_dim") is not None:
        if d["head_dim"] != hidden // heads:  # transformers sizes the rope factors by hidden_size // heads
            fail(f"head_dim {d['head_dim']!r} must be hidden_size // num_attention_heads ({hidden // heads})")
    orig = d.get("original_max_position_embeddings", DEFAULT_ORIGINAL)
    if isinstance(orig, bool) or not isinstance(orig, int) or orig < 1:
        fail(f"original_max_position_embeddings must be a positive integer, got {orig!r}")
    w = d.get("sliding_window")
    if w is not None:
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            fail(f"sliding_window must be a positive integer or null, got {w!r}")
    base = config_from_dict(
        {
            **d,
            "model_type": "llama",
            "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "rope_scaling": None,
            "partial_rotary_factor": None,
            "sliding_window": None,
            "attention_bias": False,
            "mlp_bias": False,
        },
        p,
        "Phi3 config",
    )
    longrope = _longrope(params, key, orig, fail) if kind == "longrope" else None
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(LlamaConfig)}
    rot = int(values["head_dim"] * partial)
    if rot < 2 or rot % 2:
        fail(
            f"partial_rotary_factor {partial!r} gives {rot} rotary dims of head_dim {values['head_dim']}: need even >= 2"
        )
    if longrope is not None:
        for name in ("short_factor", "long_factor"):
            if len(getattr(longrope, name)) != rot // 2:
                fail(
                    f"{key}: {name} must have {rot // 2} numbers (rotary dims / 2), got {len(getattr(longrope, name))}"
                )
    return Phi3Config(
        **{**values, "model_type": MODEL_TYPE},
        partial_rotary_factor=float(partial),
        longrope=longrope,
        sliding_window=w,
        original_max_position_embeddings=orig,
    )


def _longrope(params: dict[str, Any], key: str, orig: int, fail: Any) -> LongRope:
    lists: dict[str, tuple[float, ...]] = {}
    for name in ("short_factor", "long_factor"):
        v = params.get(name)
        if not isinstance(v, list) or not v or not all(_number(x) and x > 0 for x in v):
            fail(f"{key}: longrope needs {name}, a list of finite positive numbers, got {v!r}")
        assert isinstance(v, list)
        lists[name] = tuple(float(x) for x in v)
    opt: dict[str, float | None] = {}
    for name in ("factor", "attention_factor"):
        v = params.get(name)
        if v is not None and not (_number(v) and v > 0):
            fail(f"{key}: {name} must be a finite number > 0 or null, got {v!r}")
        opt[name] = None if v is None else float(v)
    return LongRope(lists["short_factor"], lists["long_factor"], orig, opt["factor"], opt["attention_factor"])


def phi3_hf_config(config: Phi3Config, dtype: str = "float32") -> dict[str, Any]:
    """A transformers 5 phi3 ``config.json`` dictionary for ``config``."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(LlamaConfig)}
    out = hf_config(LlamaConfig(**{**values, "model_type": "llama", "layer_windows": ()}), dtype)
    for k in ("attention_bias", "mlp_bias", "head_dim"):
        out.pop(k, None)
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": config.rope_theta,
        "partial_rotary_factor": config.partial_rotary_factor,
    }
    lr = config.longrope
    orig = config.original_max_position_embeddings
    if lr is not None:
        orig = lr.original_max_position_embeddings
        rope.update(rope_type="longrope", short_factor=list(lr.short_factor), long_factor=list(lr.long_factor))
        rope["original_max_position_embeddings"] = orig
        rope.update(
            {k: v for k, v in (("factor", lr.factor), ("attention_factor", lr.attention_factor)) if v is not None}
        )
    out.update(
        architectures=["Phi3ForCausalLM"],
        model_type=MODEL_TYPE,
        rope_parameters=rope,
        original_max_position_embeddings=orig,
        sliding_window=config.sliding_window,
        pad_token_id=None,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    return out
