"""Training-mode batch norm as a fused catalogue op: the backend's kernels when it has them, else the decompositions.

NOTE [batch_norm fused op]
--------------------------
``batch_norm`` normalises x [N, C, *S] with its own per-channel statistics (mean and
rstd = 1/sqrt(biased variance + eps), float32 or float64 for float64 x) and applies the
affine weight and bias; ``batch_norm_backward`` is the closed-form gradient through those
statistics. Their decompositions below use primitives only (sums over the trailing dims,
then the batch dim, as ``channel_sum`` does), computing in the statistics' dtype and
rounding once to x's dtype. ``kael.nn.functional.batch_norm`` runs the op in training
mode (and in eval mode without running statistics) and updates the running statistics
from the returned mean and rstd (var = 1/rstd^2 - eps); in eval mode with running statistics
it runs ``batch_norm_eval`` (whose backward treats the statistics as constants).
"""

from __future__ import annotations

from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, empty
from ._fused import decompositions
from ._pointwise import binary, unary
from ._reduce import reduce_op
from ._views import reshape_nograd

__all__ = [
    "batch_norm_train",
    "batch_norm_eval",
    "batch_norm_decomp",
    "batch_norm_backward_decomp",
    "batch_norm_eval_decomp",
    "BatchNorm",
    "BatchNormEval",
]


def _stat(d: dt.DType) -> dt.DType:
    return dt.float64 if d is dt.float64 else dt.float32


def _channel_sum(t: Tensor) -> Tensor:
    """t [N, C, *S] summed to [C, 1, ...]: over the trailing dims, then the batch dim (keepdim)."""
    if t.ndim > 2:
        t = reduce_op("sum", t, tuple(range(2, t.ndim)), True, t.dtype)
    return reshape_nograd(reduce_op("sum", t, (0,), True, t.dtype), t.shape[1:])


def _as_channel(v: Tensor, ndim: int) -> Tensor:
    return reshape_nograd(v, (v.shape[0],) + (1,) * (ndim - 2))


def batch_norm_decomp(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean [C], rstd [C]) of training-mode batch norm, composed of primitives."""
    st = _stat(x.dtype)
    c = x.shape[1]
    count = float(x.numel() // c) if c else 1.0
    xf = cast(x, st)
    mean = binary("div", _channel_sum(xf), count)  # [C, 1, ...]
    d = binary("sub", xf, mean)
    r = unary("rsqrt", binary("add", binary("div", _channel_sum(binary("mul", d, d)), count), float(eps)))
    y = binary("mul", d, r)
    if weight is not None:
        y = binary("mul", y, _as_channel(cast(weight, st), x.ndim))
    if bias is not None:
        y = binary("add", y, _as_channel(cast(bias, st), x.ndim))
    return cast(y, x.dtype), reshape_nograd(mean, (c,)), reshape_nograd(r, (c,))


def batch_norm_backward_decomp(
    grad: Tensor, x: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight [C], dbias [C]) of training-mode batch norm, composed of primitives."""
    st = rstd.dtype
    c = x.shape[1]
    count = float(x.numel() // c) if c else 1.0
    g = cast(grad, st)
    r = _as_channel(rstd, x.ndim)
    xhat = binary("mul", binary("sub", cast(x, st), _as_channel(mean, x.ndim)), r)
    sg, sgx = _channel_sum(g), _channel_sum(binary("mul", g, xhat))
    k = r if weight is None else binary("mul", r, _as_channel(cast(weight, st), x.ndim))
    inner = binary("sub", binary("sub", g, binary("div", sg, count)), binary("mul", xhat, binary("div", sgx, count)))
    dx = cast(binary("mul", k, inner), x.dtype)
    wd = weight.dtype if weight is not None else x.dtype
    return dx, cast(reshape_nograd(sgx, (c,)), wd), cast(reshape_nograd(sg, (c,)), wd)


def batch_norm_eval_decomp(
    x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias with given statistics [C], composed of primitives."""
    st = _stat(x.dtype)
    r = unary("rsqrt", binary("add", _as_channel(cast(var, st), x.ndim), float(eps)))
    y = binary("mul", binary("sub", cast(x, st), _as_channel(cast(mean, st), x.ndim)), r)
    if weight is not None:
        y = binary("mul", y, _as_channel(cast(weight, st), x.ndim))
    if bias is not None:
        y = binary("add", y, _as_channel(cast(bias, st), x.ndim))
    return cast(y, x.dtype)


decompositions["batch_norm"] = batch_norm_decomp
decompositions["batch_norm_backward"] = batch_norm_backward_decomp
decompositions["batch_norm_eval"] = batch_norm_eval_decomp


class BatchNorm(Function):
    """out = batch_norm(x, weight, bias) with the batch's statistics, which forward appends to ``stats``
    as (mean, rstd); the backward is the ``batch_norm_backward`` op."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, w: Tensor | None, b: Tensor | None, eps: float, stats: list[tuple[Tensor, Tensor]]
    ) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "batch_norm")
        if k is None or x.numel() == 0:
            out, mean, rstd = batch_norm_decomp(x, w, b, eps)
        else:
            out = empty(x.shape, x.dtype, x.device)
            mean = empty((x.shape[1],), _stat(x.dtype), x.device)
            rstd = empty((x.shape[1],), _stat(x.dtype), x.device)
            k(out, mean, rstd, x, w, b, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        stats.append((mean, rstd))
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        k = _dispatch.fused_kernel(x.device.type, "batch_norm_backward")
        dx: Tensor | None
        dw: Tensor | None
        db: Tensor | None
        if k is None or x.numel() == 0:
            dx, dw, db = batch_norm_backward_decomp(g, x, mean, rstd, w)
        else:
            c = (x.shape[1],)
            dx = empty(x.shape, x.dtype, x.device) if need[0] else None
            dw = empty(c, w.dtype, x.device) if w is not None and need[1] else None
            db = empty(c, x.dtype, x.device) if need[2] else None
            k(dx, dw, db, g, x, mean, rstd, w)
        return (dx if need[0] else None), (dw if need[1] else None), (db if need[2] else None), None, None


def batch_norm_train(
    x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, mean [C], rstd [C]) of training-mode batch norm of checked x [N, C, *S] (NOTE [batch_norm fused op])."""
    stats: list[tuple[Tensor, Tensor]] = []
    out = BatchNorm.apply(x, weight, bias, float(eps), stats)
    return out, stats[0][0], stats[0][1]


class BatchNormEval(Function):
    """out = batch_norm_eval(x, mean, var, weight, bias) (the ``batch_norm_eval`` op); the statistics are
    constants, so dx = g * weight / sqrt(var + eps), dweight = sum(g * xhat), dbias = sum(g) (per channel),
    written with primitives."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, w: Tensor | None, b: Tensor | None, mean: Tensor, var: Tensor, eps: float
    ) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "batch_norm_eval")
        if k is None or x.numel() == 0:
            out = batch_norm_eval_decomp(x, mean, var, w, b, eps)
        else:
            out = empty(x.shape, x.dtype, x.device)
            k(out, x, mean, var, w, b, eps)
        ctx.save_for_backward(x, w, mean, var)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w, mean, var = ctx.saved_tensors
        need = ctx.needs_input_grad
        st = _stat(x.dtype)
        c = (x.shape[1],)
        r = unary("rsqrt", binary("add", _as_channel(cast(var, st), x.ndim), ctx.eps))
        gf = cast(g, st)
        dx = dw = db = None
        if need[0]:
            dx = cast(
                binary("mul", gf, r if w is None else binary("mul", r, _as_channel(cast(w, st), x.ndim))), x.dtype
            )
        if w is not None and need[1]:
            xhat = binary("mul", binary("sub", cast(x, st), _as_channel(cast(mean, st), x.ndim)), r)
            dw = cast(reshape_nograd(_channel_sum(binary("mul", gf, xhat)), c), w.dtype)
        if need[2]:
            db = cast(reshape_nograd(_channel_sum(gf), c), x.dtype)
        return dx, dw, db, None, None, None


def batch_norm_eval(
    x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """Eval-mode batch norm of checked x [N, C, *S] with statistics mean, var [C] (NOTE [batch_norm fused op])."""
    return BatchNormEval.apply(x, weight, bias, mean, var, float(eps))  # type: ignore[no-any-return]
