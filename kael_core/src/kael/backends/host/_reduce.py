"""Reductions over a tuple of dims; outputs keep the reduced dims as size 1."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, wr

__all__ = ["KERNELS"]


def _acc(out: Any) -> Any:
    return np.float32 if out.dtype.name in ("bfloat16", "float16") else out.dtype.np


def sum_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, np.sum(rd(a), axis=dims, keepdims=True, dtype=_acc(out)))


def prod(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    # float32 and half products run in float64 and are rounded to float32 once: a float32
    # running product underflows or overflows part way depending on the order
    if out.dtype.name in ("float32", "bfloat16", "float16"):
        wr(out, np.prod(rd(a), axis=dims, keepdims=True, dtype=np.float64).astype(np.float32))
    else:
        wr(out, np.prod(rd(a), axis=dims, keepdims=True, dtype=_acc(out)))


def amax(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, np.max(rd(a), axis=dims, keepdims=True))


def amin(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, np.min(rd(a), axis=dims, keepdims=True))


def _arg(f: Callable[..., np.ndarray]) -> Callable[[Any, Any, tuple[int, ...]], None]:
    def kernel(out: Any, a: Any, dims: tuple[int, ...]) -> None:
        (d,) = dims
        wr(out, f(rd(a), axis=d, keepdims=True))

    return kernel


def any_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, np.any(rd(a), axis=dims, keepdims=True))


def all_(out: Any, a: Any, dims: tuple[int, ...]) -> None:
    wr(out, np.all(rd(a), axis=dims, keepdims=True))


KERNELS: dict[str, Callable[..., None]] = {
    "sum": sum_,
    "prod": prod,
    "amax": amax,
    "amin": amin,
    "argmax": _arg(np.argmax),
    "argmin": _arg(np.argmin),
    "any": any_,
    "all": all_,
}
