"""The pointwise CUDA kernels (``cupy.ElementwiseKernel``: any strides), their launchers and NumPy twins.

On a GPU each launcher runs its kernel, compiled once and cached; under emulation (NOTE
[host emulation] in ``_xp``) it runs the NumPy twin, the same arithmetic in the same dtype.
Elementwise catalogue ops with a source here (erf, silu) launch through ``pointwise(op,
*inputs, out)``; their NumPy twin is the op's own definition (``Pointwise.compute``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from kael.backends import catalogue

from ._xp import X, state

__all__ = [
    "ELEMENTWISE_SOURCES",
    "adamw",
    "erf",
    "gelu",
    "gelu_backward",
    "gelu_tanh_mul",
    "pointwise",
    "silu_mul",
    "softcap",
]

# --------------------------------------------------------------------------------------------------
# CUDA C: pointwise kernels (cupy.ElementwiseKernel: in_params, out_params, operation).
# --------------------------------------------------------------------------------------------------
# An entry named after an elementwise catalogue op (erf, silu) is that op's kernel (inputs T x..., output T y).
ELEMENTWISE_SOURCES: dict[str, tuple[str, str, str]] = {
    "erf": ("T x", "T y", "y = erf(x);"),
    "silu": ("T x", "T y", "y = x / ((T)1 + exp(-x));"),
    "silu_mul": ("T g, T u", "T y", "y = g / ((T)1 + exp(-g)) * u;"),
    # gelu_tanh(g) as g * sigmoid(2 k (g + c g^3)): no cancellation in 1 + tanh for g << 0
    "gelu_tanh_mul": (
        "T g, T u",
        "T y",
        "y = g / ((T)1 + exp((T)-1.5957691216057308 * (g + (T)0.044715 * g * g * g))) * u;",
    ),
    "softcap": ("T x, float64 cap", "T y", "y = (T)cap * tanh(x / (T)cap);"),
    "gelu": (
        "T x, int32 approx_tanh",
        "T y",
        """
        if (approx_tanh) {
            const T inner = (T)0.7978845608028654 * (x + (T)0.044715 * x * x * x);
            y = (T)0.5 * x * ((T)1 + tanh(inner));
        } else {
            y = (T)0.5 * x * ((T)1 + erf(x * (T)0.7071067811865476));
        }""",
    ),
    "gelu_backward": (
        "T g, T x, int32 approx_tanh",
        "T dx",
        """
        if (approx_tanh) {
            const T x2 = x * x;
            const T t = tanh((T)0.7978845608028654 * (x + (T)0.044715 * x * x2));
            const T d = (T)0.5 * ((T)1 + t)
                      + (T)0.5 * x * ((T)1 - t * t) * (T)0.7978845608028654 * ((T)1 + (T)(3 * 0.044715) * x2);
            dx = g * d;
        } else {
            const T cdf = (T)0.5 * ((T)1 + erf(x * (T)0.7071067811865476));
            const T pdf = exp((T)-0.5 * x * x) * (T)0.3989422804014327;
            dx = g * (cdf + x * pdf);
        }""",
    ),
    "adamw": (
        "T g, float64 lr, float64 beta1, float64 beta2, float64 eps, float64 decay, float64 bc1, float64 bc2",
        "T p, T m, T v",
        """
        const T mm = (T)beta1 * m + (T)(1 - beta1) * g;
        const T vv = (T)beta2 * v + (T)(1 - beta2) * g * g;
        m = mm;
        v = vv;
        const T pp = p * (T)(1 - lr * decay);
        p = pp - (T)lr * (mm / (T)bc1) / (sqrt(vv / (T)bc2) + (T)eps);""",
    ),
}

_elementwise: dict[str, Any] = {}


def _ew(name: str) -> Any:
    k = _elementwise.get(name)
    if k is None:
        ins, outs, body = ELEMENTWISE_SOURCES[name]
        k = state().cupy.ElementwiseKernel(ins, outs, body, f"kael_{name}")
        _elementwise[name] = k
    return k


def silu_mul(g: Any, u: Any, y: Any) -> None:
    """y = silu(g) * u = g / (1 + exp(-g)) * u, elementwise on any strides (same shape and dtype)."""
    if X.emulated:
        one = g.dtype.type
        with np.errstate(all="ignore"):
            y[...] = g / (one(1) + np.exp(-g)) * u
        return
    _ew("silu_mul")(g, u, y)


def gelu_tanh_mul(g: Any, u: Any, y: Any) -> None:
    """y = gelu_tanh(g) * u = g / (1 + exp(-2 k (g + 0.044715 g^3))) * u, k = sqrt(2/pi), on any strides."""
    if X.emulated:
        one = g.dtype.type
        with np.errstate(all="ignore"):
            y[...] = g / (one(1) + np.exp(one(-2 * _SQRT_2_OVER_PI) * (g + one(0.044715) * g * g * g))) * u
        return
    _ew("gelu_tanh_mul")(g, u, y)


def softcap(x: Any, cap: float, y: Any) -> None:
    """y = cap * tanh(x / cap) in x's dtype (cap rounded to it), elementwise on any strides."""
    if X.emulated:
        c = x.dtype.type(cap)
        y[...] = c * np.tanh(x / c)
        return
    _ew("softcap")(x, float(cap), y)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


_erf_np = np.vectorize(math.erf, otypes=[np.float64])


def pointwise(op: str, *arrays: Any) -> None:
    """arrays = (*inputs, out): out = op(*inputs) for an elementwise catalogue op with a source, on any strides."""
    *inputs, out = arrays
    if X.emulated:
        spec = catalogue.op(op).pointwise
        assert spec is not None, f"{op!r} is not an elementwise op"
        out[...] = spec.compute(np, *inputs)
        return
    _ew(op)(*inputs, out)


def erf(x: Any, y: Any) -> None:
    """y = erf(x), elementwise on any strides."""
    pointwise("erf", x, y)


def gelu(x: Any, y: Any, approx_tanh: bool) -> None:
    """y = gelu(x) (tanh form when approx_tanh), elementwise on any strides."""
    if X.emulated:
        one = x.dtype.type
        with np.errstate(all="ignore"):
            if approx_tanh:
                y[...] = one(0.5) * x * (one(1) + np.tanh(one(_SQRT_2_OVER_PI) * (x + one(0.044715) * x * x * x)))
            else:
                y[...] = one(0.5) * x * (one(1) + _erf_np(x * one(1 / math.sqrt(2.0))).astype(x.dtype))
        return
    _ew("gelu")(x, np.int32(approx_tanh), y)


def gelu_backward(g: Any, x: Any, dx: Any, approx_tanh: bool) -> None:
    """dx = g * gelu'(x), elementwise on any strides."""
    if X.emulated:
        one = x.dtype.type
        with np.errstate(all="ignore"):
            if approx_tanh:
                c = one(_SQRT_2_OVER_PI)
                t = np.tanh(c * (x + one(0.044715) * x * x * x))
                d = one(0.5) * (one(1) + t) + one(0.5) * x * (one(1) - t * t) * c * (one(1) + one(3 * 0.044715) * x * x)
            else:
                cdf = one(0.5) * (one(1) + _erf_np(x * one(1 / math.sqrt(2.0))).astype(x.dtype))
                d = cdf + x * np.exp(one(-0.5) * x * x) * one(1 / math.sqrt(2 * math.pi))
            dx[...] = g * d
        return
    _ew("gelu_backward")(g, x, np.int32(approx_tanh), dx)


def adamw(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    decay: float,
    bc1: float,
    bc2: float,
) -> None:
    """One AdamW step in place on p, m, v (same dtype and shape, any strides)."""
    if X.emulated:
        one = p.dtype.type
        with np.errstate(all="ignore"):
            mm = one(beta1) * m + one(1 - beta1) * g
            vv = one(beta2) * v + one(1 - beta2) * g * g
            m[...] = mm
            v[...] = vv
            p[...] = p * one(1 - lr * decay) - one(lr) * (mm / one(bc1)) / (np.sqrt(vv / one(bc2)) + one(eps))
        return
    _ew("adamw")(g, lr, beta1, beta2, eps, decay, bc1, bc2, p, m, v)
