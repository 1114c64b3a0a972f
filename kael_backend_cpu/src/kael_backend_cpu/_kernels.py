"""The kernel table: op name -> callable, as ``kael._ops`` specifies the signatures.

Every primitive and fused op is a C++ function bound straight from ``_C`` (no Python
frame in between, NOTE [thin glue] in csrc/bindings.cpp). The random kernels are the
reference backend's: they draw from the ``kael.Generator``'s host bit generator, so a
seed gives the same numbers on every CPU backend, and write through NumPy views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kael._ops import BINARY_OPS, COMPARE_OPS, FUSED, REDUCE_OPS, UNARY_OPS
from kael.backends.reference import _random

from ._native import C

__all__ = ["kernel_table", "NATIVE_OPS"]

NATIVE_OPS: tuple[str, ...] = (
    "copy", "fill", "arange", "where", "matmul", "gather", "index_select", "index_add", "scatter_add", "cat",
    "nonzero", "sort", *UNARY_OPS, *BINARY_OPS, *COMPARE_OPS, *REDUCE_OPS, *sorted(FUSED),
)


def kernel_table() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {name: getattr(C, name) for name in NATIVE_OPS}
    table.update(_random.KERNELS)
    return table
