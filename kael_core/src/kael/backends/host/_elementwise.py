"""Elementwise kernels: copy, fill, arange, where, and every op with a ``Pointwise`` catalogue entry.

The unary, binary and comparison kernels (and elementwise fused ops such as silu) are
made from the catalogue: each computes ``Pointwise.compute(np, ...)``, the op's
reference definition, on the operands' values and writes the result into the output.
Integer ops with a domain error raise what every backend must raise (``_CHECKS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..._errors import DTypeError, KaelError
from ..._ops import CATALOGUE, POINTWISE_OPS, Pointwise
from ._io import rd, wr

__all__ = ["KERNELS", "ZeroDivisionError_"]


class ZeroDivisionError_(KaelError, ZeroDivisionError):
    """Integer division (remainder, floor_divide) by zero."""


def _no_negative_powers(a: np.ndarray, b: np.ndarray) -> None:
    if np.issubdtype(a.dtype, np.integer) and (b < 0).any():
        raise DTypeError("pow: integers to negative integer powers are not allowed")


def _no_zero_divisor(op: str) -> Callable[[np.ndarray, np.ndarray], None]:
    def check(a: np.ndarray, b: np.ndarray) -> None:
        if np.issubdtype(a.dtype, np.integer) and (b == 0).any():
            raise ZeroDivisionError_(f"{op}: integer division by zero")

    return check


#: Domain checks on integer operands, raised as KaelErrors (NumPy would warn and return garbage).
_CHECKS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "pow": _no_negative_powers,
    "remainder": _no_zero_divisor("remainder"),
    "floor_divide": _no_zero_divisor("floor_divide"),
}


def _pointwise(op: str, spec: Pointwise) -> Callable[..., None]:
    check = _CHECKS.get(op)

    def kernel(out: Any, *inputs: Any) -> None:
        vs = [rd(t) for t in inputs]
        if check is not None:
            check(*vs)
        with np.errstate(all="ignore"):
            wr(out, spec.compute(np, *vs))

    kernel.__name__ = op
    return kernel


def copy(out: Any, a: Any) -> None:
    wr(out, rd(a))


def fill(out: Any, value: Any) -> None:
    wr(out, value)


def arange(out: Any, start: Any, step: Any) -> None:
    n = out.shape[0]
    wr(out, start + np.arange(n, dtype=np.float64 if out.dtype.is_floating_point else np.int64) * step)


def where(out: Any, cond: Any, a: Any, b: Any) -> None:
    wr(out, np.where(rd(cond), rd(a), rd(b)))


KERNELS: dict[str, Callable[..., None]] = {"copy": copy, "fill": fill, "arange": arange, "where": where}
for _name in POINTWISE_OPS:
    _spec = CATALOGUE[_name].pointwise
    assert _spec is not None
    KERNELS[_name] = _pointwise(_name, _spec)
