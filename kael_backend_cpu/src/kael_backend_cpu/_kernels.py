"""The kernel table: op name -> callable, as ``kael._ops`` specifies the signatures.

Every primitive and fused op is a C++ function bound straight from ``_C`` (no Python
frame in between, NOTE [thin glue] in csrc/bindings.cpp), with two exceptions:

* the random kernels are the reference backend's: they draw from the
  ``kael.Generator``'s host bit generator, so a seed gives the same numbers on every
  CPU backend, and write through NumPy views;
* float16 attention runs the reference kernel, which computes in float16 NumPy
  arithmetic (rounding after every multiply-add); the C++ kernel computes float16 in
  float32 and lands outside the conformance tolerance of that rounding. bfloat16 and
  the other float dtypes stay native.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kael import _dtype
from kael._ops import BINARY_OPS, COMPARE_OPS, FUSED, REDUCE_OPS, UNARY_OPS
from kael.backends.reference import _fused, _random

from ._native import C

__all__ = ["kernel_table", "NATIVE_OPS"]

NATIVE_OPS: tuple[str, ...] = (
    "copy",
    "fill",
    "arange",
    "where",
    "matmul",
    "gather",
    "index_select",
    "index_add",
    "scatter_add",
    "cat",
    "nonzero",
    "sort",
    *UNARY_OPS,
    *BINARY_OPS,
    *COMPARE_OPS,
    *REDUCE_OPS,
    *sorted(FUSED),
)


def _attention(out: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, lengths: Any) -> None:
    if q.dtype is _dtype.float16:
        _fused.attention(out, q, k, v, scale, causal, lengths)
    else:
        C.attention(out, q, k, v, scale, causal, lengths)


def kernel_table() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {name: getattr(C, name) for name in NATIVE_OPS}
    table.update(_random.KERNELS)
    table["attention"] = _attention
    return table
