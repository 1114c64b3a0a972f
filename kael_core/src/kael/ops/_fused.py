"""Fused ops: a backend kernel when the backend has one, else the decomposition.

Every fused op here has (1) a decomposition into primitives, the definition the
conformance kit checks backend kernels against, and (2) a backward written with
frontend ops (some of them fused too, e.g. ``gelu_backward``), except the inference-only
``paged_attention`` (NOTE [paged attention] in ``_attention_fused.py``). Attention and paged
attention live in ``_attention_fused.py``, the cross-entropy loss in ``_cross_entropy_fused.py``;
each registers its decompositions in ``decompositions`` here.

"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty, expand_to, numel
from ._gelu_ggml import ggml_gelu, ggml_gelu_tanh
from ._linalg import _mm, _t
from ._pointwise import binary, unary
from ._reduce import reduce_op
from ._views import contiguous_nograd, reshape_nograd

__all__ = [
    "softmax",
    "log_softmax",
    "gelu",
    "layer_norm",
    "linear",
    "embedding",
    "adamw_step",
    "decompositions",
    "run_fused",
]


def run_fused(op: str, decomp: Callable[..., Tensor], like: Tensor, *args: Any) -> Tensor:
    """op(*args) without autograd into a new tensor of ``like``'s shape and dtype: the backend's fused kernel
    ``op`` (called as ``kernel(out, *args)``), else ``decomp(*args)``. Empty inputs take the decomposition:
    kernels never see them (a max over no elements is undefined)."""
    k = _dispatch.fused_kernel(like.device.type, op)
    if k is None or not like.numel():
        return decomp(*args)
    out = empty(like.shape, like.dtype, like.device)
    k(out, *args)
    return out


def _float(x: Any, op: str) -> None:
    if not isinstance(x, Tensor):
        raise DTypeError(f"{op}: expected a tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise DTypeError(f"{op}: expected a floating-point tensor, got {x.dtype!r}")


# -- decompositions (no autograd; primitives only) ------------------------------------------


def softmax_decomp(x: Tensor, dim: int) -> Tensor:
    m = reduce_op("amax", x, (dim,), True, x.dtype) if x.shape[dim] else x
    e = unary("exp", binary("sub", x, m))
    return binary("div", e, reduce_op("sum", e, (dim,), True, x.dtype))


def log_softmax_decomp(x: Tensor, dim: int) -> Tensor:
    m = reduce_op("amax", x, (dim,), True, x.dtype) if x.shape[dim] else x
    s = binary("sub", x, m)
    return binary("sub", s, unary("log", reduce_op("sum", unary("exp", s), (dim,), True, x.dtype)))


def gelu_decomp(x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        inner = binary(
            "mul",
            binary("add", x, binary("mul", binary("mul", binary("mul", x, x), x), 0.044715)),
            math.sqrt(2.0 / math.pi),
        )
        return binary("mul", binary("mul", x, 0.5), binary("add", unary("tanh", inner), 1.0))
    return binary("mul", binary("mul", x, 0.5), binary("add", unary("erf", binary("mul", x, 1 / math.sqrt(2.0))), 1.0))


def gelu_backward_decomp(g: Tensor, x: Tensor, approximate: str) -> Tensor:
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        x2 = binary("mul", x, x)
        t = unary("tanh", binary("mul", binary("add", x, binary("mul", binary("mul", x2, x), 0.044715)), k))
        left = binary("mul", binary("add", t, 1.0), 0.5)
        dt_ = binary(
            "mul",
            binary("sub", 1.0, binary("mul", t, t)),
            binary("mul", binary("add", binary("mul", x2, 3 * 0.044715), 1.0), k),
        )
        right = binary("mul", binary("mul", x, 0.5), dt_)
        return binary("mul", g, binary("add", left, right))
    cdf = binary("mul", binary("add", unary("erf", binary("mul", x, 1 / math.sqrt(2.0))), 1.0), 0.5)
    pdf = binary("mul", unary("exp", binary("mul", binary("mul", x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return binary("mul", g, binary("add", cdf, binary("mul", x, pdf)))


def layer_norm_decomp(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    c = x.shape[-1]
    last = (x.ndim - 1,)
    mu = binary("div", reduce_op("sum", x, last, True, x.dtype), float(c))
    d = binary("sub", x, mu)
    var = binary("div", reduce_op("sum", binary("mul", d, d), last, True, x.dtype), float(c))
    r = unary("rsqrt", binary("add", var, eps))
    y = binary("mul", d, r)
    if w is not None:
        y = binary("mul", y, w)
    if b is not None:
        y = binary("add", y, b)
    return y, reshape_nograd(mu, x.shape[:-1]), reshape_nograd(r, x.shape[:-1])


def linear_decomp(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    x2 = reshape_nograd(x, (max(1, numel(x.shape[:-1])) if x.ndim > 1 else 1, x.shape[-1]))
    y = _mm(x2, _t(w))
    if b is not None:
        y = binary("add", y, b)
    return reshape_nograd(y, x.shape[:-1] + (w.shape[0],))


class _Nop:
    def save_for_backward(self, *a: Any) -> None:
        pass


def embedding_decomp(weight: Tensor, ids: Tensor) -> Tensor:
    from ._indexing import IndexSelect

    flat = reshape_nograd(contiguous_nograd(ids), (ids.numel(),))
    return reshape_nograd(IndexSelect.forward(_Nop(), weight, 0, flat), ids.shape + (weight.shape[1],))


decompositions: dict[str, Any] = {
    "softmax": softmax_decomp,
    "log_softmax": log_softmax_decomp,
    "gelu": gelu_decomp,
    "gelu_backward": gelu_backward_decomp,
    "layer_norm": layer_norm_decomp,
    "linear": linear_decomp,
    "embedding": embedding_decomp,
}


# -- the ops ------------------------------------------------------------------------------


class Softmax(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> Tensor:
        out = run_fused("softmax", softmax_decomp, x, x, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (y,) = ctx.saved_tensors
        gy = binary("mul", g, y)
        return binary("sub", gy, binary("mul", y, reduce_op("sum", gy, (ctx.dim,), True, gy.dtype))), None


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> Tensor:
        out = run_fused("log_softmax", log_softmax_decomp, x, x, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (y,) = ctx.saved_tensors
        s = reduce_op("sum", g, (ctx.dim,), True, g.dtype)
        return binary("sub", g, binary("mul", unary("exp", y), s)), None


def _dim_of(x: Tensor, dim: int, op: str) -> int:
    return x._wrap_dim(dim, op) if x.ndim else 0


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``dim`` (default the last), computed stably (the row's maximum
    subtracted first) in x's floating dtype; a 0-d x gives 1. Differentiable; the backend's fused
    ``softmax`` kernel when it has one, else its decomposition."""
    _float(x, "softmax")
    if x.ndim == 0:
        from ._creation import ones_like

        return ones_like(x)
    return Softmax.apply(x, _dim_of(x, dim, "softmax"))  # type: ignore[no-any-return]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``x - logsumexp(x)`` along ``dim`` (default the last), computed stably in x's floating dtype;
    a 0-d x gives 0. Differentiable; the fused ``log_softmax`` kernel when the backend has one."""
    _float(x, "log_softmax")
    if x.ndim == 0:
        from ._creation import zeros_like

        return zeros_like(x)
    return LogSoftmax.apply(x, _dim_of(x, dim, "log_softmax"))  # type: ignore[no-any-return]


class GeluBackward_(Function):
    """gelu's gradient as an op of its own, differentiable once more through its decomposition."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor, approximate: str) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "gelu_backward")
        if k is not None:
            out = empty(x.shape, x.dtype, x.device)
            k(out, contiguous_nograd(g) if g.shape == x.shape else expand_to(g, x.shape), x, approximate)
            return out
        return gelu_backward_decomp(g, x, approximate)

    @staticmethod
    def backward(ctx: Any, gg: Tensor) -> Any:
        raise NotImplementedError


class Gelu(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, approximate: str) -> Tensor:
        if approximate == "tanh" and ggml_gelu(x):  # KAEL_GELU=ggml: NOTE [ggml GELU table]
            out = ggml_gelu_tanh(x)
        else:
            out = run_fused("gelu", gelu_decomp, x, x, approximate)
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (x,) = ctx.saved_tensors
        return GeluBackward_.forward(None, g, x, ctx.approximate), None


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """The GELU activation elementwise: ``x * Phi(x)`` with the exact normal CDF (``approximate="none"``,
    PyTorch's default) or its tanh approximation (``"tanh"``, GPT-2's ``gelu_new``). Any other
    ``approximate`` is a DTypeError. Differentiable twice (its gradient is the fused ``gelu_backward``)."""
    _float(x, "gelu")
    if approximate not in ("none", "tanh"):
        raise DTypeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return Gelu.apply(x, approximate)  # type: ignore[no-any-return]


class LayerNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "layer_norm")
        if k is not None:
            out = empty(x.shape, x.dtype, x.device)
            stat = dt.float64 if x.dtype is dt.float64 else dt.float32
            mean = empty(x.shape[:-1], stat, x.device)
            rstd = empty(x.shape[:-1], stat, x.device)
            k(out, mean, rstd, x, w, b, eps)
        else:
            out, mean, rstd = layer_norm_decomp(x, w, b, eps)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.has_b = b is not None
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        k = _dispatch.fused_kernel(x.device.type, "layer_norm_backward")
        g = contiguous_nograd(g)
        if k is not None:
            dx = empty(x.shape, x.dtype, x.device)
            dw = empty(w.shape, w.dtype, w.device) if w is not None else None
            db = empty(w.shape, w.dtype, w.device) if (ctx.has_b and w is not None) else None
            k(dx, dw, db, g, x, mean, rstd, w)
            if ctx.has_b and db is None:
                db = reduce_op("sum", g, tuple(range(g.ndim - 1)), False, g.dtype)
        else:
            c = x.shape[-1]
            last = (x.ndim - 1,)
            mu = reshape_nograd(cast(mean, x.dtype), x.shape[:-1] + (1,))
            r = reshape_nograd(cast(rstd, x.dtype), x.shape[:-1] + (1,))
            xhat = binary("mul", binary("sub", x, mu), r)
            gw = binary("mul", g, w) if w is not None else g
            a = binary("div", reduce_op("sum", gw, last, True, gw.dtype), float(c))
            bterm = binary("div", reduce_op("sum", binary("mul", gw, xhat), last, True, gw.dtype), float(c))
            dx = binary("mul", r, binary("sub", binary("sub", gw, a), binary("mul", xhat, bterm)))
            lead = tuple(range(x.ndim - 1))
            dw = reduce_op("sum", binary("mul", g, xhat), lead, False, g.dtype) if w is not None else None
            db = reduce_op("sum", g, lead, False, g.dtype) if ctx.has_b else None
        return (dx if need[0] else None), dw, db, None


def layer_norm(
    x: Tensor, normalized_shape: Any, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """Normalises x over its last dimension (``normalized_shape``, an int or a one-element sequence
    equal to ``x.shape[-1]``): ``(x - mean) / sqrt(var + eps) * weight + bias``, with the biased variance
    and the statistics in float32 (float64 for float64 x), as ``torch.nn.functional.layer_norm``;
    weight and bias ``[C]`` or None. Differentiable in x, weight and bias.
    """
    _float(x, "layer_norm")
    if isinstance(normalized_shape, bool) or not isinstance(normalized_shape, (int, tuple, list)):
        raise DTypeError(f"layer_norm: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(ns) != 1:
        raise ShapeError(f"layer_norm: only normalisation over the last dimension is supported, got {list(ns)}")
    if x.ndim == 0 or x.shape[-1] != ns[0]:
        raise ShapeError(f"layer_norm: input shape {list(x.shape)} does not end with normalized_shape {list(ns)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and not isinstance(p, Tensor):
            raise DTypeError(f"layer_norm: {name} must be a tensor or None, got {type(p).__name__}")
        if p is not None and p.shape != ns:
            raise ShapeError(f"layer_norm: {name} has shape {list(p.shape)}, expected {list(ns)}")
    check_device("layer_norm", x, weight, bias)
    return LayerNorm.apply(x, weight, bias, float(eps))  # type: ignore[no-any-return]


class Linear(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "linear")
        if k is not None:
            out = empty(x.shape[:-1] + (w.shape[0],), x.dtype, x.device)
            k(out, x, w, b)
        else:
            out = linear_decomp(x, w, b)
        ctx.save_for_backward(x, w)
        ctx.has_b = b is not None
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        n = numel(x.shape[:-1])
        g2 = reshape_nograd(contiguous_nograd(g), (n, w.shape[0]))
        x2 = reshape_nograd(x, (n, x.shape[-1]))
        dx = reshape_nograd(_mm(g2, w), x.shape) if need[0] else None
        dw = _mm(_t(g2), x2) if need[1] else None
        db = reduce_op("sum", g2, (0,), False, g.dtype) if ctx.has_b else None
        return dx, dw, db


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias``: x ``[.., in]``, weight ``[out, in]`` (PyTorch's layout), bias ``[out]``
    or None; all one floating dtype on one device (DTypeError, ShapeError or DeviceError naming what
    does not fit). Differentiable in all three; the backend's fused ``linear`` kernel when it has one."""
    _float(x, "linear")
    _float(weight, "linear (weight)")
    if bias is not None:
        _float(bias, "linear (bias)")
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"linear: input {list(x.shape)} and weight {list(weight.shape)} do not match "
            "(expected weight [out_features, in_features] with in_features == input.shape[-1])"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ShapeError(f"linear: bias has shape {list(bias.shape)}, expected [{weight.shape[0]}]")
    if weight.dtype is not x.dtype or (bias is not None and bias.dtype is not x.dtype):
        raise DTypeError(f"linear: input {x.dtype!r}, weight {weight.dtype!r} and bias must share a dtype")
    check_device("linear", x, weight, bias)
    return Linear.apply(x, weight, bias)  # type: ignore[no-any-return]


class Embedding(Function):
    @staticmethod
    def forward(ctx: Any, weight: Tensor, ids: Tensor) -> Tensor:
        k = _dispatch.fused_kernel(weight.device.type, "embedding")
        if k is not None:
            out = empty(ids.shape + (weight.shape[1],), weight.dtype, weight.device)
            k(out, weight, ids)
        else:
            out = embedding_decomp(weight, ids)
        ctx.save_for_backward(ids)
        ctx.shape = weight.shape
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        (ids,) = ctx.saved_tensors
        from ._indexing import _zeros, index_add_nograd

        z = _zeros(ctx.shape, g.dtype, g.device)
        flat = reshape_nograd(contiguous_nograd(ids), (ids.numel(),))
        return index_add_nograd(z, 0, flat, reshape_nograd(contiguous_nograd(g), (ids.numel(), ctx.shape[1]))), None


def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """The rows of ``weight`` [num_embeddings, dim] at integer ``ids`` (any shape): ``[*ids.shape, dim]``.
    An id outside ``[0, num_embeddings)`` is an IndexError_ naming it. Differentiable in ``weight``
    (the gradient of repeated ids adds up)."""
    if not isinstance(ids, Tensor) or ids.dtype.category != 1:
        raise DTypeError(f"embedding: ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids))!r}")
    if not isinstance(weight, Tensor):
        raise DTypeError(f"embedding: weight must be a tensor, got {type(weight).__name__}")
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-d [num_embeddings, dim], got {list(weight.shape)}")
    check_device("embedding", ids, weight)
    if ids.dtype is not dt.int64:
        ids = cast(ids, dt.int64)
    if ids.numel():
        lo = int(reduce_op("amin", ids, tuple(range(ids.ndim)), False, dt.int64).item())
        hi = int(reduce_op("amax", ids, tuple(range(ids.ndim)), False, dt.int64).item())
        if lo < 0 or hi >= weight.shape[0]:
            raise IndexError_(f"embedding: id {lo if lo < 0 else hi} is out of range for {weight.shape[0]} embeddings")
    return Embedding.apply(weight, ids)  # type: ignore[no-any-return]


def adamw_step(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    """One AdamW update, in place on param, exp_avg and exp_avg_sq."""
    kern = _dispatch.fused_kernel(param.device.type, "adamw_step")
    if kern is not None:
        kern(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step)
    else:
        copy = _dispatch.kernel(param.device.type, "copy")
        m = binary("add", binary("mul", exp_avg, beta1), binary("mul", grad, 1 - beta1))
        v = binary("add", binary("mul", exp_avg_sq, beta2), binary("mul", binary("mul", grad, grad), 1 - beta2))
        copy(exp_avg, m)
        copy(exp_avg_sq, v)
        p = binary("mul", param, 1 - lr * weight_decay)
        mhat = binary("div", m, 1 - beta1**step)
        denom = binary("add", unary("sqrt", binary("div", v, 1 - beta2**step)), eps)
        copy(param, binary("sub", p, binary("mul", binary("div", mhat, denom), lr)))
    for t in (param, exp_avg, exp_avg_sq):
        t._bump_version()
