"""Elementwise kernels: copy, fill, arange, where, and every elementwise op of the catalogue.

The op lists come from ``kael.backends.catalogue``: each ``Pointwise`` entry runs as

* a CUDA source of ``_pointwise_kernels.ELEMENTWISE_SOURCES`` when there is one (a
  ``cupy.ElementwiseKernel`` computing in float32/float64; under emulation the op's
  NumPy definition, ``Pointwise.compute``): erf, and the elementwise fused ops such as silu;
* else its ufunc (an xp ufunc: a CuPy elementwise CUDA kernel on the GPU). When the
  output shares no storage with an input and needs no cast, the ufunc writes straight
  into the output's strided view (``out=``); otherwise the result goes through a
  temporary, which keeps in-place ops on overlapping views correct (CuPy does not check
  for overlap);
* else its NumPy expression evaluated with ``xp`` (rsqrt, sigmoid).

A fused elementwise op without a CUDA source is left to the frontend's decomposition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael import DTypeError, KaelError
from kael.backends import catalogue
from kael.backends import dtypes as dt

from . import _raw_kernels as raw
from ._io import compute_dtype, distinct, raw_copy, rd, view, wr
from ._xp import X, errstate

__all__ = ["KERNELS", "ZeroDivisionError_"]


class ZeroDivisionError_(KaelError, ZeroDivisionError):
    """Integer division (remainder, floor_divide) by zero, as the reference backend raises it."""


def _spec(op: str) -> catalogue.Pointwise:
    p = catalogue.CATALOGUE[op].pointwise
    assert p is not None
    return p


# Ops whose xp ufunc returns the input dtype for integer inputs too (safe to write with out=).
_INT_SAFE = {"neg", "abs", "sign", "add", "sub", "mul", "maximum", "minimum"}
_BOOL_OUT = {op for op in catalogue.POINTWISE_OPS if _spec(op).bool_out}


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
    name = _spec(op).ufunc

    def kernel(out: Any, a: Any) -> None:
        f = getattr(X.xp, name)
        with errstate():
            if _fast(op, out, a):
                f(view(a), out=view(out))
            else:
                wr(out, f(rd(a)))

    kernel.__name__ = op
    return kernel


def _expression(op: str) -> Callable[..., None]:
    """The op's NumPy definition evaluated with xp (it uses only functions NumPy and CuPy share)."""
    spec = _spec(op)

    def kernel(out: Any, *inputs: Any) -> None:
        with errstate():
            wr(out, spec.compute(X.xp, *(rd(t) for t in inputs)))

    kernel.__name__ = op
    return kernel


def _source(op: str) -> Callable[..., None]:
    """The op's CUDA source (ELEMENTWISE_SOURCES), computing in float32 (16-bit floats) or float64."""

    def kernel(out: Any, *inputs: Any) -> None:
        cd = compute_dtype(out, *inputs)
        xs = [rd(t).astype(cd, copy=False) for t in inputs]
        y = X.xp.empty(out.shape, cd)
        if y.size:
            with errstate():
                raw.pointwise(op, *xs, y)
        wr(out, y)

    kernel.__name__ = op
    return kernel


def _check_binary(op: str, a: Any, b: Any) -> None:
    """The reference backend's integer errors (these checks synchronise; integer-only, so rare)."""
    if op == "pow" and _is_int(a) and bool((b < 0).any()):
        raise DTypeError("pow: integers to negative integer powers are not allowed")
    if op in ("remainder", "floor_divide") and _is_int(a) and bool((b == 0).any()):
        raise ZeroDivisionError_(f"{op}: integer division by zero")


def _binary(op: str) -> Callable[[Any, Any, Any], None]:
    name = _spec(op).ufunc
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


def _pointwise(op: str) -> Callable[..., None] | None:
    spec = _spec(op)
    if op in raw.ELEMENTWISE_SOURCES:
        return _source(op)
    if catalogue.CATALOGUE[op].kind == "fused":
        return None  # no CUDA kernel of its own: the frontend runs the decomposition
    if spec.ufunc:
        return _unary(op) if catalogue.CATALOGUE[op].arity[1] == 1 else _binary(op)
    return _expression(op)


KERNELS: dict[str, Callable[..., None]] = {"copy": copy, "fill": fill, "arange": arange, "where": where}
for _op in catalogue.POINTWISE_OPS:
    _k = _pointwise(_op)
    if _k is not None:
        KERNELS[_op] = _k
