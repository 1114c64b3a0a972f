"""``kael.backends.host``: NumPy helpers and kernels for backends whose memory the host can read.

A CPU backend's ``Storage.data`` is a 1-D NumPy uint8 array (over memory it may own);
these helpers give the strided NumPy view of a tensor's elements and read and write its
values with bfloat16 handled. The random kernels draw from a ``kael.Generator``'s host
bit generator, so a seed gives the same numbers on every CPU-memory backend that uses
them. ``kernel(op)`` is the NumPy host-kernel library: every primitive and fused op of
the catalogue written as plain NumPy (the reference backend serves exactly these), for a
backend to fall back to where it has no kernel of its own (or, as the C++ backend does
for float16 attention, where the NumPy arithmetic is the one it must match).

Names
-----
* ``view(t)``: the strided NumPy view of a CPU tensor's elements (uint16 bits for bfloat16).
* ``read(t)``: t's values (a view when possible; bfloat16 widened to float32).
* ``write(out, value)``: value (array-like, broadcastable) into out's elements, cast to out's dtype.
* ``f32_to_bf16_bits(x)`` / ``bf16_bits_to_f32(bits)``: bfloat16 <-> float32 (round to nearest even).
* ``compute_dtype(dtype)``: the NumPy dtype to compute a kael dtype in (float32 for bfloat16).
* ``uniform``, ``normal``, ``randint``, ``RANDOM_KERNELS``: the seeded random kernels.
* ``kernel(op)``, ``kernels()``: the NumPy host kernels by op name (``BackendError`` if none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._errors import BackendError
from ..._ops import FUSED, PRIMITIVES
from . import _batch_norm, _conv, _elementwise, _fused, _indexing, _pool, _quant, _random, _reduce
from ._io import bf16_bits_to_f32, compute_np, f32_to_bf16_bits, rd, view, wr
from ._random import normal, randint, uniform

__all__ = [
    "view",
    "read",
    "write",
    "f32_to_bf16_bits",
    "bf16_bits_to_f32",
    "compute_dtype",
    "uniform",
    "normal",
    "randint",
    "RANDOM_KERNELS",
    "kernel",
    "kernels",
    "PRIMITIVE_KERNELS",
    "FUSED_KERNELS",
]

read = rd
write = wr
compute_dtype = compute_np

#: The seeded random kernels: uniform(out, low, high, generator), normal(...), randint(...).
RANDOM_KERNELS: dict[str, Callable[..., None]] = dict(_random.KERNELS)
_ALL = {
    **_elementwise.KERNELS,
    **_reduce.KERNELS,
    **_indexing.KERNELS,
    **_random.KERNELS,
    **_fused.KERNELS,
    **_conv.KERNELS,
    **_batch_norm.KERNELS,
    **_pool.KERNELS,
    **_quant.KERNELS,
}
#: Every primitive (the random kernels included), as NumPy host kernels.
PRIMITIVE_KERNELS: dict[str, Callable[..., None]] = {op: k for op, k in _ALL.items() if op in PRIMITIVES}
#: Every fused op, as NumPy host kernels (the elementwise fused ones made from the catalogue).
FUSED_KERNELS: dict[str, Callable[..., None]] = {op: k for op, k in _ALL.items() if op in FUSED}


def kernel(op: str) -> Callable[..., Any]:
    """The NumPy host kernel of op (signature as the catalogue documents it)."""
    found = PRIMITIVE_KERNELS.get(op) or FUSED_KERNELS.get(op)
    if found is None:
        raise BackendError(f"kael.backends.host.kernel: no host kernel for op {op!r}")
    return found


def kernels() -> dict[str, Callable[..., Any]]:
    """Every host kernel, primitive and fused, by op name (a new dict)."""
    return {**PRIMITIVE_KERNELS, **FUSED_KERNELS}
