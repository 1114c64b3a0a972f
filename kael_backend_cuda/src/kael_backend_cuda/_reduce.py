"""Reductions over a tuple of dims (CuPy's CUB-backed reductions); outputs keep reduced dims as 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, wr
from ._xp import X, quiet

__all__ = ["KERNELS"]


def _acc(out: Any) -> Any:
    return np.float32 if out.dtype.name in ("bfloat16", "float16") else out.dtype.np


def sum_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, X.xp.sum(rd(a), axis=dims, keepdims=True, dtype=_acc(out)))


def prod(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    # float32 and half products run in float64 and are rounded to float32 once: a float32
    # running product underflows or overflows part way depending on the order
    if out.dtype.name in ("float32", "bfloat16", "float16"):
        wr(out, X.xp.prod(rd(a), axis=dims, keepdims=True, dtype=np.float64).astype(np.float32))
    else:
        wr(out, X.xp.prod(rd(a), axis=dims, keepdims=True, dtype=_acc(out)))


def amax(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, X.xp.max(rd(a), axis=dims, keepdims=True))


def amin(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, X.xp.min(rd(a), axis=dims, keepdims=True))


def _arg(name: str) -> Callable[[Any, Any, tuple[int, ...]], None]:
    def kernel(out: Any, a: Any, dims: tuple[int, ...]) -> None:
        (d,) = dims
        wr(out, getattr(X.xp, name)(rd(a), axis=d, keepdims=True))

    kernel.__name__ = name
    return kernel


def any_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, X.xp.any(rd(a), axis=dims, keepdims=True))


def all_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, X.xp.all(rd(a), axis=dims, keepdims=True))


_PLAIN: dict[str, Callable[..., None]] = {
    "sum": sum_,
    "prod": prod,
    "amax": amax,
    "amin": amin,
    "argmax": _arg("argmax"),
    "argmin": _arg("argmin"),
    "any": any_,
    "all": all_,
}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
