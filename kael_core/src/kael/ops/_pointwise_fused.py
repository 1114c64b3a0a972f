"""Elementwise fused ops (silu, ...): the backend's kernel when it has one, else the catalogue's decomposition.

Each op of the catalogue's ``POINTWISE_FUSED`` is defined there by primitives
(``Pointwise.decompose(p, x)``); this module binds ``p`` to the frontend's primitive
functions (``primitives``: no autograd, dispatched to the backend's kernels), registers
those decompositions with the other fused ops' (``_fused.decompositions``), and holds
each op's Function, whose backward is written with frontend ops. ``kael.<op>`` and
``Tensor.<op>`` are made from the catalogue in ``kael.ops``.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from .. import _dtype as dt
from .._errors import DTypeError
from .._ops import CATALOGUE, POINTWISE_FUSED, POINTWISE_OPS, PRIMITIVES
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast
from ._fused import decompositions, run_fused
from ._pointwise import binary, differentiable, float_only, unary
from ._reduce import Where_nograd

__all__ = ["primitives", "pointwise_fused", "Silu"]


def _primitive(op: str) -> Any:
    return functools.partial(unary if CATALOGUE[op].arity[1] == 1 else binary, op)


#: ``p`` of ``Pointwise.decompose``: p.<op>(...) for every elementwise primitive, and p.where(cond, a, b).
primitives = SimpleNamespace(
    **{op: _primitive(op) for op in POINTWISE_OPS if op in PRIMITIVES},
    where=Where_nograd,
)

for _op in POINTWISE_FUSED:
    _spec = CATALOGUE[_op].pointwise
    assert _spec is not None and _spec.decompose is not None, f"fused elementwise op {_op!r} needs a decomposition"
    decompositions[_op] = functools.partial(_spec.decompose, primitives)


def pointwise_fused(op: str, x: Tensor) -> Tensor:
    """op(x) without autograd: the backend's fused kernel, or the decomposition on its primitives."""
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(x).__name__}")
    if op in float_only and not x.dtype.is_floating_point:
        x = cast(x, dt.get_default_dtype())
    return run_fused(op, decompositions[op], x, x)


@differentiable("silu", saves_input=True)
class Silu(Function):
    """silu(x) = x * sigmoid(x) (the swish of Llama's MLP); d/dx = s + x * s * (1 - s) with s = sigmoid(x)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        out = pointwise_fused("silu", x)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (x,) = ctx.saved_tensors
        s = unary("sigmoid", x)
        return binary("mul", g, binary("add", s, binary("mul", binary("mul", x, s), binary("sub", 1.0, s))))
