"""Scaled dot-product attention and paged attention as fused ops (kernels when the backend has them).

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
attention kernel when it has one), with the same ``window``. Kernels keep two invariants the decomposition has by
construction: a row's bits never depend on the other rows of the batch, nor on which
block ids hold its keys. It is inference only, like ``dequantize``: the output has no
``grad_fn`` (a KV cache is data written by earlier steps, not a graph to differentiate).

NOTE [sliding window]
---------------------
``window`` W > 0 (with ``causal``) is sliding-window attention as transformers masks it
(Mistral, Gemma 2/3, Phi-3, Qwen2's ``use_sliding_window``): the query at position p sees
the keys at positions p - W + 1 .. p, W of them at most; 0 (None at the frontend) is no
window. Both ops' kernels take it as their last argument since backend API 1.4; a backend
of an older minor version runs the decomposition when a window is set (and is called
without the argument otherwise). The masked keys contribute exactly nothing: a kernel may
start a product at any key before the window (their probabilities are exact zeros), so a
row's bits still never depend on how the work is split.
"""

from __future__ import annotations

import math
from typing import Any

from .. import _dispatch
from .. import _dtype as dt
from .._errors import DTypeError, IndexError_, ShapeError
from .._tensor import Tensor
from ..autograd._function import Function
from ._core import cast, check_device, empty, expand_to
from ._fused import _float, decompositions, softmax_decomp
from ._linalg import _mm, _t
from ._pointwise import binary, sum_to, unary
from ._reduce import reduce_op
from ._views import _slice_fn, contiguous_nograd, make_view, reshape_nograd

__all__ = ["Attention", "attention", "attention_decomp", "paged_attention", "paged_attention_decomp", "takes_window"]


def _group_queries(q: Tensor, hkv: int) -> Tensor:
    """q [B,H,Tq,D] as [B,Hkv,g*Tq,D] (g = H // Hkv): the g query heads of kv head j stacked on its rows.

    Query head h = j*g + i reads kv head j = h // g (Hugging Face's ``repeat_kv`` order), so
    one matmul per kv head serves its whole group and K/V are never repeated. A view when
    q's (H, Tq) dims are contiguous (always when Tq == 1), a copy of q otherwise.
    """
    b, h, tq, d = q.shape
    return q if hkv == h else reshape_nograd(q, (b, hkv, (h // hkv) * tq, d))


def _attention_mask(
    tq: int, tk: int, group: int, causal: bool, lengths: Tensor | None, device: Any, window: int = 0
) -> Tensor | None:
    """True where a score is masked, broadcastable to the scores [B, Hkv, group*Tq, Tk] (None: nothing masked)."""
    from ._creation import arange

    qi = reshape_nograd(arange(group * tq, device=device), (group * tq, 1))
    if group != 1:
        qi = binary("remainder", qi, tq)  # row r of a grouped block is query r % Tq
    ki = reshape_nograd(arange(tk, device=device), (1, tk))
    masked: Tensor | None = binary("gt", ki, binary("add", qi, tk - tq)) if causal else None
    if window > 0:  # NOTE [sliding window]: key j is out of query i's window when j <= i + (Tk - Tq) - W
        early = binary("le", ki, binary("add", qi, tk - tq - window))
        masked = early if masked is None else binary("logical_or", masked, early)
    if lengths is not None:
        lm = binary("ge", reshape_nograd(ki, (1, 1, 1, tk)), reshape_nograd(lengths, (lengths.shape[0], 1, 1, 1)))
        masked = lm if masked is None else binary("logical_or", masked, lm)
    return masked


def attention_decomp(
    q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: Tensor | None, window: int = 0
) -> Tensor:
    b, h, tq, _ = q.shape
    hkv, tk = k.shape[1], k.shape[-2]
    qg = _group_queries(q, hkv)
    s = binary("mul", _mm(qg, _t(k)), scale)
    masked = _attention_mask(tq, tk, h // hkv if hkv else 1, causal, lengths, q.device, window)
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


def takes_window(device_type: str) -> bool:
    """Whether the backend serving ``device_type`` speaks API 1.4 or later: its attention kernels take a window."""
    major, _, minor = str(_dispatch.backend_for(device_type).api_version).partition(".")
    try:
        return (int(major), int(minor.split(".")[0] or 0)) >= (1, 4)
    except ValueError:
        return False


def _kernel(device_type: str, op: str, window: int) -> Any:
    """The backend's kernel for ``op`` when it can run ``window`` (NOTE [sliding window]), else None."""
    kern = _dispatch.fused_kernel(device_type, op)
    if kern is None or window == 0:
        return kern
    return kern if takes_window(device_type) else None


def _window_args(window: int) -> tuple[int, ...]:
    """The kernels' trailing window argument: only when one is set (so a backend of API 1.3 runs the rest)."""
    return (window,) if window else ()


def _attention_nograd(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, window: int = 0) -> Tensor:
    """attention(q, k, v) without autograd: the backend's fused kernel when it has one, else the decomposition."""
    kern = _kernel(q.device.type, "attention", window)
    if kern is None:
        return attention_decomp(q, k, v, scale, causal, None, window)
    out = empty(q.shape[:-1] + (v.shape[-1],), q.dtype, q.device)
    if out.numel():
        kern(out, q, k, v, scale, causal, None, *_window_args(window))
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


def paged_attention_decomp(
    q: Tensor, cache: Tensor, block_table: Tensor, lengths: Tensor, scale: float, window: int = 0
) -> Tensor:
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
        copy(row(out), _attention_nograd(row(q), k, v, scale, True, window))
    return out


class Attention(Function):
    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, lengths: Tensor | None, window: int
    ) -> Tensor:
        kern = _kernel(q.device.type, "attention", window)
        if kern is not None:
            out = empty(q.shape[:-1] + (v.shape[-1],), q.dtype, q.device)
            kern(out, q, k, v, scale, causal, lengths, *_window_args(window))
        else:
            out = attention_decomp(q, k, v, scale, causal, lengths, window)
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.causal, ctx.lengths, ctx.window = scale, causal, lengths, window
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
            masked = _attention_mask(tq, tk, h // hkv if hkv else 1, ctx.causal, ctx.lengths, q.device, ctx.window)
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
        return (sum_to(dq, q.shape), sum_to(dk, k.shape), sum_to(dv, v.shape), None, None, None, None)


def _check_window(op: str, window: int | None, causal: bool) -> int:
    """``window`` as the kernels take it (0: none), after checking it is a positive int with causal attention."""
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ShapeError(f"{op}: window must be a positive int (keys p-window+1..p) or None, got {window!r}")
    if not causal:
        raise ShapeError(f"{op}: a sliding window (window={window}) needs causal attention")
    return window


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool = False,
    scale: float | None = None,
    lengths: Tensor | None = None,
    window: int | None = None,
) -> Tensor:
    """Scaled dot-product attention over q [B,H,Tq,D], k/v [B,Hkv,Tk,D].

    causal aligns the last query with the last key, so a query block appended to a
    KV cache attends to all earlier keys. lengths [B] limits each row's keys. window
    (with causal) is a sliding window: the query at position p sees keys p-window+1..p
    only (NOTE [sliding window]).
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
    w = _check_window("scaled_dot_product_attention", window, bool(causal))
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if lengths is not None:
        lengths = cast(lengths, dt.int64)
    return Attention.apply(q, k, v, sc, bool(causal), lengths, w)  # type: ignore[no-any-return]


def _int64(op: str, name: str, t: Any) -> Tensor:
    """t as int64 after checking that it is an integer tensor."""
    if not isinstance(t, Tensor) or t.dtype.category != 1:
        raise DTypeError(f"{op}: {name} must be an int64 tensor, got {getattr(t, 'dtype', type(t).__name__)!r}")
    return t if t.dtype is dt.int64 else cast(t, dt.int64)


def paged_attention(
    q: Tensor,
    cache: Tensor,
    block_table: Tensor,
    lengths: Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
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
    head h // (H // Hkv). scale defaults to 1/sqrt(D). window: a sliding window, query t
    sees only the keys of its last ``window`` positions (NOTE [sliding window]). Returns [B, H, T, D] in q's dtype,
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
    w = _check_window(op, window, True)
    kern = _kernel(dev.type, op, w)
    if kern is None:
        return paged_attention_decomp(q, cache, block_table, lengths, sc, w)
    out = empty((b, h, t, d), q.dtype, dev)
    if out.numel():
        kern(out, q, cache, block_table, lengths, sc, *_window_args(w))
    return out


decompositions["attention"] = attention_decomp
decompositions["paged_attention"] = paged_attention_decomp
