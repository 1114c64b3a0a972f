"""avg_pool2d as a fused catalogue op: the backend's kernels when it has them, else the decompositions.

NOTE [avg_pool2d fused op]
--------------------------
``avg_pool2d`` sums each window's positions inside x [N, C, H, W] (zero padding; a
``ceil_mode`` window may run past the padding) and divides by a divisor table [OH, OW]
(float64) that the frontend (``_pool.avg_pool_nd``) builds on the host from PyTorch's
rules (``count_include_pad``, ``divisor_override``), so kernels need no rule of their own;
``avg_pool2d_backward`` spreads grad / divisor over each window. The decompositions add
the K strided views of the zero-padded input (forward) or add into them (backward).
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, empty
from ._fused import decompositions
from ._pointwise import binary
from ._views import _slice_fn, contiguous_nograd, make_view

__all__ = ["avg_pool2d_fused", "avg_pool2d_decomp", "avg_pool2d_backward_decomp", "AvgPool2d"]

Pair = tuple[int, int]


def _zeros(shape: tuple[int, ...], like: Tensor) -> Tensor:
    out = empty(shape, like.dtype, like.device)
    _dispatch.kernel(like.device.type, "fill")(out, 0)
    return out


def _padded_shape(n: int, c: int, size: Pair, out: Pair, kernel: Pair, stride: Pair, padding: Pair) -> tuple[int, ...]:
    return (
        n,
        c,
        max(size[0] + 2 * padding[0], (out[0] - 1) * stride[0] + kernel[0]),
        max(size[1] + 2 * padding[1], (out[1] - 1) * stride[1] + kernel[1]),
    )


def _views(big: Tensor, kernel: Pair, stride: Pair, out: Pair) -> list[Tensor]:
    return [
        _slice_fn(3, j, j + (out[1] - 1) * stride[1] + 1, stride[1])(
            _slice_fn(2, i, i + (out[0] - 1) * stride[0] + 1, stride[0])(big)
        )
        for i in range(kernel[0])
        for j in range(kernel[1])
    ]


def _interior(big: Tensor, size: Pair, padding: Pair) -> Tensor:
    return _slice_fn(3, padding[1], padding[1] + size[1], 1)(_slice_fn(2, padding[0], padding[0] + size[0], 1)(big))


def _divisors_like(divisors: Tensor, like: Tensor) -> Tensor:
    d = cast(divisors, like.dtype)
    return make_view(d, like.shape, (0, 0, d._strides[0], d._strides[1]), d._offset)


def avg_pool2d_decomp(x: Tensor, divisors: Tensor, kernel: Pair, stride: Pair, padding: Pair) -> Tensor:
    """out [N, C, OH, OW] of average pooling, composed of primitives (NOTE [avg_pool2d fused op])."""
    n, c, h, w = x.shape
    out = (divisors.shape[0], divisors.shape[1])
    big = _zeros(_padded_shape(n, c, (h, w), out, kernel, stride, padding), x)
    _dispatch.kernel(x.device.type, "copy")(_interior(big, (h, w), padding), x)
    total = _zeros((n, c) + out, x)
    add = _dispatch.kernel(x.device.type, "add")
    for v in _views(big, kernel, stride, out):
        add(total, total, v)
    res = empty(total.shape, x.dtype, x.device)
    _dispatch.kernel(x.device.type, "div")(res, total, _divisors_like(divisors, total))
    return res


def avg_pool2d_backward_decomp(
    grad: Tensor, divisors: Tensor, size: Pair, kernel: Pair, stride: Pair, padding: Pair
) -> Tensor:
    """dx [N, C, *size] of average pooling, composed of primitives (NOTE [avg_pool2d fused op])."""
    n, c = grad.shape[:2]
    out = (divisors.shape[0], divisors.shape[1])
    g = binary("div", grad, _divisors_like(divisors, grad))
    big = _zeros(_padded_shape(n, c, size, out, kernel, stride, padding), grad)
    add = _dispatch.kernel(grad.device.type, "add")
    for v in _views(big, kernel, stride, out):
        add(v, v, g)  # in place: the same elements in the same order
    return contiguous_nograd(_interior(big, size, padding))


decompositions["avg_pool2d"] = avg_pool2d_decomp
decompositions["avg_pool2d_backward"] = avg_pool2d_backward_decomp


class AvgPool2d(Function):
    """out = avg_pool2d(x); x's gradient is the ``avg_pool2d_backward`` op."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, divisors: Tensor, kernel: Pair, stride: Pair, padding: Pair) -> Tensor:
        ctx.attrs = ((x.shape[2], x.shape[3]), kernel, stride, padding)
        ctx.save_for_backward(divisors)
        k = _dispatch.fused_kernel(x.device.type, "avg_pool2d")
        if k is None or x.numel() == 0:
            return avg_pool2d_decomp(x, divisors, kernel, stride, padding)
        out = empty((x.shape[0], x.shape[1], divisors.shape[0], divisors.shape[1]), x.dtype, x.device)
        k(out, x, divisors, kernel, stride, padding)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (divisors,) = ctx.saved_tensors
        k = _dispatch.fused_kernel(g.device.type, "avg_pool2d_backward")
        if k is None or g.numel() == 0:
            dx = avg_pool2d_backward_decomp(g, divisors, *ctx.attrs)
        else:
            dx = empty((g.shape[0], g.shape[1]) + ctx.attrs[0], g.dtype, g.device)
            k(dx, g, divisors, *ctx.attrs)
        return dx, None, None, None, None


def avg_pool2d_fused(x: Tensor, divisors: Tensor, kernel: Pair, stride: Pair, padding: Pair) -> Tensor:
    """Average pooling of checked x [N, C, H, W] by the divisor table [OH, OW] (NOTE [avg_pool2d fused op])."""
    return AvgPool2d.apply(x, divisors, kernel, stride, padding)  # type: ignore[no-any-return]
