"""conv2d as a fused catalogue op: the backend's kernels when it has them, else the decompositions.

NOTE [conv2d fused op]
----------------------
``conv2d`` (forward) and ``conv2d_backward`` (dx, dweight, dbias) are fused ops of the
catalogue (``kael/_ops.py``). Their decompositions here are the definition the
conformance kit checks backend kernels against, written with primitives only (copy,
fill, matmul, sum), in the layout of NOTE [convolution by gather and matmul]
(``_conv.py``): the zero-padded input is gathered into columns [C, KH, KW, N, OH, OW] =
[G, C/G*KH*KW, N*P] (one strided copy per kernel offset), multiplied per group by the
weight [G, O/G, C/G*KH*KW]; the backward multiplies the transposed operands and adds
each offset's slice of the column gradient back into the padded input. ``Conv2d`` is
the autograd Function the frontend's ``conv2d``/``conv1d`` run through: forward by the
``conv2d`` kernel, backward by the ``conv2d_backward`` kernel (first-order gradients;
kael's autograd has no double backward). Padding is symmetric here; the frontend pads
the odd extra element of ``padding='same'`` itself.
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import empty
from ._fused import decompositions
from ._linalg import _mm, _t
from ._reduce import reduce_op
from ._views import _slice_fn, make_view, reshape_nograd

__all__ = ["conv2d_fused", "conv2d_decomp", "conv2d_backward_decomp", "Conv2d", "conv2d_output_size"]

Pair = tuple[int, int]


def conv2d_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """The output length of one spatial dim: (size + 2*padding - dilation*(kernel-1) - 1) // stride + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _copy(out: Tensor, src: Tensor) -> None:
    _dispatch.kernel(out.device.type, "copy")(out, src)


def _zeros(shape: tuple[int, ...], like: Tensor) -> Tensor:
    out = empty(shape, like.dtype, like.device)
    _dispatch.kernel(like.device.type, "fill")(out, 0)
    return out


def _offset_views(t: Tensor, i: int, j: int, oh: int, ow: int, stride: Pair, dilation: Pair) -> Tensor:
    """The positions of padded t [A, B, Hp, Wp] kernel offset (i, j) reaches: a strided view [A, B, OH, OW]."""
    r0, c0 = i * dilation[0], j * dilation[1]
    t = _slice_fn(2, r0, r0 + (oh - 1) * stride[0] + 1, stride[0])(t)
    return _slice_fn(3, c0, c0 + (ow - 1) * stride[1] + 1, stride[1])(t)


def _padded(x: Tensor, padding: Pair) -> Tensor:
    """x [N, C, H, W] with zeros around it (x itself without padding)."""
    if padding == (0, 0):
        return x
    n, c, h, w = x.shape
    xp = _zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]), x)
    _copy(_slice_fn(3, padding[1], padding[1] + w, 1)(_slice_fn(2, padding[0], padding[0] + h, 1)(xp)), x)
    return xp


def _swap01(t: Tensor) -> Tensor:
    """t [A, B, ...] as the view [B, A, ...]."""
    st = t._strides
    return make_view(t, (t.shape[1], t.shape[0]) + t.shape[2:], (st[1], st[0]) + st[2:], t._offset)


def _columns(x: Tensor, kh: int, kw: int, oh: int, ow: int, stride: Pair, padding: Pair, dilation: Pair) -> Tensor:
    """The columns [C, KH, KW, N, OH, OW] of x [N, C, H, W] (NOTE [conv2d fused op])."""
    n, c = x.shape[:2]
    xt = _swap01(_padded(x, padding))  # [C, N, Hp, Wp]
    cols = empty((c, kh, kw, n, oh, ow), x.dtype, x.device)
    for i in range(kh):
        for j in range(kw):
            dst = reshape_nograd(
                _slice_fn(1, i * kw + j, i * kw + j + 1, 1)(reshape_nograd(cols, (c, kh * kw, n, oh, ow))),
                (c, n, oh, ow),
            )
            _copy(dst, _offset_views(xt, i, j, oh, ow, stride, dilation))
    return cols


def _out_hw(x: Tensor, w: Tensor, stride: Pair, padding: Pair, dilation: Pair) -> Pair:
    return (
        conv2d_output_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0]),
        conv2d_output_size(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1]),
    )


def conv2d_decomp(
    x: Tensor, weight: Tensor, bias: Tensor | None, stride: Pair, padding: Pair, dilation: Pair, groups: int
) -> Tensor:
    """out [N, O, OH, OW]: per group, weight [O/G, C/G*KH*KW] @ columns [C/G*KH*KW, N*OH*OW], plus bias."""
    n = x.shape[0]
    o, cg, kh, kw = weight.shape
    oh, ow = _out_hw(x, weight, stride, padding, dilation)
    cols = reshape_nograd(_columns(x, kh, kw, oh, ow, stride, padding, dilation), (groups, cg * kh * kw, n * oh * ow))
    y = _mm(reshape_nograd(weight, (groups, o // groups, cg * kh * kw)), cols)  # [G, O/G, N*P]
    y = _swap01(reshape_nograd(y, (o, n, oh, ow)))
    out = empty((n, o, oh, ow), x.dtype, x.device)
    if bias is None:
        _copy(out, y)
    else:
        b = make_view(bias, (n, o, oh, ow), (0, bias._strides[0], 0, 0), bias._offset)
        _dispatch.kernel(x.device.type, "add")(out, y, b)
    return out


def conv2d_backward_decomp(
    grad: Tensor, x: Tensor, weight: Tensor, stride: Pair, padding: Pair, dilation: Pair, groups: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of conv2d for grad [N, O, OH, OW] (NOTE [conv2d fused op])."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = weight.shape
    oh, ow = grad.shape[2:]
    kg, np_ = cg * kh * kw, n * oh * ow
    dbias = reduce_op("sum", reduce_op("sum", grad, (2, 3), False, grad.dtype), (0,), False, grad.dtype)
    gt = empty((o, n, oh, ow), grad.dtype, grad.device)  # grad as [G, O/G, N*P]
    _copy(gt, _swap01(grad))
    gt = reshape_nograd(gt, (groups, o // groups, np_))
    cols = reshape_nograd(_columns(x, kh, kw, oh, ow, stride, padding, dilation), (groups, kg, np_))
    dweight = reshape_nograd(_mm(gt, _t(cols)), weight.shape)
    wg = reshape_nograd(weight, (groups, o // groups, kg))
    dcols = reshape_nograd(_mm(_t(wg), gt), (c, kh * kw, n, oh, ow))
    dxp = _zeros((c, n, h + 2 * padding[0], wd + 2 * padding[1]), x)
    add = _dispatch.kernel(x.device.type, "add")
    for i in range(kh):
        for j in range(kw):
            src = reshape_nograd(_slice_fn(1, i * kw + j, i * kw + j + 1, 1)(dcols), (c, n, oh, ow))
            dst = _offset_views(dxp, i, j, oh, ow, stride, dilation)
            add(dst, dst, src)  # in place: the same elements in the same order (NOTE [aliasing])
    inner = _slice_fn(3, padding[1], padding[1] + wd, 1)(_slice_fn(2, padding[0], padding[0] + h, 1)(dxp))
    dx = empty(x.shape, x.dtype, x.device)
    _copy(dx, _swap01(inner))
    return dx, dweight, dbias


decompositions["conv2d"] = conv2d_decomp
decompositions["conv2d_backward"] = conv2d_backward_decomp


class Conv2d(Function):
    """out = conv2d(x, weight, bias); the backward is the ``conv2d_backward`` op (its kernel or decomposition)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, stride: Pair, padding: Pair, dilation: Pair, groups: int
    ) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.attrs = (stride, padding, dilation, groups)
        k = _dispatch.fused_kernel(x.device.type, "conv2d")
        if k is None:
            return conv2d_decomp(x, w, b, stride, padding, dilation, groups)
        oh, ow = _out_hw(x, w, stride, padding, dilation)
        out = empty((x.shape[0], w.shape[0], oh, ow), x.dtype, x.device)
        if out.numel():
            k(out, x, w, b, stride, padding, dilation, groups)
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        k = _dispatch.fused_kernel(x.device.type, "conv2d_backward")
        dx: Tensor | None
        dw: Tensor | None
        db: Tensor | None
        if k is None or g.numel() == 0:
            dx, dw, db = conv2d_backward_decomp(g, x, w, *ctx.attrs)
        else:
            dx = empty(x.shape, x.dtype, x.device) if need[0] else None
            dw = empty(w.shape, w.dtype, w.device) if need[1] else None
            db = empty((w.shape[0],), w.dtype, w.device) if need[2] else None
            k(dx, dw, db, g, x, w, *ctx.attrs)
        return (dx if need[0] else None), (dw if need[1] else None), (db if need[2] else None), None, None, None, None


def conv2d_fused(
    x: Tensor, weight: Tensor, bias: Tensor | None, stride: Pair, padding: Pair, dilation: Pair, groups: int
) -> Tensor:
    """The conv2d op on checked operands: x [N, C, H, W], weight [O, C/groups, KH, KW], symmetric zero padding."""
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)  # type: ignore[no-any-return]
