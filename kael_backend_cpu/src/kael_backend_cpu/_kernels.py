"""The kernel table: op name -> callable, as ``kael.backends.catalogue`` specifies the signatures.

Every primitive and fused op is a C++ function bound straight from ``_C`` (no Python
frame in between, NOTE [thin glue] in csrc/bindings.cpp), with these exceptions:

* the random kernels are ``kael.backends.host``'s: they draw from the
  ``kael.Generator``'s host bit generator, so a seed gives the same numbers on every
  CPU backend, and write through NumPy views;
* float16 attention and paged_attention run the NumPy host kernels
  (``kael.backends.host.kernel``), which compute in float16 NumPy arithmetic (rounding
  after every multiply-add); the C++ kernels compute float16 in float32 and land outside
  the conformance tolerance of that rounding. bfloat16 and the other float dtypes stay native;
* a fused op the installed extension does not bind (an older build) is left out: fused
  ops are optional, so the frontend runs its decomposition (``missing_fused()`` lists
  them). Every primitive must be bound;
* ``quantized_linear`` passes a repacked copy of Q8_0 / Q4_0 weights to calls of up to 16
  rows where this CPU has the kernel for it (NOTE [repacked weights] in ``_repack.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kael.backends import catalogue, dtypes, host

from . import _repack
from ._native import C

__all__ = ["kernel_table", "NATIVE_OPS", "missing_fused"]

#: The ops bound from _C: every primitive (the random ones come from kael.backends.host), every fused op it has.
NATIVE_OPS: tuple[str, ...] = tuple(
    op for op in catalogue.CATALOGUE if op not in host.RANDOM_KERNELS and (op in catalogue.PRIMITIVES or hasattr(C, op))
)
_host_attention = host.kernel("attention")
_host_paged_attention = host.kernel("paged_attention")


def missing_fused() -> list[str]:
    """The catalogue's fused ops this build of the extension has no kernel for (they run decomposed)."""
    return sorted(op for op in catalogue.FUSED if not hasattr(C, op))


def _attention(out: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, lengths: Any, window: int = 0) -> None:
    if q.dtype is dtypes.float16:
        _host_attention(out, q, k, v, scale, causal, lengths, window)
    else:
        C.attention(out, q, k, v, scale, causal, lengths, window)


def _paged_attention(
    out: Any, q: Any, cache: Any, block_table: Any, lengths: Any, scale: float, window: int = 0
) -> None:
    if q.dtype is dtypes.float16:
        _host_paged_attention(out, q, cache, block_table, lengths, scale, window)
    else:
        C.paged_attention(out, q, cache, block_table, lengths, scale, window)


def kernel_table() -> dict[str, Callable[..., Any]]:
    table: dict[str, Callable[..., Any]] = {name: getattr(C, name) for name in NATIVE_OPS}
    table.update(host.RANDOM_KERNELS)
    if "attention" in table:
        table["attention"] = _attention
    if "paged_attention" in table:
        table["paged_attention"] = _paged_attention
    if "quantized_linear" in table and hasattr(C, "pack_quantized"):
        table["quantized_linear"] = _repack.quantized_linear
    return table
