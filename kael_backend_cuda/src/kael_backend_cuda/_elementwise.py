"""Elementwise kernels: copy, fill, arange, where, unary, binary and comparison ops.

Each op is an xp ufunc (a CuPy elementwise CUDA kernel on the GPU). When the output
shares no storage with an input and needs no cast, the ufunc writes straight into the
output's strided view (``out=``); otherwise the result goes through a temporary, which
keeps in-place ops on overlapping views correct (CuPy does not check for overlap).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael import _dtype as dt
from kael._errors import DTypeError, KaelError

from . import _raw_kernels as raw
from ._io import distinct, raw_copy, rd, view, wr
from ._xp import X, errstate

__all__ = ["KERNELS", "ZeroDivisionError_"]


class ZeroDivisionError_(KaelError, ZeroDivisionError):
    """Integer division (remainder, floor_divide) by zero, as the reference backend raises it."""


# Ops whose xp ufunc returns the input dtype for integer inputs too (safe to write with out=).
_INT_SAFE = {"neg", "abs", "sign", "add", "sub", "mul", "maximum", "minimum"}
_BOOL_OUT = {"logical_not", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"}

_UFUNC_NAMES = {
    "neg": "negative",
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "tanh": "tanh",
    "abs": "absolute",
    "sin": "sin",
    "cos": "cos",
    "log1p": "log1p",
    "expm1": "expm1",
    "floor": "floor",
    "ceil": "ceil",
    "round": "rint",
    "sign": "sign",
    "logical_not": "logical_not",
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "div": "true_divide",
    "pow": "power",
    "maximum": "maximum",
    "minimum": "minimum",
    "remainder": "remainder",
    "floor_divide": "floor_divide",
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "logical_and": "logical_and",
    "logical_or": "logical_or",
}


def _is_int(a: Any) -> bool:
    return bool(np.issubdtype(a.dtype, np.integer))


def _fast(op: str, out: Any, *inputs: Any) -> bool:
    """May the ufunc write into out's view directly?"""
    if out.dtype is dt.bfloat16 or any(t.dtype is dt.bfloat16 for t in inputs) or not distinct(out, *inputs):
        return False
    if op in _BOOL_OUT:
        return True
    return out.dtype.is_floating_point or (op in _INT_SAFE and out.dtype is not dt.bool_)


def _unary(op: str) -> Callable[[Any, Any], None]:
    name = _UFUNC_NAMES[op]

    def kernel(out: Any, a: Any) -> None:
        f = getattr(X.xp, name)
        with errstate():
            if _fast(op, out, a):
                f(view(a), out=view(out))
            else:
                wr(out, f(rd(a)))

    kernel.__name__ = op
    return kernel


def _rsqrt(out: Any, a: Any) -> None:
    xp = X.xp
    with errstate():
        wr(out, 1 / xp.sqrt(rd(a)))


def _sigmoid(out: Any, a: Any) -> None:
    xp = X.xp
    with errstate():
        wr(out, 1 / (1 + xp.exp(-rd(a))))


def _erf(out: Any, a: Any) -> None:
    x = rd(a)
    x = x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    y = X.xp.empty(x.shape, x.dtype)
    if y.size:
        raw.erf(x, y)
    wr(out, y)


def _check_binary(op: str, a: Any, b: Any) -> None:
    """The reference backend's integer errors (these checks synchronise; integer-only, so rare)."""
    if op == "pow" and _is_int(a) and bool((b < 0).any()):
        raise DTypeError("pow: integers to negative integer powers are not allowed")
    if op in ("remainder", "floor_divide") and _is_int(a) and bool((b == 0).any()):
        raise ZeroDivisionError_(f"{op}: integer division by zero")


def _binary(op: str) -> Callable[[Any, Any, Any], None]:
    name = _UFUNC_NAMES[op]
    checked = op in ("pow", "remainder", "floor_divide")

    def kernel(out: Any, a: Any, b: Any) -> None:
        f = getattr(X.xp, name)
        av, bv = rd(a), rd(b)
        if checked and av.size:
            _check_binary(op, av, bv)
        with errstate():
            if _fast(op, out, a, b):
                f(av, bv, out=view(out))
            else:
                wr(out, f(av, bv))

    kernel.__name__ = op
    return kernel


def copy(out: Any, a: Any) -> None:
    if out.dtype is a.dtype:
        raw_copy(out, a)
    else:
        wr(out, rd(a))


def fill(out: Any, value: Any) -> None:
    wr(out, value)


def arange(out: Any, start: Any, step: Any) -> None:
    xp = X.xp
    n = out.shape[0]
    wr(out, start + xp.arange(n, dtype=np.float64 if out.dtype.is_floating_point else np.int64) * step)


def where(out: Any, cond: Any, a: Any, b: Any) -> None:
    xp = X.xp
    if out.dtype is a.dtype is b.dtype:  # select raw elements (bfloat16 bits included)
        wr_raw = xp.where(view(cond), view(a), view(b))
        xp.copyto(view(out), wr_raw)
    else:
        wr(out, xp.where(rd(cond), rd(a), rd(b)))


KERNELS: dict[str, Callable[..., None]] = {"copy": copy, "fill": fill, "arange": arange, "where": where}
KERNELS.update(
    {
        op: _unary(op)
        for op in (
            "neg",
            "exp",
            "log",
            "sqrt",
            "tanh",
            "abs",
            "sin",
            "cos",
            "log1p",
            "expm1",
            "floor",
            "ceil",
            "round",
            "sign",
            "logical_not",
        )
    }
)
KERNELS.update({"rsqrt": _rsqrt, "sigmoid": _sigmoid, "erf": _erf})
KERNELS.update(
    {
        op: _binary(op)
        for op in (
            "add",
            "sub",
            "mul",
            "div",
            "pow",
            "maximum",
            "minimum",
            "remainder",
            "floor_divide",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "logical_and",
            "logical_or",
        )
    }
)
