"""ggml's iq4_nl and iq4_xs quantizers without an importance matrix, vectorized over blocks.

Both follow ``quantize_row_iq4_nl_impl`` with ``ntry = 7``, the search ``quantize_iq4_nl`` and
``quantize_iq4_xs`` run (what ``ggml_quantize_chunk`` and ``llama-quantize`` write; NOTE
[bit-exact K-quant search] for the float32 arithmetic). Per 32 values, weights x^2: start from
d = max / 127 (max the first value of largest magnitude), pick each value's nearest entry of
``KVALUES`` (``best_index_int8``: ties go up), take the weighted least-squares scale, then try
the 15 scales (itry - 127) / max, itry in -7..7, keeping one whose sum q*x squared over sum q^2
beats the best so far. iq4_nl stores that scale in float16 and re-picks the indices with it;
iq4_xs stores d = -max_scale / 32 (max_scale the sub-block scale of largest magnitude) and a
6-bit signed multiple of d per sub-block, re-picking the indices with each sub-block's d*l.
"""

from __future__ import annotations

import numpy as np

from ._iq4_grid import KVALUES
from ._kquants_search import F32, GROUP_MAX_EPS, by_chunks, first_largest, nearest_int

__all__ = ["quantize_iq4_nl", "quantize_iq4_xs", "best_index"]

_NTRY = 7


def best_index(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, values, x)`` elementwise: the nearest of the sorted `values` (ties up)."""
    vf = values.astype(F32)
    mu = np.clip(np.searchsorted(vf, x, side="right"), 1, len(vf) - 1)
    with np.errstate(invalid="ignore", over="ignore"):
        lower = (x - vf[mu - 1]).astype(F32) < (vf[mu] - x).astype(F32)
    idx = np.where(lower, mu - 1, mu)
    idx = np.where(x <= vf[0], 0, np.where(x >= vf[-1], len(vf) - 1, idx))
    out: np.ndarray = np.where(np.isnan(x), len(vf) - 1, idx).astype(np.int32)  # C's search ends at the top
    return out


def _mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        out: np.ndarray = (a * b).astype(F32)
    return out


def _sums(w: np.ndarray, q: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, in order: (sum of w*q*x, sum of w*q*q) with C's left-to-right products."""
    wq = _mul(w, q)
    tx, t2 = _mul(wq, x), _mul(wq, q)
    sqx, sq2 = np.zeros(x.shape[0], F32), np.zeros(x.shape[0], F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(x.shape[1]):
            sqx = (sqx + tx[:, j]).astype(F32)
            sq2 = (sq2 + t2[:, j]).astype(F32)
    return sqx, sq2


def _pick(values: np.ndarray, x: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """Indices best_index(values, inv * x) for rows of [m, 32] with per-row `inv` [m]."""
    return best_index(values, _mul(inv[:, None], x))


def _sub_block_scales(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The searched scale of every 32-value row of [m, 32] (0 for all-zero rows)."""
    amax, mx = first_largest(x)
    zero = amax < GROUP_MAX_EPS
    w = _mul(x, x)
    v0 = F32(values[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d0 = (-mx / v0).astype(F32)
        inv = (F32(1) / d0).astype(F32)
    q = values[_pick(values, x, inv)].astype(F32)
    sqx, sq2 = _sums(w, q, x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = np.where(sq2 > 0, sqx / sq2, F32(0)).astype(F32)
    best = _mul(d, sqx)
    for itry in range(-_NTRY, _NTRY + 1):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            inv = (F32(itry + int(values[0])) / mx).astype(F32)
        q = values[_pick(values, x, inv)].astype(F32)
        sqx, sq2 = _sums(w, q, x)
        better = (sq2 > 0) & (_mul(sqx, sqx) > _mul(best, sq2))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = np.where(better, sqx / sq2, d).astype(F32)
        best = np.where(better, _mul(d, sqx), best).astype(F32)
    out: np.ndarray = np.where(zero, F32(0), d).astype(F32)
    return out


def _pack(idx: np.ndarray) -> np.ndarray:
    """Indices [nb, 32*s] -> [nb, 16*s] bytes: per 32 values, byte j = index j | index j + 16 << 4."""
    q = idx.astype(np.uint8).reshape(idx.shape[0], -1, 2, 16)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(idx.shape[0], -1)


def _f16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(over="ignore"):
        h = v.astype("<f2")
    return h.view(np.uint8).reshape(-1, 2), h.astype(F32)


@by_chunks
def quantize_iq4_nl(x: np.ndarray, values: np.ndarray = KVALUES) -> np.ndarray:
    """Float32 blocks [nb, 32] -> iq4_nl blocks [nb, 18] (``quantize_iq4_nl`` without weights; `values` the 16 levels)."""
    scale = _sub_block_scales(x, values)
    d_bytes, _ = _f16(scale)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, F32(1) / scale, F32(0)).astype(F32)
    return np.concatenate([d_bytes, _pack(_pick(values, x, inv))], axis=1)


@by_chunks
def quantize_iq4_xs(x: np.ndarray, values: np.ndarray = KVALUES) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> iq4_xs blocks [nb, 136] (``quantize_iq4_xs`` without weights)."""
    nb = x.shape[0]
    g = x.reshape(nb * 8, 32)
    scales = _sub_block_scales(g, values).reshape(nb, 8)
    _, max_scale = first_largest(scales)  # +0 when every scale is 0, as C
    d = (-max_scale / F32(32)).astype(F32)
    d_bytes, _ = _f16(d)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(d != 0, F32(1) / d, F32(0)).astype(F32)
    ls = np.clip(nearest_int(_mul(inv[:, None], scales)), -32, 31)
    dl = _mul(d[:, None], ls.astype(F32))
    with np.errstate(divide="ignore"):
        idl = np.where(dl != 0, F32(1) / dl, F32(0)).astype(F32)
    idx = _pick(values, g, idl.reshape(-1)).reshape(nb, 256)
    lu = (ls + 32).astype(np.int64)
    scales_l = ((lu[:, 0::2] & 15) | ((lu[:, 1::2] & 15) << 4)).astype(np.uint8)
    scales_h = np.sum((lu >> 4) << (2 * np.arange(8)), axis=1).astype("<u2")
    return np.concatenate([d_bytes, scales_h.view(np.uint8).reshape(nb, 2), scales_l, _pack(idx)], axis=1)
