"""Fused ops: a backend kernel when the backend has one, else the decomposition.

Every fused op here has (1) a decomposition into primitives, the definition the
conformance kit checks backend kernels against, and (2) a backward written with
frontend ops (some of them fused too, e.g. ``gelu_backward``), except the inference-only
``paged_attention`` (NOTE [paged attention]).

NOTE [paged attention]
----------------------
``paged_attention`` is causal attention whose keys and values live in a paged KV cache
(vLLM's layout): one layer's pool ``cache`` [NB, 2, Hkv, S, D] of NB blocks of S positions
(``cache[n, 0]`` keys, ``cache[n, 1]`` values) and, per batch row, a block table naming
the blocks that hold positions 0..lengths[b]-1 in order. The frontend checks every value
it can (lengths within [T, M*S], each block id in use within [0, NB)) on the host before
any kernel runs, so kernels may index the pool without bounds checks. The decomposition is
the definition: per row, gather its ceil(lengths[b]/S) blocks into contiguous k, v
[1, Hkv, lengths[b], D] and run ``attention(q[b:b+1], k, v, causal=True)`` (the backend's
attention kernel when it has one). Kernels keep two invariants the decomposition has by
construction: a row's bits never depend on the other rows of the batch, nor on which
block ids hold its keys. It is inference only, like ``dequantize``: the output has no
``grad_fn`` (a KV cache is data written by earlier steps, not a graph to differentiate).
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty, expand_to, scalar_tensor
from ._indexing import scatter_add_nograd
from ._linalg import _mm, _t
from ._pointwise import Div, binary, sum_to, unary
from ._reduce import Sum, Where_nograd, reduce_op
from ._views import _slice_fn, contiguous_nograd, make_view, reshape_nograd

__all__ = [
    "softmax",
    "log_softmax",
    "gelu",
    "layer_norm",
    "linear",
    "embedding",
    "cross_entropy",
    "attention",
    "paged_attention",
    "topk",
    "adamw_step",
    "decompositions",
]


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
    x2 = reshape_nograd(x, (max(1, _prod(x.shape[:-1])) if x.ndim > 1 else 1, x.shape[-1]))
    y = _mm(x2, _t(w))
    if b is not None:
        y = binary("add", y, b)
    return reshape_nograd(y, x.shape[:-1] + (w.shape[0],))


def _prod(s: tuple[int, ...]) -> int:
    n = 1
    for v in s:
        n *= v
    return n


def _group_queries(q: Tensor, hkv: int) -> Tensor:
    """q [B,H,Tq,D] as [B,Hkv,g*Tq,D] (g = H // Hkv): the g query heads of kv head j stacked on its rows.

    Query head h = j*g + i reads kv head j = h // g (Hugging Face's ``repeat_kv`` order), so
    one matmul per kv head serves its whole group and K/V are never repeated. A view when
    q's (H, Tq) dims are contiguous (always when Tq == 1), a copy of q otherwise.
    """
    b, h, tq, d = q.shape
    return q if hkv == h else reshape_nograd(q, (b, hkv, (h // hkv) * tq, d))


def _attention_mask(tq: int, tk: int, group: int, causal: bool, lengths: Tensor | None, device: Any) -> Tensor | None:
    """True where a score is masked, broadcastable to the scores [B, Hkv, group*Tq, Tk] (None: nothing masked)."""
    from ._creation import arange

    qi = reshape_nograd(arange(group * tq, device=device), (group * tq, 1))
    if group != 1:
        qi = binary("remainder", qi, tq)  # row r of a grouped block is query r % Tq
    ki = reshape_nograd(arange(tk, device=device), (1, tk))
    masked: Tensor | None = binary("gt", ki, binary("add", qi, tk - tq)) if causal else None
    if lengths is not None:
        lm = binary("ge", reshape_nograd(ki, (1, 1, 1, tk)), reshape_nograd(lengths, (lengths.shape[0], 1, 1, 1)))
        masked = lm if masked is None else binary("logical_or", masked, lm)
    return masked


def attention_decomp(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: Tensor | None) -> Tensor:
    b, h, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[-2]
    qg = _group_queries(q, hkv)
    s = binary("mul", _mm(qg, _t(k)), scale)
    masked = _attention_mask(tq, tk, h // hkv if hkv else 1, causal, lengths, q.device)
    if masked is not None:
        from ._reduce import Where_nograd

        s = Where_nograd(expand_to(masked, s.shape) if masked.shape != s.shape else masked, float("-inf"), s)
        m = reduce_op("amax", s, (s.ndim - 1,), True, s.dtype)
        m = Where_nograd(binary("eq", m, float("-inf")), 0.0, m)
        e = unary("exp", binary("sub", s, m))
        den = reduce_op("sum", e, (s.ndim - 1,), True, s.dtype)
        p = binary("div", e, Where_nograd(binary("eq", den, 0.0), 1.0, den))
    else:
        p = softmax_decomp(s, s.ndim - 1)
    out = _mm(p, v)
    return out if hkv == h else reshape_nograd(out, (b, h, tq, v.shape[-1]))


def _attention_nograd(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool) -> Tensor:
    """attention(q, k, v) without autograd: the backend's fused kernel when it has one, else the decomposition."""
    kern = _dispatch.fused_kernel(q.device.type, "attention")
    if kern is None:
        return attention_decomp(q, k, v, scale, causal, None)
    out = empty(q.shape[:-1] + (v.shape[-1],), q.dtype, q.device)
    if out.numel():
        kern(out, q, k, v, scale, causal, None)
    return out


def _row_blocks(cache: Tensor, ids: Tensor, part: int, length: int) -> Tensor:
    """The first `length` positions of blocks `ids` (int64 [n]) of cache part 0 (keys) or 1 (values), [1, Hkv, length, D].

    Gathered with the index_select primitive, then laid out contiguously position after position.
    """
    nb = ids.shape[0]
    _, _, hkv, s, d = cache.shape
    picked = empty((nb, 2, hkv, s, d), cache.dtype, cache.device)
    _dispatch.kernel(cache.device.type, "index_select")(picked, cache, ids, 0)
    st = picked._strides
    # picked[:, part] permuted to [Hkv, nb, S, D], then [Hkv, nb*S, D] (a copy), cut to the row's length
    kv = make_view(picked, (hkv, nb, s, d), (st[2], st[0], st[3], st[4]), picked._offset + part * st[1])
    kv = _slice_fn(1, 0, length, 1)(reshape_nograd(kv, (hkv, nb * s, d)))
    return reshape_nograd(contiguous_nograd(kv), (1, hkv, length, d))


def paged_attention_decomp(q: Tensor, cache: Tensor, block_table: Tensor, lengths: Tensor, scale: float) -> Tensor:
    """Per row b: gather its blocks into contiguous k, v [1, Hkv, lengths[b], D], then causal attention.

    NOTE [paged attention]. Arguments as the kernel gets them (checked by the frontend).
    """
    b, h, t, d = q.shape
    s = cache.shape[3]
    out = empty((b, h, t, d), q.dtype, q.device)
    if out.numel() == 0:
        return out
    lens = lengths._host()
    bts = block_table._strides
    copy = _dispatch.kernel(q.device.type, "copy")
    for r in range(b):
        n = int(lens[r])
        nb = -(-n // s)
        ids = make_view(block_table, (nb,), (bts[1],), block_table._offset + r * bts[0])
        k, v = _row_blocks(cache, ids, 0, n), _row_blocks(cache, ids, 1, n)
        row = _slice_fn(0, r, r + 1, 1)
        copy(row(out), _attention_nograd(row(q), k, v, scale, True))
    return out


def cross_entropy_decomp(logits: Tensor, target: Tensor, ignore_index: int, smoothing: float) -> Tensor:
    from ._indexing import Gather
    from ._reduce import Where_nograd

    logp = log_softmax_decomp(logits, 1)
    keep = binary("ne", target, ignore_index)
    safe = Where_nograd(keep, target, 0)
    nll = unary(
        "neg",
        reshape_nograd(Gather.forward(_Nop(), logp, 1, reshape_nograd(safe, (target.shape[0], 1))), (target.shape[0],)),
    )
    if smoothing:
        mean_logp = binary("div", reduce_op("sum", logp, (1,), False, logp.dtype), float(logits.shape[1]))
        nll = binary("sub", binary("mul", nll, 1 - smoothing), binary("mul", mean_logp, smoothing))
    return Where_nograd(keep, nll, 0.0)


class _Nop:
    def save_for_backward(self, *a: Any) -> None:
        pass


def embedding_decomp(weight: Tensor, ids: Tensor) -> Tensor:
    from ._indexing import IndexSelect

    flat = reshape_nograd(contiguous_nograd(ids), (ids.numel(),))
    return reshape_nograd(IndexSelect.forward(_Nop(), weight, 0, flat), ids.shape + (weight.shape[1],))


def topk_decomp(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    values = empty(x.shape, x.dtype, x.device)
    indices = empty(x.shape, dt.int64, x.device)
    _dispatch.kernel(x.device.type, "sort")(values, indices, x, x.ndim - 1, True)
    from ._views import _slice_fn

    f = _slice_fn(x.ndim - 1, 0, k, 1)
    return contiguous_nograd(f(values)), contiguous_nograd(f(indices))


decompositions: dict[str, Any] = {
    "softmax": softmax_decomp,
    "log_softmax": log_softmax_decomp,
    "gelu": gelu_decomp,
    "gelu_backward": gelu_backward_decomp,
    "layer_norm": layer_norm_decomp,
    "linear": linear_decomp,
    "attention": attention_decomp,
    "paged_attention": paged_attention_decomp,
    "cross_entropy": cross_entropy_decomp,
    "embedding": embedding_decomp,
    "topk": topk_decomp,
}


# -- the ops ------------------------------------------------------------------------------


class Softmax(Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, dim: int) -> Tensor:
        k = _dispatch.fused_kernel(x.device.type, "softmax")
        if k is not None:
            out = empty(x.shape, x.dtype, x.device)
            if out.numel():  # kernels never see empty inputs (a max over no elements is undefined)
                k(out, x, dim)
        else:
            out = softmax_decomp(x, dim)
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
        k = _dispatch.fused_kernel(x.device.type, "log_softmax")
        if k is not None:
            out = empty(x.shape, x.dtype, x.device)
            if out.numel():
                k(out, x, dim)
        else:
            out = log_softmax_decomp(x, dim)
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
        k = _dispatch.fused_kernel(x.device.type, "gelu")
        if k is not None:
            out = empty(x.shape, x.dtype, x.device)
            k(out, x, approximate)
        else:
            out = gelu_decomp(x, approximate)
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
        n = _prod(x.shape[:-1])
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


class CrossEntropy(Function):
    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, target: Tensor, ignore_index: int, smoothing: float, all_kept: bool = False
    ) -> Tensor:
        k = _dispatch.fused_kernel(logits.device.type, "cross_entropy")
        if k is not None:
            losses = empty((logits.shape[0],), logits.dtype, logits.device)
            k(losses, logits, target, ignore_index, smoothing)
        else:
            losses = cross_entropy_decomp(logits, target, ignore_index, smoothing)
        ctx.save_for_backward(logits, target)
        ctx.ignore_index, ctx.smoothing, ctx.all_kept = ignore_index, smoothing, all_kept
        return losses

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        # d loss_i / d logits_i = softmax_i - ((1 - s) * onehot(target_i) + s / C), rows of ignored targets 0
        logits, target = ctx.saved_tensors
        n, c = logits.shape
        s = ctx.smoothing
        d = Softmax.forward(_Nop(), logits, 1)
        if s:
            d = binary("sub", d, s / c)
        keep = None
        if not ctx.all_kept:
            keep = reshape_nograd(binary("ne", target, ctx.ignore_index), (n, 1))
            target = Where_nograd(keep, reshape_nograd(target, (n, 1)), 0)
        src = expand_to(scalar_tensor(s - 1.0, d.dtype, d.device), (n, 1))
        scatter_add_nograd(d, 1, reshape_nograd(target, (n, 1)), src)
        if keep is not None:
            d = Where_nograd(keep, d, 0.0)
        return binary("mul", d, reshape_nograd(g, (n, 1))), None, None, None, None


def cross_entropy(
    logits: Tensor, target: Tensor, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean"
) -> Tensor:
    """The cross-entropy loss of ``logits`` [N, C] against integer class ids ``target`` [N], as
    ``torch.nn.functional.cross_entropy``: ``-log_softmax(logits)[n, target[n]]`` per row, mixed with
    the mean over the classes by ``label_smoothing``; rows whose target is ``ignore_index`` count 0 and
    are left out of the mean. ``reduction`` "mean" (over the rows not ignored), "sum" or "none" ([N]).
    Differentiable in ``logits``.
    """
    _float(logits, "cross_entropy")
    if reduction not in ("mean", "sum", "none"):
        raise DTypeError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not isinstance(target, Tensor) or target.dtype.category != 1:
        raise DTypeError(
            f"cross_entropy: target must be an integer tensor of class ids, got "
            f"{getattr(target, 'dtype', type(target))!r}"
        )
    if logits.ndim != 2 or target.shape != (logits.shape[0],):
        raise ShapeError(
            f"cross_entropy: expected logits [N, C] and target [N], got {list(logits.shape)} and "
            f"{list(getattr(target, 'shape', ()))}"
        )
    if not 0.0 <= label_smoothing <= 1.0:
        raise DTypeError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    check_device("cross_entropy", logits, target)
    target = cast(target, dt.int64)
    # The targets are checked on the host: they are small ([N] ids), and on CPU this is a view, not a copy.
    ids = target._host()
    kept = ids != ignore_index
    bad = kept & ((ids < 0) | (ids >= logits.shape[1]))
    if bad.any():
        raise IndexError_(f"cross_entropy: target {int(ids[bad][0])} is out of range for {logits.shape[1]} classes")
    count = int(kept.sum())
    losses = CrossEntropy.apply(logits, target, int(ignore_index), float(label_smoothing), count == len(ids))
    if reduction == "none":
        return losses  # type: ignore[no-any-return]
    total = Sum.apply(losses)
    if reduction == "sum":
        return total  # type: ignore[no-any-return]
    return Div.apply(total, float(count) if count else float("nan"))  # type: ignore[no-any-return]


class Attention(Function):
    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: Tensor | None
    ) -> Tensor:
        kern = _dispatch.fused_kernel(q.device.type, "attention")
        if kern is not None:
            out = empty(q.shape[:-1] + (v.shape[-1],), q.dtype, q.device)
            kern(out, q, k, v, scale, causal, lengths)
        else:
            out = attention_decomp(q, k, v, scale, causal, lengths)
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.causal, ctx.lengths = scale, causal, lengths
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> Any:
        q, k, v = ctx.saved_tensors
        # recompute probabilities (flash-attention style: nothing big saved); grouped-query heads
        # are stacked on the rows of their kv head, so dk/dv come out summed over each group
        b, h, tq, _ = q.shape
        hkv, tk = k.shape[1], k.shape[-2]
        qg = _group_queries(q, hkv)
        if hkv != h:
            g = reshape_nograd(contiguous_nograd(g), (b, hkv, (h // hkv) * tq, g.shape[-1]))
        s = binary("mul", _mm(qg, _t(k)), ctx.scale)
        from ._reduce import Where_nograd

        if ctx.causal or ctx.lengths is not None:
            masked = _attention_mask(tq, tk, h // hkv if hkv else 1, ctx.causal, ctx.lengths, q.device)
            assert masked is not None
            s = Where_nograd(expand_to(masked, s.shape), float("-inf"), s)
        p = softmax_decomp(s, s.ndim - 1)
        p = Where_nograd(binary("ne", p, p), 0.0, p)  # fully masked rows
        dv = _mm(_t(p), g)
        dp = _mm(g, _t(v))
        ds = binary("mul", p, binary("sub", dp, reduce_op("sum", binary("mul", dp, p), (p.ndim - 1,), True, p.dtype)))
        ds = binary("mul", ds, ctx.scale)
        dq = _mm(ds, k)
        dk = _mm(_t(ds), qg)
        if hkv != h:
            dq = reshape_nograd(dq, q.shape)
        return (sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape), None, None, None)


def attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: float | None = None, lengths: Tensor | None = None
) -> Tensor:
    """Scaled dot-product attention over q [B,H,Tq,D], k/v [B,Hkv,Tk,D].

    causal aligns the last query with the last key, so a query block appended to a
    KV cache attends to all earlier keys. lengths [B] limits each row's keys.
    Grouped-query attention: with Hkv < H (H % Hkv == 0), query head h reads key/value
    head h // (H // Hkv), as PyTorch's ``enable_gqa=True`` and Hugging Face's ``repeat_kv``;
    K/V are never repeated in memory.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _float(t, f"scaled_dot_product_attention {name}")
        if t.ndim != 4:
            raise ShapeError(f"scaled_dot_product_attention: {name} must be [B, H, T, D], got {list(t.shape)}")
    if k.shape[0] != q.shape[0] or v.shape[:3] != k.shape[:3] or k.shape[-1] != q.shape[-1]:
        raise ShapeError(
            f"scaled_dot_product_attention: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} do not fit"
        )
    if (q.shape[1] % k.shape[1] if k.shape[1] else q.shape[1]) != 0:
        raise ShapeError(
            f"scaled_dot_product_attention: the {q.shape[1]} query heads of q {list(q.shape)} are not a multiple of "
            f"the {k.shape[1]} key/value heads of k {list(k.shape)} (grouped-query attention needs H % Hkv == 0)"
        )
    if causal and q.shape[-2] > k.shape[-2]:
        raise ShapeError(
            f"scaled_dot_product_attention: causal with more queries ({q.shape[-2]}) than keys ({k.shape[-2]})"
        )
    check_device("scaled_dot_product_attention", q, k, v, lengths)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if lengths is not None:
        lengths = cast(lengths, dt.int64)
    return Attention.apply(q, k, v, sc, bool(causal), lengths)  # type: ignore[no-any-return]


def _int64(op: str, name: str, t: Any) -> Tensor:
    """t as int64 after checking that it is an integer tensor."""
    if not isinstance(t, Tensor) or t.dtype.category != 1:
        raise DTypeError(f"{op}: {name} must be an int64 tensor, got {getattr(t, 'dtype', type(t).__name__)!r}")
    return t if t.dtype is dt.int64 else cast(t, dt.int64)


def paged_attention(
    q: Tensor, cache: Tensor, block_table: Tensor, lengths: Tensor, *, scale: float | None = None
) -> Tensor:
    """Causal attention of q [B, H, T, D] over a paged KV cache (NOTE [paged attention]); no autograd.

    cache [NB, 2, Hkv, S, D] (q's dtype) is one layer's pool of NB blocks of S positions:
    ``cache[n, 0]`` holds block n's keys [Hkv, S, D], ``cache[n, 1]`` its values.
    block_table (integer [B, M]) lists, per row, the blocks of its positions in order:
    position p of row b is slot ``p % S`` of block ``block_table[b, p // S]``; entries from
    ``ceil(lengths[b] / S)`` on are ignored. lengths (integer [B]) counts the positions row
    b attends to, this step's T new ones included (already written into their blocks), so
    T <= lengths[b] <= M*S; query t of row b sits at position ``lengths[b] - T + t`` and
    attends keys 0 .. lengths[b] - T + t. Grouped-query: H % Hkv == 0, query head h reads kv
    head h // (H // Hkv). scale defaults to 1/sqrt(D). Returns [B, H, T, D] in q's dtype,
    computed as :func:`attention` computes (float32 arithmetic, float64 for float64). The
    result has no ``grad_fn`` (inference only), like :func:`dequantize`'s.
    """
    op = "paged_attention"
    _float(q, f"{op}: q")
    _float(cache, f"{op}: cache")
    if q.ndim != 4:
        raise ShapeError(f"{op}: q must be [B, H, T, D], got shape {list(q.shape)}")
    b, h, t, d = q.shape
    if cache.ndim != 5 or cache.shape[1] != 2 or cache.shape[4] != d or cache.shape[2] == 0 or cache.shape[3] == 0:
        raise ShapeError(
            f"{op}: cache must be [NB, 2, Hkv, S, D] with Hkv >= 1, S >= 1 and q's D = {d}, got shape "
            f"{list(cache.shape)} (q {list(q.shape)})"
        )
    if cache.dtype is not q.dtype:
        raise DTypeError(f"{op}: cache must have q's dtype {q.dtype!r}, got {cache.dtype!r}")
    nblocks, _, hkv, s, _ = cache.shape
    if h % hkv:
        raise ShapeError(
            f"{op}: the {h} query heads of q {list(q.shape)} are not a multiple of the {hkv} key/value heads of "
            f"cache {list(cache.shape)} (grouped-query attention needs H % Hkv == 0)"
        )
    block_table = _int64(op, "block_table", block_table)
    lengths = _int64(op, "lengths", lengths)
    if block_table.ndim != 2 or block_table.shape[0] != b:
        raise ShapeError(f"{op}: block_table must be [B, M] = [{b}, M], got shape {list(block_table.shape)}")
    if lengths.shape != (b,):
        raise ShapeError(f"{op}: lengths must be [B] = [{b}], got shape {list(lengths.shape)}")
    m = block_table.shape[1]
    dev = check_device(op, q, cache, block_table, lengths)
    lens = lengths._host()
    table = block_table._host()
    for r in range(b):
        n = int(lens[r])
        if not t <= n <= m * s:
            raise ShapeError(
                f"{op}: lengths[{r}] = {n} is out of range: expected T <= lengths[b] <= M*S, i.e. "
                f"{t} <= {n} <= {m}*{s} = {m * s} (q {list(q.shape)}, block_table {list(block_table.shape)}, "
                f"block size {s})"
            )
        used = table[r, : -(-n // s)]
        bad = (used < 0) | (used >= nblocks)
        if bad.any():
            j = int(bad.argmax())
            raise IndexError_(
                f"{op}: block_table[{r}, {j}] = {int(used[j])} is not a block of the cache's {nblocks} "
                f"(expected 0 <= id < {nblocks} for the {len(used)} block(s) holding row {r}'s {n} positions)"
            )
    sc = (1.0 / math.sqrt(d) if d else 1.0) if scale is None else float(scale)
    kern = _dispatch.fused_kernel(dev.type, op)
    if kern is None:
        return paged_attention_decomp(q, cache, block_table, lengths, sc)
    out = empty((b, h, t, d), q.dtype, dev)
    if out.numel():
        kern(out, q, cache, block_table, lengths, sc)
    return out


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values along the last dim, and their indices (no autograd through indices)."""
    if not isinstance(x, Tensor) or x.ndim == 0:
        raise ShapeError("topk: expected a tensor with at least one dimension")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= x.shape[-1]:
        raise ShapeError(f"topk: k={k!r} is out of range for a last dimension of size {x.shape[-1]}")
    kern = _dispatch.fused_kernel(x.device.type, "topk")
    if kern is not None:
        values = empty(x.shape[:-1] + (k,), x.dtype, x.device)
        indices = empty(x.shape[:-1] + (k,), dt.int64, x.device)
        if values.numel():
            kern(values, indices, x, k)
    else:
        values, indices = topk_decomp(x, k)
    if x.requires_grad:
        from ._indexing import gather

        values = gather(x, -1, indices)
    return values, indices


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
