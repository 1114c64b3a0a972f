"""Fused ops for GPT-2 inference and training: the glue around the raw kernels.

Each op brings its operands into the layout its kernel wants (rows of the last dim,
C-contiguous, float32 or float64: 16-bit floats compute in float32), runs the kernel
from ``_raw_kernels`` (CUDA on a GPU, the NumPy twin under emulation) and writes the
result back, straight into the output when its layout and dtype already fit.
``linear`` and the matmuls of ``attention`` go to cuBLAS through ``xp.matmul``;
``embedding`` is one ``take``; ``topk`` is CuPy's stable sort (CUB radix sort).
The Llama family's ops: ``rms_norm`` (a row kernel; 16-bit inputs get the normalised value
rounded to their dtype before the weight, as Hugging Face does), ``rope`` (a row kernel
over [B*H*T, D]) and ``silu_mul`` (a pointwise kernel; 16-bit inputs run silu, rounded to
their dtype, then the product, as Hugging Face's ``act_fn(gate) * up``); grouped-query ``attention`` stacks
the query heads of each kv head on its rows, so K/V are never repeated. ``paged_attention`` is one raw
kernel over the block pool (keys and values read in place in their blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from kael.backends import dtypes as dt

from . import _raw_kernels as raw
from ._io import compute_dtype, distinct, f32_to_bf16_bits, rd, view, wr, writable_as
from ._xp import X, argsort, dense_view, errstate, quiet

__all__ = ["KERNELS"]


def _arr(t: Any, dtype: Any) -> Any:
    """t's values as a C-contiguous xp array of dtype (no copy when already so)."""
    return X.xp.ascontiguousarray(rd(t), dtype=dtype)


def _fits(out: Any, dtype: Any, *inputs: Any) -> bool:
    """May a kernel computing in dtype write straight into out's memory, as a C-contiguous array?"""
    return out.is_contiguous() and writable_as(out, dtype, *inputs)


def _dst(out: Any, dtype: Any, shape: tuple[int, ...], *inputs: Any) -> tuple[Any, bool]:
    """(an array of `shape` to compute out's values into, whether it is out's own memory)."""
    if _fits(out, dtype, *inputs):
        return dense_view(out, shape), True
    return X.xp.empty(shape, dtype), False


def _finish(out: Any, result: Any, direct: bool) -> None:
    """Write result (of any shape with out's size) into out unless the kernel already wrote there."""
    if not direct:
        wr(out, result.reshape(out.shape))


def linear(out: Any, x: Any, weight: Any, bias: Any) -> None:
    xp = X.xp
    xv, wv = rd(x), rd(weight)
    fits = (
        _fits(out, xv.dtype, x, weight, bias)
        and xv.dtype == wv.dtype
        and xv.dtype in (np.float32, np.float64, np.float16)
    )
    if fits and xv.ndim >= 1 and out.numel():
        # one GEMM over all leading dims: [N, I] @ [I, O] -> [N, O], written into out
        o2 = dense_view(out, (out.numel() // out.shape[-1], out.shape[-1]))
        xp.matmul(xv.reshape(-1, xv.shape[-1]), wv.T, out=o2)
        if bias is not None:
            xp.add(o2, rd(bias), out=o2)
        return
    y = xp.matmul(xv, wv.T)
    wr(out, y if bias is None else y + rd(bias))


def gelu(out: Any, x: Any, approximate: str) -> None:
    cd = compute_dtype(x)
    xv = rd(x).astype(cd, copy=False)
    dst, direct = _dst(out, cd, out.shape, x)
    if out.numel():
        raw.gelu(xv, dst, approximate == "tanh")
    _finish(out, dst, direct)


def gelu_backward(grad_in: Any, grad_out: Any, x: Any, approximate: str) -> None:
    cd = compute_dtype(x, grad_out)
    gv = rd(grad_out).astype(cd, copy=False)
    xv = rd(x).astype(cd, copy=False)
    dst, direct = _dst(grad_in, cd, grad_in.shape, grad_out, x)
    if grad_in.numel():
        raw.gelu_backward(gv, xv, dst, approximate == "tanh")
    _finish(grad_in, dst, direct)


def _rows(x: Any, dim: int, dtype: Any) -> tuple[Any, tuple[int, ...]]:
    """x with `dim` moved last, as C-contiguous [rows, n] of dtype, and that moved shape."""
    xp = X.xp
    v = rd(x)
    if v.ndim == 0:
        v = v.reshape(1)
        dim = 0
    moved = xp.moveaxis(v, dim, -1)
    return xp.ascontiguousarray(moved, dtype=dtype).reshape(-1, moved.shape[-1]), tuple(moved.shape)


def _softmax(out: Any, x: Any, dim: int, log: bool) -> None:
    xp = X.xp
    if out.numel() == 0:
        return
    cd = compute_dtype(x)
    rows, moved = _rows(x, dim, cd)
    last = x.ndim == 0 or dim in (-1, x.ndim - 1)
    if last and _fits(out, cd, x):
        raw.softmax_rows(rows, dense_view(out, rows.shape), log)
        return
    y = xp.empty_like(rows)
    raw.softmax_rows(rows, y, log)
    y = y.reshape(moved)
    wr(out, y.reshape(out.shape) if x.ndim == 0 else xp.moveaxis(y, -1, dim))


def softmax(out: Any, x: Any, dim: int) -> None:
    _softmax(out, x, dim, log=False)


def log_softmax(out: Any, x: Any, dim: int) -> None:
    _softmax(out, x, dim, log=True)


def _layer_norm_half(out: Any, mean: Any, rstd: Any, x: Any, weight: Any, bias: Any, eps: float) -> None:
    """float16: the reference's arithmetic, rounded to float16 after each op as the reference does."""
    xp = X.xp
    v = rd(x)
    mu = v.mean(axis=-1, keepdims=True)
    var = ((v - mu) ** 2).mean(axis=-1, keepdims=True)
    r = 1.0 / xp.sqrt(var + eps)
    y = (v - mu) * r
    if weight is not None:
        y = y * rd(weight)
    if bias is not None:
        y = y + rd(bias)
    wr(out, y)
    wr(mean, mu[..., 0])
    wr(rstd, r[..., 0])


def layer_norm(out: Any, mean: Any, rstd: Any, x: Any, weight: Any, bias: Any, eps: float) -> None:
    if x.numel() == 0:
        return
    if x.dtype is dt.float16:
        with errstate():
            _layer_norm_half(out, mean, rstd, x, weight, bias, eps)
        return
    cd = compute_dtype(x)
    c = x.shape[-1]
    rows = _arr(x, cd).reshape(-1, c)
    w = _arr(weight, cd) if weight is not None else None
    b = _arr(bias, cd) if bias is not None else None
    y, y_direct = _dst(out, cd, rows.shape, x, weight, bias)
    mu, mu_direct = _dst(mean, cd, (rows.shape[0],), x)
    rs, rs_direct = _dst(rstd, cd, (rows.shape[0],), x)
    raw.layer_norm_rows(rows, w, b, y, mu, rs, eps)
    _finish(out, y, y_direct)
    _finish(mean, mu, mu_direct)
    _finish(rstd, rs, rs_direct)


def layer_norm_backward(
    dx: Any, dweight: Any, dbias: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any
) -> None:
    xp = X.xp
    cd = compute_dtype(x, grad)
    c = x.shape[-1] if x.ndim else 1
    if x.numel() == 0:
        if dweight is not None:
            wr(dweight, 0)
        if dbias is not None:
            wr(dbias, 0)
        return
    g = _arr(grad, cd).reshape(-1, c)
    xv = _arr(x, cd).reshape(-1, c)
    mu = _arr(mean, cd).reshape(-1)
    rs = _arr(rstd, cd).reshape(-1)
    w = _arr(weight, cd) if weight is not None else None
    d, direct = _dst(dx, cd, g.shape, grad, x, mean, rstd, weight)
    raw.layer_norm_backward_rows(g, xv, mu, rs, w, d)
    _finish(dx, d, direct)
    if dweight is not None:
        xhat = (xv - mu[:, None]) * rs[:, None]
        wr(dweight, xp.sum(g * xhat, axis=0))
    if dbias is not None:
        wr(dbias, xp.sum(g, axis=0))


def embedding(out: Any, weight: Any, ids: Any) -> None:
    xp = X.xp
    rows = xp.take(view(weight), view(ids).reshape(-1), axis=0)  # raw elements: bfloat16 bits copy as they are
    xp.copyto(view(out), rows.reshape(out.shape))


def cross_entropy(losses: Any, logits: Any, target: Any, ignore_index: int, label_smoothing: float) -> None:
    n = logits.shape[0]
    if n == 0:
        return
    cd = compute_dtype(logits)
    z = _arr(logits, cd)
    if logits.shape[1] == 0:
        wr(losses, float("nan"))
        return
    t = X.xp.ascontiguousarray(view(target), dtype=np.int64)
    dst, direct = _dst(losses, cd, (n,), logits, target)
    raw.cross_entropy_rows(z, t, dst, int(ignore_index), float(label_smoothing))
    _finish(losses, dst, direct)


def _attend_half(qv: Any, kv: Any, vv: Any, scale: float, causal: bool, lens: Any, window: int = 0) -> Any:
    """float16: the reference's arithmetic (matmuls and softmax in float16) over xp arrays, [B, H, Tq, Dv]."""
    xp = X.xp
    b, h, tq, _ = qv.shape
    hkv, tk = kv.shape[1], kv.shape[-2]
    if hkv != h:  # grouped-query: q [B, Hkv, g, Tq, D] against k/v [B, Hkv, 1, Tk, D] (broadcast, no repeat)
        qv = qv.reshape(b, hkv, h // hkv, tq, qv.shape[-1])
        kv, vv = kv[:, :, None], vv[:, :, None]
    s = xp.matmul(qv, xp.swapaxes(kv, -1, -2)) * scale
    mask = xp.zeros((tq, tk), dtype=bool)
    if causal:
        mask |= xp.arange(tk)[None, :] > (xp.arange(tq)[:, None] + (tk - tq))
    if window > 0:  # NOTE [sliding window] in kael/ops/_attention_fused.py
        mask |= xp.arange(tk)[None, :] <= (xp.arange(tq)[:, None] + (tk - tq - window))
    full = xp.broadcast_to(mask, s.shape)
    if lens is not None:
        full = full | (xp.arange(tk)[None, :] >= lens[:, None]).reshape((b,) + (1,) * (s.ndim - 2) + (tk,))
    s = xp.where(full, -xp.inf, s)
    m = s.max(axis=-1, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = xp.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    return xp.matmul(e / xp.where(den == 0, 1, den), vv).reshape(b, h, tq, vv.shape[-1])


def _attention_half(
    out: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, lengths: Any, window: int = 0
) -> None:
    """float16: the reference's arithmetic (matmuls and softmax in float16), composed of xp ops."""
    lens = rd(lengths) if lengths is not None else None
    wr(out, _attend_half(rd(q), rd(k), rd(v), scale, causal, lens, window))


def attention(out: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, lengths: Any, window: int = 0) -> None:
    xp = X.xp
    if out.numel() == 0:
        return
    if q.dtype is dt.float16:
        with errstate():
            _attention_half(out, q, k, v, scale, causal, lengths, window)
        return
    cd = compute_dtype(q, k, v)
    qv = rd(q).astype(cd, copy=False)
    kv = rd(k).astype(cd, copy=False)
    vv = rd(v).astype(cd, copy=False)
    b, h, tq, d = qv.shape
    hkv, tk = kv.shape[1], kv.shape[-2]
    if tk == 0:
        wr(out, 0)
        return
    # grouped-query: the g = H/Hkv query heads of kv head j stacked on its rows, [B, Hkv, g*Tq, D]; one
    # cuBLAS batch per kv head then serves its whole group, and the scores [B, Hkv, g*Tq, Tk] are the
    # [B, H, Tq, Tk] scores in memory (query head h = j*g + i), so the masked softmax runs unchanged
    grouped = (b, hkv, (h // hkv) * tq) if hkv != h else (b, h, tq)
    if hkv != h:
        qv = qv.reshape(grouped + (d,))
    scores = xp.ascontiguousarray(xp.matmul(qv, xp.swapaxes(kv, -1, -2)))  # via cuBLAS
    lens = xp.ascontiguousarray(view(lengths), dtype=np.int64) if lengths is not None else None
    raw.attention_softmax(scores.reshape(b, h, tq, tk), lens, h, tq, float(scale), bool(causal), int(window))
    if _fits(out, cd, q, k, v, lengths):
        xp.matmul(scores, vv, out=dense_view(out, grouped + (out.shape[-1],)))
    else:
        wr(out, xp.matmul(scores, vv).reshape(out.shape))


def paged_attention(
    out: Any, q: Any, cache: Any, block_table: Any, lengths: Any, scale: float, window: int = 0
) -> None:
    """NOTE [paged attention] in kael/ops/_attention_fused.py: one raw kernel reads every key and value in its block.

    16-bit pools compute in float32 (a float32 copy of the pool per call); float16 instead runs the
    reference's float16 arithmetic on each row's gathered keys, as ``attention`` does for float16.
    """
    xp = X.xp
    if out.numel() == 0:
        return
    table = xp.ascontiguousarray(view(block_table), dtype=np.int64)
    lens = xp.ascontiguousarray(view(lengths), dtype=np.int64)
    if q.dtype is dt.float16:
        qv, cv = rd(q), rd(cache)
        d, hkv, s = qv.shape[-1], cv.shape[2], cv.shape[3]
        rows = []
        with errstate():
            for r, n in enumerate(int(x) for x in lens.tolist()):
                picked = cv[table[r, : -(-n // s)]]  # [nb, 2, Hkv, S, D]
                k, v = (
                    xp.ascontiguousarray(picked[:, i].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n]) for i in (0, 1)
                )
                rows.append(_attend_half(qv[r : r + 1], k[None], v[None], scale, True, None, window))
            wr(out, xp.concatenate(rows))
        return
    cd = compute_dtype(q, cache)
    qv, cv = _arr(q, cd), _arr(cache, cd)
    y, direct = _dst(out, cd, out.shape, q, cache, block_table, lengths)
    raw.paged_attention_rows(qv, cv, table, lens, y, float(scale), int(window))
    _finish(out, y, direct)


def _round_to(t: Any, v: Any) -> Any:
    """float32 values v rounded to 16-bit tensor t's dtype (float16, bfloat16), as float32 again."""
    xp = X.xp
    if t.dtype is dt.bfloat16:
        return (f32_to_bf16_bits(v).astype(xp.uint32) << 16).view(xp.float32)
    return v.astype(xp.float16).astype(xp.float32)


def rms_norm(out: Any, rstd: Any, x: Any, weight: Any, eps: float) -> None:
    if x.numel() == 0:
        return
    cd = compute_dtype(x)
    c = x.shape[-1]
    rows = _arr(x, cd).reshape(-1, c)
    half = x.dtype.itemsize == 2
    w = _arr(weight, cd) if weight is not None else None
    y, y_direct = _dst(out, cd, rows.shape, x, weight)
    rs, rs_direct = _dst(rstd, cd, (rows.shape[0],), x)
    raw.rms_norm_rows(rows, None if half else w, y, rs, eps)
    if half:  # Hugging Face: (x * rstd).to(x.dtype) * weight, the product rounded once more on the write
        y = _round_to(x, y)
        if w is not None:
            y = y * w
    _finish(out, y, y_direct and not half)
    _finish(rstd, rs, rs_direct)


def rope(out: Any, x: Any, cos: Any, sin: Any, positions: Any) -> None:
    if out.numel() == 0:
        return
    cd = compute_dtype(x, cos, sin)
    xv = _arr(x, cd)
    c, s = _arr(cos, cd), _arr(sin, cd)
    pos = X.xp.ascontiguousarray(view(positions), dtype=np.int64)
    y, direct = _dst(out, cd, out.shape, x, cos, sin, positions)
    raw.rope_rows(xv, c, s, pos, y)
    _finish(out, y, direct)


def gated(
    out: Any, gate: Any, up: Any, act: Callable[[Any, Any], None], fused: Callable[[Any, Any, Any], None]
) -> None:
    """out = act(gate) * up (silu_mul, gelu_tanh_mul): ``fused(gate, up, y)``, the raw fused kernel; in a 16-bit
    dtype ``act(gate, a)`` into a buffer, rounded to the dtype before the product, as the activation then mul
    do."""
    if out.numel() == 0:
        return
    cd = compute_dtype(gate, up)
    gv = rd(gate).astype(cd, copy=False)
    uv = rd(up).astype(cd, copy=False)
    if gate.dtype.itemsize == 2:
        a = X.xp.empty(out.shape, cd)
        act(gv, a)
        wr(out, _round_to(gate, a) * uv)
        return
    y, direct = _dst(out, cd, out.shape, gate, up)
    fused(gv, uv, y)
    _finish(out, y, direct)


def silu_mul(out: Any, gate: Any, up: Any) -> None:
    gated(out, gate, up, lambda g, a: raw.pointwise("silu", g, a), raw.silu_mul)


def topk(values: Any, indices: Any, x: Any, k: int) -> None:
    xp = X.xp
    v = rd(x)
    n = v.shape[-1]
    order = xp.flip(argsort(xp.flip(v, -1), -1), -1)  # descending, ties lowest index first
    idx = (n - 1 - order)[..., :k]
    wr(indices, idx)
    wr(values, xp.take_along_axis(v, idx, axis=-1))


def adamw_step(
    param: Any,
    grad: Any,
    exp_avg: Any,
    exp_avg_sq: Any,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
) -> None:
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    ts = (param, grad, exp_avg, exp_avg_sq)
    same = all(t.dtype is param.dtype for t in ts) and param.dtype in (dt.float32, dt.float64)
    if param.numel() == 0:
        return
    if (
        same
        and distinct(param, grad, exp_avg, exp_avg_sq)
        and distinct(exp_avg, grad, exp_avg_sq)
        and distinct(exp_avg_sq, grad)
    ):
        raw.adamw(
            view(param),
            view(grad),
            view(exp_avg),
            view(exp_avg_sq),
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            float(weight_decay),
            float(bc1),
            float(bc2),
        )
        return
    cd = np.float64 if param.dtype is dt.float64 else np.float32
    p, g, m, v = (X.xp.array(rd(t), dtype=cd) for t in ts)  # copies: write back after the update
    raw.adamw(
        p, g, m, v, float(lr), float(beta1), float(beta2), float(eps), float(weight_decay), float(bc1), float(bc2)
    )
    wr(exp_avg, m)
    wr(exp_avg_sq, v)
    wr(param, p)


_PLAIN: dict[str, Callable[..., None]] = {
    "linear": linear,
    "gelu": gelu,
    "gelu_backward": gelu_backward,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "layer_norm": layer_norm,
    "layer_norm_backward": layer_norm_backward,
    "embedding": embedding,
    "cross_entropy": cross_entropy,
    "attention": attention,
    "rms_norm": rms_norm,
    "rope": rope,
    "silu_mul": silu_mul,
    "topk": topk,
    "adamw_step": adamw_step,
    "paged_attention": paged_attention,
}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
