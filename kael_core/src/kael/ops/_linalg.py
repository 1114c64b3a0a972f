"""matmul with NumPy/PyTorch semantics: 1-D promotion and batch broadcasting."""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import broadcast_shapes, cast, check_device, empty, expand_to
from ._pointwise import sum_to
from ._views import make_view, reshape_nograd

__all__ = ["matmul"]


def _t(x: Tensor) -> Tensor:
    """Swap the last two dims (a view)."""
    n = x.ndim
    shape = x.shape[: n - 2] + (x.shape[n - 1], x.shape[n - 2])
    st = x._strides[: n - 2] + (x._strides[n - 1], x._strides[n - 2])
    return make_view(x, shape, st, x._offset)


def _mm(a: Tensor, b: Tensor) -> Tensor:
    """a [..., M, K] @ b [..., K, N] for ndim >= 2 (batch dims broadcast)."""
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], "matmul")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = empty(batch + (m, n), a.dtype, a.device)
    if k == 0:
        _dispatch.kernel(a.device.type, "fill")(out, 0)
        return out
    _dispatch.kernel(a.device.type, "matmul")(out, expand_to(a, batch + (m, k)), expand_to(b, batch + (k, n)))
    return out


class Matmul(Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor) -> Tensor:
        if not isinstance(a, Tensor) or not isinstance(b, Tensor):
            raise DTypeError(f"matmul: expected two tensors, got {type(a).__name__} and {type(b).__name__}")
        check_device("matmul", a, b)
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(
                f"matmul: both arguments need at least 1 dimension, got shapes {list(a.shape)} and {list(b.shape)}"
            )
        if a.dtype is not b.dtype:
            d = dt.promote_types(a.dtype, b.dtype)
            a, b = cast(a, d), cast(b, d)
        if a.dtype is dt.bool_:
            raise DTypeError("matmul: bool tensors are not supported")
        ka = a.shape[-1]
        kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
        if ka != kb:
            raise ShapeError(f"matmul: shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied ({ka} != {kb})")
        ctx.save_for_backward(a, b)
        a2 = reshape_nograd(a, (1,) + a.shape) if a.ndim == 1 else a
        b2 = reshape_nograd(b, b.shape + (1,)) if b.ndim == 1 else b
        out = _mm(a2, b2)
        shape = out.shape
        if a.ndim == 1:
            shape = shape[:-2] + shape[-1:]
        if b.ndim == 1:
            shape = shape[:-1]
        return reshape_nograd(out, shape)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        a, b = ctx.saved_tensors
        a2 = reshape_nograd(a, (1,) + a.shape) if a.ndim == 1 else a
        b2 = reshape_nograd(b, b.shape + (1,)) if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = reshape_nograd(g2, g2.shape[:-1] + (1,) + g2.shape[-1:]) if b.ndim > 1 else g2
        if b.ndim == 1:
            g2 = reshape_nograd(g2, g2.shape + (1,))
        if a.ndim == 1 and b.ndim == 1:
            g2 = reshape_nograd(g, (1, 1))
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = reshape_nograd(sum_to(_mm(g2, _t(b2)), a2.shape), a.shape)
        if ctx.needs_input_grad[1]:
            gb = reshape_nograd(sum_to(_mm(_t(a2), g2), b2.shape), b.shape)
        return ga, gb


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with NumPy's rules: 1-d operands are vectors, more dims are batches (broadcast)."""
    return Matmul.apply(a, b)  # type: ignore[no-any-return]
