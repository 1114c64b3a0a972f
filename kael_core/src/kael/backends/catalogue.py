"""``kael.backends.catalogue``: the op catalogue, every op a backend may implement, named once.

A kernel is a plain callable taking its arguments positionally in ``OpDef.args`` order
(NOTE [kernel contract]): outputs are preallocated by the frontend (contiguous, or a
strided view), operands come with arbitrary non-negative strides (0 for broadcast) and
offsets, already promoted to the computation dtype and broadcast to the output's shape
for elementwise ops; a kernel writes only into its outputs and returns None.

* ``OpDef``: ``name``, ``kind`` (``"primitive"`` every backend implements, ``"fused"``
  optional), ``args`` (``Arg``: name, role out/inout/in/attr, type, optional),
  ``signature`` (the exact kernel signature as text), ``outputs``, ``inputs``,
  ``attributes`` (names in order), ``arity`` ((outputs, inputs)), ``allocated``
  (positions of frontend-allocated outputs), ``doc``, and ``pointwise`` for elementwise ops.
* ``Pointwise``: an elementwise op's reference definition (``compute(xp, *arrays)``:
  a NumPy ufunc name or expression), dtype class, Tensor-method flags, sample domains
  and, for a fused one, its decomposition.
* Families (tuples and frozensets of op names): ``UNARY_OPS``, ``BINARY_OPS``,
  ``COMPARE_OPS``, ``REDUCE_OPS`` (primitives), ``POINTWISE_OPS`` (every elementwise op,
  fused ones included), ``POINTWISE_FUSED``, ``PRIMITIVES``, ``FUSED``; ``CATALOGUE``
  maps every name to its ``OpDef``.
* ``op(name)``: the OpDef (``BackendError`` for an unknown name).
* ``decomposition(name)``: the frontend's decomposition of a fused op into primitives,
  a callable ``f(*inputs, *attributes)`` returning the outputs (no autograd). When a
  backend does not list a fused op in ``supported_ops()``, the frontend runs exactly
  this on the backend's primitives; ``decompositions()`` lists them all. Two fused ops
  have none: ``adamw_step`` (an in-place update, written with primitives in
  ``kael.adamw_step``) and ``layer_norm_backward`` (written with primitives inside
  layer_norm's backward).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import BackendError
from .._ops import (
    BINARY_OPS,
    CATALOGUE,
    COMPARE_OPS,
    FUSED,
    POINTWISE_FUSED,
    POINTWISE_OPS,
    PRIMITIVES,
    REDUCE_OPS,
    UNARY_OPS,
    Arg,
    OpDef,
    Pointwise,
)

__all__ = [
    "Arg",
    "OpDef",
    "Pointwise",
    "CATALOGUE",
    "PRIMITIVES",
    "FUSED",
    "UNARY_OPS",
    "BINARY_OPS",
    "COMPARE_OPS",
    "REDUCE_OPS",
    "POINTWISE_OPS",
    "POINTWISE_FUSED",
    "op",
    "decomposition",
    "decompositions",
]


def op(name: str) -> OpDef:
    """The catalogue entry of op `name`."""
    found = CATALOGUE.get(name)
    if found is None:
        raise BackendError(f"catalogue: unknown op {name!r}; the catalogue has {len(CATALOGUE)} ops")
    return found


def decompositions() -> dict[str, Callable[..., Any]]:
    """Every fused op's decomposition into primitives, by op name (a new dict)."""
    from ..ops._fused import decompositions as table

    return dict(table)


def decomposition(name: str) -> Callable[..., Any]:
    """The decomposition of fused op `name`: ``f(*inputs, *attributes)`` -> its output(s), on primitives."""
    d = op(name)
    if d.kind != "fused":
        raise BackendError(f"catalogue.decomposition: {name!r} is a primitive; only fused ops have decompositions")
    found = decompositions().get(name)
    if found is None:
        raise BackendError(
            f"catalogue.decomposition: fused op {name!r} has no decomposition (it is an in-place update)"
        )
    return found
