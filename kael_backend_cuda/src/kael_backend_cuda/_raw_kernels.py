"""The fused CUDA kernels (CUDA C compiled by CuPy with NVRTC) and their NumPy twins.

On a GPU each launcher below runs a ``cupy.RawModule`` kernel (row-wise kernels: one
thread block per row, block-wide reductions with warp shuffles) or a
``cupy.ElementwiseKernel`` (pointwise kernels, which honour arbitrary strides).
Under emulation (NOTE [host emulation] in ``_xp``) the same launcher runs the NumPy
twin, which does the same arithmetic in the same dtype; twins are used only then.

The Llama family's kernels: ``rms_norm_rows`` (a row reduction like layer norm),
``rope_rows`` (one block per [b, h, t] row, a thread per rotated pair, the table rows
picked by the token's position) and the pointwise ``silu_mul``; the Gemma family's are the
pointwise ``gelu_tanh_mul`` and ``softcap``. Grouped-query attention needs no kernel of its own: the glue stacks each kv head's query heads on its rows, so
``attention_softmax`` runs unchanged on the [B, H, Tq, Tk] scores. ``paged_attention_rows``
is the whole of attention over a paged KV cache (one block per query row, reading each key
and value in place in its block; NOTE [paged attention] in ``kael/ops/_attention_fused.py``).

The CUDA C of the row-wise kernels is in ``_row_kernels_source.py``; the pointwise kernels
(``ElementwiseKernel`` sources, their launchers and twins: ``silu_mul``, ``gelu_tanh_mul``,
``softcap``, ``gelu``, ``gelu_backward``, ``adamw``, and ``pointwise(op, *inputs, out)`` for the elementwise
catalogue ops with a source, erf and silu, whose NumPy twin is the op's own definition,
``Pointwise.compute``) are in ``_pointwise_kernels.py``. Both are re-exported here.

Contract of every launcher: arrays are xp arrays of one float dtype (float32 or float64,
the kernel's ``T``); row-wise kernels take C-contiguous 2-D ``[rows, cols]`` arrays and
need rows >= 1 and cols >= 1 (the glue in ``_fused`` handles empty shapes); outputs are
preallocated and written in place (an output may be its input). Index arrays are int64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._pointwise_kernels import (
    ELEMENTWISE_SOURCES,
    adamw,
    erf,
    gelu,
    gelu_backward,
    gelu_tanh_mul,
    pointwise,
    silu_mul,
    softcap,
)
from ._row_kernels_source import ROW_KERNELS_SOURCE, row_kernel_names
from ._xp import X, state

__all__ = [
    "ROW_KERNELS_SOURCE",
    "ELEMENTWISE_SOURCES",
    "softmax_rows",
    "layer_norm_rows",
    "layer_norm_backward_rows",
    "cross_entropy_rows",
    "attention_softmax",
    "rms_norm_rows",
    "rope_rows",
    "paged_attention_rows",
    "silu_mul",
    "gelu_tanh_mul",
    "softcap",
    "gelu",
    "gelu_backward",
    "adamw",
    "erf",
    "pointwise",
    "row_kernel_names",
]

# --------------------------------------------------------------------------------------------------
# Compiled-kernel caches (GPU only).
# --------------------------------------------------------------------------------------------------
_module: Any = None


def _row_kernel(name: str, dtype: Any) -> Any:
    global _module
    if _module is None:
        cupy = state().cupy
        _module = cupy.RawModule(code=ROW_KERNELS_SOURCE, options=("--std=c++14",), name_expressions=row_kernel_names())
    return _module.get_function(f"{name}<{'double' if dtype == np.float64 else 'float'}>")


def _block(cols: int) -> int:
    """Threads per block for a row of `cols` elements: a multiple of 32, at most 1024."""
    n = 32
    while n < cols and n < 1024:
        n *= 2
    return n


def _launch(name: str, rows: int, cols: int, dtype: Any, args: tuple[Any, ...]) -> None:
    _row_kernel(name, dtype)((rows,), (_block(cols),), args)


def _scalar(dtype: Any, v: float) -> Any:
    return np.float64(v) if dtype == np.float64 else np.float32(v)


# --------------------------------------------------------------------------------------------------
# Launchers (GPU) and NumPy twins (emulation).
# --------------------------------------------------------------------------------------------------
def _nanmax(x: np.ndarray) -> np.ndarray:
    return np.max(x, axis=-1, keepdims=True)  # NumPy's max propagates NaN, like kael_max


def softmax_rows(x: Any, y: Any, log: bool) -> None:
    """y = softmax(x) (or log_softmax) along the last axis. x, y: [rows, cols]."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            m = _nanmax(x)
            s = np.sum(np.exp(x - m), axis=-1, keepdims=True)
            y[...] = (x - m) - np.log(s) if log else np.exp(x - m) / s
        return
    _launch("softmax_rows", rows, cols, x.dtype, (x, y, np.int32(cols), np.int32(log)))


def layer_norm_rows(x: Any, w: Any, b: Any, y: Any, mean: Any, rstd: Any, eps: float) -> None:
    """y = (x - mean) * rstd * w + b per row; also writes mean, rstd [rows]. w, b: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            mu = np.sum(x, axis=-1) / x.dtype.type(cols)
            d = x - mu[:, None]
            var = np.sum(d * d, axis=-1) / x.dtype.type(cols)
            r = x.dtype.type(1) / np.sqrt(var + x.dtype.type(eps))
            o = d * r[:, None]
            if w is not None:
                o = o * w
            if b is not None:
                o = o + b
            y[...] = o
            mean[...] = mu
            rstd[...] = r
        return
    _launch(
        "layer_norm_rows",
        rows,
        cols,
        x.dtype,
        (
            x,
            w if w is not None else x,
            b if b is not None else x,
            y,
            mean,
            rstd,
            np.int32(cols),
            _scalar(x.dtype, eps),
            np.int32(w is not None),
            np.int32(b is not None),
        ),
    )


def layer_norm_backward_rows(g: Any, x: Any, mean: Any, rstd: Any, w: Any, dx: Any) -> None:
    """dx of layer norm per row. g, x, dx: [rows, cols]; mean, rstd: [rows]; w: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            r = rstd[:, None]
            xhat = (x - mean[:, None]) * r
            gw = g * w if w is not None else g
            s1 = np.sum(gw, axis=-1, keepdims=True) / x.dtype.type(cols)
            s2 = np.sum(gw * xhat, axis=-1, keepdims=True) / x.dtype.type(cols)
            dx[...] = r * (gw - s1 - xhat * s2)
        return
    _launch(
        "layer_norm_backward_rows",
        rows,
        cols,
        x.dtype,
        (g, x, mean, rstd, w if w is not None else x, dx, np.int32(cols), np.int32(w is not None)),
    )


def cross_entropy_rows(logits: Any, target: Any, losses: Any, ignore_index: int, smoothing: float) -> None:
    """losses[r] = -log_softmax(logits[r])[target[r]] (label-smoothed), 0 where target == ignore_index."""
    rows, cols = logits.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            one = logits.dtype.type
            m = _nanmax(logits)
            lse = (m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True)))[:, 0]
            valid = (target >= 0) & (target < cols)
            picked = logits[np.arange(rows), np.where(valid, target, 0)]
            nll = np.where(valid, lse - picked, one(np.nan))
            if smoothing:
                s = one(smoothing)
                nll = (one(1) - s) * nll - s * (np.sum(logits, axis=-1) / one(cols) - lse)
            losses[...] = np.where(target == ignore_index, one(0), nll)
        return
    _launch(
        "cross_entropy_rows",
        rows,
        cols,
        logits.dtype,
        (logits, target, losses, np.int32(cols), np.int64(ignore_index), _scalar(logits.dtype, smoothing)),
    )


def attention_softmax(
    scores: Any, lengths: Any, heads: int, tq: int, scale: float, causal: bool, window: int = 0
) -> None:
    """In place on scores [B, H, Tq, Tk]: masked, scaled softmax over the keys (see the CUDA source)."""
    b, h, _, tk = scores.shape
    rows = b * h * tq
    if X.emulated:
        with np.errstate(all="ignore"):
            one = scores.dtype.type
            limit = np.full((b, 1, tq, 1), tk, dtype=np.int64)
            if causal:
                limit = np.minimum(limit, (np.arange(tq) + (tk - tq) + 1)[None, None, :, None])
            if lengths is not None:
                limit = np.minimum(limit, lengths[:, None, None, None])
            keep = np.arange(tk)[None, None, None, :] < limit
            if window > 0:
                first = (np.arange(tq) + (tk - tq) - window + 1)[None, None, :, None]
                keep &= np.arange(tk)[None, None, None, :] >= first
            s = np.where(keep, scores * one(scale), one(-np.inf))
            m = np.max(s, axis=-1, keepdims=True)
            e = np.where(keep, np.exp(s - m), one(0))
            den = np.sum(e, axis=-1, keepdims=True)
            scores[...] = np.where(keep, e / np.where(den == 0, one(1), den), one(0))
        return
    lens = lengths if lengths is not None else X.xp.zeros(1, np.int64)  # unread when has_lengths == 0
    _launch(
        "attention_softmax",
        rows,
        tk,
        scores.dtype,
        (
            scores,
            lens,
            np.int32(heads * tq),
            np.int32(tq),
            np.int32(tk),
            _scalar(scores.dtype, scale),
            np.int32(causal),
            np.int32(lengths is not None),
            np.int32(window),
        ),
    )


def rms_norm_rows(x: Any, w: Any, y: Any, rstd: Any, eps: float) -> None:
    """y = x * rstd (* w) per row, rstd [rows] = 1/sqrt(mean(x^2) + eps). x, y: [rows, cols]; w: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            one = x.dtype.type
            r = one(1) / np.sqrt(np.sum(x * x, axis=-1) / one(cols) + one(eps))
            o = x * r[:, None]
            y[...] = o * w if w is not None else o
            rstd[...] = r
        return
    _launch(
        "rms_norm_rows",
        rows,
        cols,
        x.dtype,
        (x, w if w is not None else x, y, rstd, np.int32(cols), _scalar(x.dtype, eps), np.int32(w is not None)),
    )


def rope_rows(x: Any, cos: Any, sin: Any, positions: Any, y: Any) -> None:
    """Rotate-half rotary embedding. x, y: C-contiguous [B, H, T, D]; cos, sin: [P, D/2]; positions: int64 [B, T]."""
    b, h, t, d = x.shape
    half = d // 2
    if X.emulated:
        c = cos[positions][:, None]  # [B, 1, T, D/2]
        s = sin[positions][:, None]
        x1, x2 = x[..., :half], x[..., half:]
        y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
        y[..., :half] = y1
        y[..., half:] = y2
        return
    _launch(
        "rope_rows", b * h * t, half, x.dtype, (x, cos, sin, positions, y, np.int32(h), np.int32(t), np.int32(half))
    )


def paged_attention_rows(q: Any, cache: Any, table: Any, lengths: Any, out: Any, scale: float, window: int = 0) -> None:
    """out [B, H, Tq, D] = causal attention of q [B, H, Tq, D] over the paged cache [NB, 2, Hkv, S, D].

    table int64 [B, M], lengths int64 [B] (checked by the frontend); see the CUDA source. The twin
    gathers each row's keys and values and runs the same arithmetic in q's dtype.
    """
    b, h, tq, d = q.shape
    hkv, s = cache.shape[2], cache.shape[3]
    m = table.shape[1]
    if X.emulated:
        one = q.dtype.type
        g = h // hkv
        with np.errstate(all="ignore"):
            for r in range(b):
                n = int(lengths[r])
                nb = -(-n // s)
                picked = cache[table[r, :nb]]  # [nb, 2, Hkv, S, D]
                k, v = (picked[:, part].transpose(1, 0, 2, 3).reshape(hkv, nb * s, d)[:, :n] for part in (0, 1))
                z = np.matmul(q[r].reshape(hkv, g * tq, d), k.transpose(0, 2, 1)) * one(scale)  # [Hkv, g*Tq, n]
                keep = np.arange(n)[None, :] <= (np.arange(tq) + (n - tq))[:, None]  # [Tq, n]
                if window > 0:
                    keep &= np.arange(n)[None, :] > (np.arange(tq) + (n - tq) - window)[:, None]
                keep = np.broadcast_to(keep[None, None], (hkv, g, tq, n)).reshape(hkv, g * tq, n)
                z = np.where(keep, z, one(-np.inf))
                e = np.where(keep, np.exp(z - np.max(z, axis=-1, keepdims=True)), one(0))
                p = e / np.sum(e, axis=-1, keepdims=True)
                out[r] = np.matmul(p, v).reshape(h, tq, d)
        return
    scratch = X.xp.empty((b * h * tq, m * s), q.dtype)
    _launch(
        "paged_attention_rows",
        b * h * tq,
        max(m * s, d),
        q.dtype,
        (
            q,
            cache,
            table,
            lengths,
            out,
            scratch,
            np.int32(h),
            np.int32(hkv),
            np.int32(tq),
            np.int32(d),
            np.int32(s),
            np.int32(m),
            _scalar(q.dtype, scale),
            np.int32(window),
        ),
    )
