"""Elementwise kernels: copy, fill, unary, binary, comparison, where."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._errors import DTypeError, KaelError
from ._io import compute_np, rd, wr

__all__ = ["KERNELS"]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _round(x: np.ndarray) -> np.ndarray:
    return np.round(x)  # half to even, like torch.round


_UNARY: dict[str, Callable[[np.ndarray], Any]] = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "erf": lambda x: _erf(x).astype(x.dtype),
    "log1p": np.log1p,
    "expm1": np.expm1,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round,
    "sign": np.sign,
    "logical_not": np.logical_not,
}


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer) and (b < 0).any():
        raise DTypeError("pow: integers to negative integer powers are not allowed")
    return np.power(a, b)  # type: ignore[no-any-return]


def _int_safe(f: Callable[[np.ndarray, np.ndarray], Any], name: str) -> Callable[[np.ndarray, np.ndarray], Any]:
    def g(a: np.ndarray, b: np.ndarray) -> Any:
        if np.issubdtype(a.dtype, np.integer) and (b == 0).any():
            raise ZeroDivisionError_(f"{name}: integer division by zero")
        return f(a, b)

    return g


class ZeroDivisionError_(KaelError, ZeroDivisionError):
    pass


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "pow": _pow,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "remainder": _int_safe(np.remainder, "remainder"),
    "floor_divide": _int_safe(np.floor_divide, "floor_divide"),
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def _unary(f: Callable[[np.ndarray], Any]) -> Callable[[Any, Any], None]:
    def kernel(out: Any, a: Any) -> None:
        with np.errstate(all="ignore"):
            wr(out, f(rd(a)))

    return kernel


def _binary(f: Callable[[np.ndarray, np.ndarray], Any]) -> Callable[[Any, Any, Any], None]:
    def kernel(out: Any, a: Any, b: Any) -> None:
        with np.errstate(all="ignore"):
            wr(out, f(rd(a), rd(b)))

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
KERNELS.update({name: _unary(f) for name, f in _UNARY.items()})
KERNELS.update({name: _binary(f) for name, f in _BINARY.items()})
_ = compute_np
