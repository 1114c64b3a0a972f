"""Fused ops written as plain NumPy math: the readable definition of each kernel (the Llama and Gemma ops included)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import bf16_bits_to_f32, f32_to_bf16_bits, rd, wr

__all__ = ["KERNELS"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def linear(out: Any, x: Any, weight: Any, bias: Any) -> None:
    y = np.matmul(rd(x), rd(weight).T)
    wr(out, y if bias is None else y + rd(bias))


def gelu(out: Any, x: Any, approximate: str) -> None:
    v = rd(x)
    if approximate == "tanh":
        wr(out, 0.5 * v * (1.0 + np.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v))))
    else:
        wr(out, 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)).astype(v.dtype)))


def gelu_backward(grad_in: Any, grad_out: Any, x: Any, approximate: str) -> None:
    v = rd(x).astype(np.float64)
    g = rd(grad_out)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)
        t = np.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * v * v)
    else:
        cdf = 0.5 * (1 + _erf(v / math.sqrt(2.0)))
        d = cdf + v * np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
    wr(grad_in, g * d)


def softmax(out: Any, x: Any, dim: int) -> None:
    v = rd(x)
    e = np.exp(v - np.max(v, axis=dim, keepdims=True))
    wr(out, e / np.sum(e, axis=dim, keepdims=True))


def log_softmax(out: Any, x: Any, dim: int) -> None:
    v = rd(x)
    s = v - np.max(v, axis=dim, keepdims=True)
    wr(out, s - np.log(np.sum(np.exp(s), axis=dim, keepdims=True)))


def layer_norm(out: Any, mean: Any, rstd: Any, x: Any, weight: Any, bias: Any, eps: float) -> None:
    v = rd(x)
    mu = v.mean(axis=-1, keepdims=True)
    var = ((v - mu) ** 2).mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(var + eps)
    y = (v - mu) * r
    if weight is not None:
        y = y * rd(weight)
    if bias is not None:
        y = y + rd(bias)
    wr(out, y)
    wr(mean, mu[..., 0])
    wr(rstd, r[..., 0])


def layer_norm_backward(
    dx: Any, dweight: Any, dbias: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any
) -> None:
    v = rd(x)
    g = rd(grad)
    mu = rd(mean)[..., None]
    r = rd(rstd)[..., None]
    xhat = (v - mu) * r
    gw = g * rd(weight) if weight is not None else g
    c = v.shape[-1]
    dxv = r * (gw - gw.sum(axis=-1, keepdims=True) / c - xhat * (gw * xhat).sum(axis=-1, keepdims=True) / c)
    wr(dx, dxv)
    lead = tuple(range(v.ndim - 1))
    if dweight is not None:
        wr(dweight, (g * xhat).sum(axis=lead))
    if dbias is not None:
        wr(dbias, g.sum(axis=lead))


def embedding(out: Any, weight: Any, ids: Any) -> None:
    wr(out, rd(weight)[rd(ids)])


def cross_entropy(losses: Any, logits: Any, target: Any, ignore_index: int, label_smoothing: float) -> None:
    z = rd(logits).astype(np.float64)
    t = rd(target)
    s = z - z.max(axis=1, keepdims=True)
    logp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    keep = t != ignore_index
    safe = np.where(keep, t, 0)
    nll = -logp[np.arange(len(t)), safe]
    if label_smoothing:
        nll = (1 - label_smoothing) * nll - label_smoothing * logp.mean(axis=1)
    wr(losses, np.where(keep, nll, 0.0))


def _attend(
    qv: np.ndarray, kv: np.ndarray, vv: np.ndarray, scale: float, causal: bool, lens: Any, window: int = 0
) -> np.ndarray:
    """softmax(q k^T * scale, masked) v over arrays q [B,H,Tq,D], k/v [B,Hkv,Tk,D]: [B, H, Tq, Dv].

    ``window`` > 0 also masks the keys at or before query position - window (NOTE [sliding window] in
    kael/ops/_attention_fused.py)."""
    b, h, tq, _ = qv.shape
    hkv, tk = kv.shape[1], kv.shape[-2]
    if tk == 0:  # no keys: every query attends to nothing (an empty sum), as the decomposition gives
        return np.zeros((b, h, tq, vv.shape[-1]), np.result_type(qv, vv))
    if hkv != h:  # grouped-query: q as [B, Hkv, g, Tq, D] against k/v [B, Hkv, 1, Tk, D] (broadcast, no repeat)
        qv = qv.reshape(b, hkv, h // hkv, tq, qv.shape[-1])
        kv, vv = kv[:, :, None], vv[:, :, None]
    s = np.matmul(qv, np.swapaxes(kv, -1, -2)) * scale  # [B, H, Tq, Tk] (or [B, Hkv, g, Tq, Tk])
    mask = np.zeros((tq, tk), dtype=bool)
    if causal:
        mask |= np.arange(tk)[None, :] > (np.arange(tq)[:, None] + (tk - tq))
    if window > 0:
        mask |= np.arange(tk)[None, :] <= (np.arange(tq)[:, None] + (tk - tq - window))
    full = np.broadcast_to(mask, s.shape).copy()
    if lens is not None:
        full |= (np.arange(tk)[None, :] >= lens[:, None]).reshape((b,) + (1,) * (s.ndim - 2) + (tk,))
    s = np.where(full, -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    den = e.sum(axis=-1, keepdims=True)
    p = e / np.where(den == 0, 1, den)
    out: np.ndarray = np.matmul(p, vv).reshape(b, h, tq, vv.shape[-1])
    return out


def attention(out: Any, q: Any, k: Any, v: Any, scale: float, causal: bool, lengths: Any, window: int = 0) -> None:
    if k.shape[-2] == 0:
        wr(out, 0)
        return
    wr(out, _attend(rd(q), rd(k), rd(v), scale, causal, rd(lengths) if lengths is not None else None, window))


def paged_attention(
    out: Any, q: Any, cache: Any, block_table: Any, lengths: Any, scale: float, window: int = 0
) -> None:
    """NOTE [paged attention] in kael/ops/_attention_fused.py: per row, gather its blocks, then causal attention.

    Each row runs alone through the very arithmetic of ``attention`` on its gathered
    contiguous keys, so a row's bits match ``attention(q[b:b+1], k, v, causal=True)`` and
    depend neither on the other rows nor on the block ids.
    """
    qv, cv, table, lens = rd(q), rd(cache), rd(block_table), rd(lengths)
    b, h, t, d = qv.shape
    _, _, hkv, s, _ = cv.shape
    res = np.empty((b, h, t, d), qv.dtype)
    for r in range(b):
        n = int(lens[r])
        blocks = cv[table[r, : -(-n // s)]]  # [nb, 2, Hkv, S, D] (a copy)
        k, v = (np.ascontiguousarray(blocks[:, i].transpose(1, 0, 2, 3).reshape(hkv, -1, d)[:, :n]) for i in (0, 1))
        res[r] = _attend(qv[r : r + 1], k[None], v[None], scale, True, None, window)[0]
    wr(out, res)


def _stat(x: np.ndarray) -> Any:
    return np.float64 if x.dtype == np.float64 else np.float32


def _round_to(x: Any, v: np.ndarray) -> np.ndarray:
    """v rounded to tensor x's dtype (bfloat16 through its bits), as float32/64 values."""
    if x.dtype.name == "bfloat16":
        return bf16_bits_to_f32(f32_to_bf16_bits(v.astype(np.float32)))
    return v.astype(x.dtype.np).astype(v.dtype)


def rms_norm(out: Any, rstd: Any, x: Any, weight: Any, eps: float) -> None:
    v = rd(x)
    st = _stat(v)
    xf = v.astype(st)
    n = xf.shape[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        r = 1.0 / np.sqrt((xf * xf).sum(axis=-1, keepdims=True, dtype=st) / st(n) + st(eps))
    y = _round_to(x, xf * r)  # Hugging Face rounds the normalised value to x's dtype before the weight
    if weight is not None:
        y = y * rd(weight).astype(st)
    wr(out, y)
    wr(rstd, r[..., 0])


def rope(out: Any, x: Any, cos: Any, sin: Any, positions: Any) -> None:
    c64 = np.float64 in (cos.dtype.np, x.dtype.np)
    ct = np.float64 if c64 else np.float32
    v = rd(x).astype(ct)  # [B, H, T, D]
    pos = rd(positions)  # [B, T]
    c = rd(cos).astype(ct)[pos][:, None]  # [B, 1, T, D/2]
    s = rd(sin).astype(ct)[pos][:, None]
    half = v.shape[-1] // 2
    x1, x2 = v[..., :half], v[..., half:]
    wr(out, np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1))


def silu_mul(out: Any, gate: Any, up: Any) -> None:
    g = rd(gate)
    ct = np.float64 if g.dtype == np.float64 else np.float32
    gv: np.ndarray = g.astype(ct)
    with np.errstate(over="ignore"):
        act = gv / (1 + np.exp(np.negative(gv)))
    if gate.dtype.itemsize == 2:  # silu rounded to the 16-bit dtype before the product, as silu then mul
        act = _round_to(gate, act)  # (and Hugging Face's act_fn(gate) * up) do
    wr(out, act * rd(up).astype(ct))


def gelu_tanh_mul(out: Any, gate: Any, up: Any) -> None:
    g = rd(gate)
    ct = np.float64 if g.dtype == np.float64 else np.float32
    gv: np.ndarray = g.astype(ct)
    act = 0.5 * gv * (1 + np.tanh(ct(_SQRT_2_OVER_PI) * (gv + ct(0.044715) * gv * gv * gv)))
    if gate.dtype.itemsize == 2:  # gelu rounded to the 16-bit dtype before the product, as gelu then mul do
        act = _round_to(gate, act)
    wr(out, act * rd(up).astype(ct))


def softcap(out: Any, x: Any, cap: float) -> None:
    v = rd(x)
    ct = np.float64 if v.dtype == np.float64 else np.float32
    c: Any = ct(cap)  # cap as the compute dtype's scalar (float32 for 16-bit x, as PyTorch's opmath)
    t: np.ndarray = v.astype(ct) / c
    if x.dtype.itemsize == 2:  # (x / cap).tanh() * cap: each of the three ops rounds to the 16-bit dtype
        t = _round_to(x, np.tanh(_round_to(x, t)))
    else:
        t = np.tanh(t)
    wr(out, t * c)


def topk(values: Any, indices: Any, x: Any, k: int) -> None:
    v = rd(x)
    n = v.shape[-1]
    order = np.flip(np.argsort(np.flip(v, -1), axis=-1, kind="stable"), -1)
    idx = (n - 1 - order)[..., :k]
    wr(indices, idx)
    wr(values, np.take_along_axis(v, idx, axis=-1))


def moe_route(weights: Any, experts: Any, logits: Any, k: int, normalize: bool) -> None:
    v = rd(logits)
    ct = np.float64 if v.dtype == np.float64 else np.float32
    z = v.astype(ct)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[..., :k]  # largest first, ties in index order
    w = np.take_along_axis(p, idx, axis=-1)
    if normalize:
        w = w / w.sum(axis=-1, keepdims=True)
    wr(experts, idx)
    wr(weights, w)


def expert_linear(out: Any, x: Any, weight: Any, experts: Any) -> None:
    xv, w, ex = rd(x), rd(weight), rd(experts)
    t, k, c = xv.shape
    flat, rows = ex.reshape(-1), xv.reshape(t * k, c)
    y = np.zeros((t * k, w.shape[1]), dtype=np.result_type(rows.dtype, w.dtype))
    order = np.argsort(flat, kind="stable")  # the assignments grouped by expert: each matrix read once
    ids, starts = np.unique(flat[order], return_index=True)
    for e, lo, hi in zip(ids, starts, [*starts[1:], len(flat)][: len(ids)], strict=True):
        sel = order[lo:hi]
        # one product per row ([m, 1, C] @ [C, N]: m gemvs), so a row rounds as it would alone whatever else
        # chose the expert (NOTE [batched = alone] in kael/models/_batched.py); a gemm of the m rows may not
        y[sel] = np.matmul(rows[sel][:, None, :], w[e].T)[:, 0]
    wr(out, y.reshape(t, k, w.shape[1]))


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
    p = rd(param).astype(np.float64)
    g = rd(grad)
    m = beta1 * rd(exp_avg) + (1 - beta1) * g
    v = beta2 * rd(exp_avg_sq) + (1 - beta2) * g * g
    wr(exp_avg, m)
    wr(exp_avg_sq, v)
    p = p * (1 - lr * weight_decay)
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    p = p - lr * (m / bc1) / (np.sqrt(v / bc2) + eps)
    wr(param, p)


KERNELS: dict[str, Callable[..., None]] = {
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
    "gelu_tanh_mul": gelu_tanh_mul,
    "softcap": softcap,
    "topk": topk,
    "adamw_step": adamw_step,
    "paged_attention": paged_attention,
    "moe_route": moe_route,
    "expert_linear": expert_linear,
}
