"""max_pool2d as a fused catalogue op: the backend's kernels when it has them, else the decompositions.

NOTE [max_pool2d fused op]
--------------------------
``max_pool2d`` (values and int64 flat indices ``h*W + w`` of each window's first maximum
within its input plane) and ``max_pool2d_backward`` (the gradient added at those indices)
are fused ops of the catalogue. The frontend (``_pool.max_pool_nd``) checks the arguments
and sizes the output with PyTorch's rules (``ceil_mode``: a last window must start inside
the input or its left padding); kernels treat positions outside the input as -inf. The
forward's decomposition is the composition of NOTE [convolution by gather and matmul]
(windows of the -inf padded input, the first maximum by elementwise masks, NaN
propagated; indices by argmax); the backward's is one ``scatter_add`` into the zeroed
planes. ``MaxPool2d`` is the autograd Function: forward by the ``max_pool2d`` op, backward
by the ``max_pool2d_backward`` op with the saved indices.
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._tensor import Tensor
from ..autograd._function import Function
from ..autograd._grad_mode import no_grad
from ._core import empty
from ._fused import decompositions
from ._pointwise import binary
from ._reduce import Where_nograd
from ._views import contiguous_nograd, reshape_nograd

__all__ = ["max_pool2d_fused", "max_pool2d_decomp", "max_pool2d_backward_decomp", "MaxPool2d"]

Pair = tuple[int, int]


def _pool_out(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's output length of one dim (the frontend has checked that the window fits)."""
    num = n + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (o - 1) * s >= n + p:
        o -= 1
    return o


def max_pool2d_decomp(
    x: Tensor, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair, ceil_mode: bool
) -> tuple[Tensor, Tensor]:
    """(out, indices) of max pooling x [N, C, H, W], composed of primitives (NOTE [max_pool2d fused op])."""
    from ._pool import max_pool_composed

    with no_grad():
        return max_pool_composed(x, kernel, stride, padding, dilation, ceil_mode)


def max_pool2d_backward_decomp(
    grad: Tensor, indices: Tensor, size: Pair, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair
) -> Tensor:
    """dx [N, C, *size]: zeros, then grad [N, C, OH, OW] added at each plane's indices (negative ones skipped)."""
    n, c = grad.shape[:2]
    dx = empty((n * c, size[0] * size[1]), grad.dtype, grad.device)
    _dispatch.kernel(grad.device.type, "fill")(dx, 0)
    idx = reshape_nograd(contiguous_nograd(indices), (n * c, grad.shape[2] * grad.shape[3]))
    src = reshape_nograd(contiguous_nograd(grad), idx.shape)
    if idx.numel():
        keep = binary("ge", idx, 0)
        idx = Where_nograd(keep, idx, 0)
        src = Where_nograd(keep, src, 0.0)
        _dispatch.kernel(grad.device.type, "scatter_add")(dx, idx, src, 1)
    return reshape_nograd(dx, (n, c, size[0], size[1]))


decompositions["max_pool2d"] = max_pool2d_decomp
decompositions["max_pool2d_backward"] = max_pool2d_backward_decomp


class MaxPool2d(Function):
    """(out, indices) = max_pool2d(x); x's gradient is the ``max_pool2d_backward`` op on the saved indices."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair, ceil_mode: bool
    ) -> tuple[Tensor, Tensor]:
        k = _dispatch.fused_kernel(x.device.type, "max_pool2d")
        if k is None:
            out, idx = max_pool2d_decomp(x, kernel, stride, padding, dilation, ceil_mode)
        else:
            oh = _pool_out(x.shape[2], kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
            ow = _pool_out(x.shape[3], kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
            out = empty((x.shape[0], x.shape[1], oh, ow), x.dtype, x.device)
            idx = empty(out.shape, dt.int64, x.device)
            if out.numel():
                k(out, idx, x, kernel, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(idx)
        ctx.attrs = ((x.shape[2], x.shape[3]), kernel, stride, padding, dilation)
        return out, idx

    @staticmethod
    def backward(ctx: Any, g: Tensor, *_: Any) -> Any:
        (idx,) = ctx.saved_tensors
        k = _dispatch.fused_kernel(g.device.type, "max_pool2d_backward")
        if k is None:
            dx = max_pool2d_backward_decomp(g, idx, *ctx.attrs)
        else:
            dx = empty((g.shape[0], g.shape[1]) + ctx.attrs[0], g.dtype, g.device)
            if dx.numel():
                k(dx, g, idx, *ctx.attrs)
        return dx, None, None, None, None, None


def max_pool2d_fused(
    x: Tensor, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair, ceil_mode: bool
) -> tuple[Tensor, Tensor]:
    """(values, int64 flat indices) of max pooling checked x [N, C, H, W] (NOTE [max_pool2d fused op])."""
    out, idx = MaxPool2d.apply(x, kernel, stride, padding, dilation, ceil_mode)
    return out, idx
