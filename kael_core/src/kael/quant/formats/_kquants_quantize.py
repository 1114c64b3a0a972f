"""ggml's reference K-quant quantizers (q2_k .. q6_k), vectorized over super-blocks.

Each function maps float32 super-blocks [nb, 256] to the bytes of ggml's ``block_q*_K``
[nb, block_bytes] exactly as ``quantize_row_q*_K_ref`` does (what ``ggml_quantize_chunk``
and ``llama-quantize`` run without an importance matrix; NOTE [bit-exact K-quant search]):

* q2_k: per 16 values ``make_qkx2_quants(nmax 3, weights |x|, rmin -0.5, rdelta 0.1, 15
  steps, mean absolute error)``; 4-bit scales and mins of the largest scale / min over 15.
* q3_k: per 16 values ``make_q3_quants(nmax 4)``; 6-bit signed scales of the scale of
  largest magnitude over -32.
* q4_k / q5_k: per 32 values ``make_qkx2_quants(nmax 15 / 31, weights sqrt(mean x^2) + |x|,
  rmin -1 / -0.5, rdelta 0.1, 20 / 15 steps)``; 6-bit scales and mins over 63.
* q6_k: per 16 values ``make_qx_quants(nmax 32, rmse_type 1)``; int8 scales of the scale of
  largest magnitude over -128.

Then each value is re-quantized with the block's stored (float16-rounded) scales, except in
groups whose stored scale is 0, which keep the levels of the search (as the C code).
"""

from __future__ import annotations

import numpy as np

from ._kquants_search import (
    F32,
    GROUP_MAX_EPS,
    by_chunks,
    first_largest,
    make_q3_quants,
    make_qkx2_quants,
    make_qx_quants,
    nearest_int,
)

__all__ = ["quantize_q2_k", "quantize_q3_k", "quantize_q4_k", "quantize_q5_k", "quantize_q6_k"]


def _f16(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [nb] -> (float16 bytes [nb, 2], the float16 value widened back to float32 [nb, 1])."""
    with np.errstate(over="ignore"):
        h = np.asarray(v, dtype=F32).astype("<f2")
    return h.view(np.uint8).reshape(-1, 2), h.astype(F32).reshape(-1, 1)


def _requantize(x: np.ndarray, lv: np.ndarray, d: np.ndarray, dm: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
    """Levels clip(nearest_int((x + dm) / d)) of groups [nb, g, n] where d != 0, else the search's `lv`."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = x if dm is None else (x + dm[..., None]).astype(F32)
        q = np.clip(nearest_int((num / d[..., None]).astype(F32)), lo, hi)
    out: np.ndarray = np.where((d != 0)[..., None], q, lv)
    return out


def _pack2(lv: np.ndarray) -> np.ndarray:
    """Levels [nb, 256] of 2 bits -> [nb, 64] bytes: byte h*32 + l holds values h*128 + 32*j + l at bits 2j."""
    q = lv.reshape(-1, 2, 4, 32).astype(np.uint8)
    out = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    return out.reshape(-1, 64)


def _largest_positive(v: np.ndarray) -> np.ndarray:
    """Per row: the largest value if positive, else 0 (ggml's ``if (scale > max_scale)`` from 0)."""
    out: np.ndarray = np.max(np.where(v > 0, v, F32(0)), axis=1).astype(F32)  # NaN never wins
    return out


@by_chunks
def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> q2_k blocks [nb, 84] (``quantize_row_q2_K_ref``)."""
    nb = x.shape[0]
    g = x.reshape(nb * 16, 16)
    scales, mins, lv = make_qkx2_quants(g, np.abs(g), 3, -0.5, 0.1, 15, True)
    scales, mins, lv = scales.reshape(nb, 16), mins.reshape(nb, 16), lv.reshape(nb, 16, 16)
    max_scale, max_min = _largest_positive(scales), _largest_positive(mins)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ls = nearest_int((F32(15) / max_scale)[:, None] * scales)
        lm = nearest_int((F32(15) / max_min)[:, None] * mins)
        d_raw = (max_scale / F32(15)).astype(F32)
        m_raw = (max_min / F32(15)).astype(F32)
    ls = np.where((max_scale > 0)[:, None], ls & 0xFF, 0)
    sc = (ls | np.where((max_min > 0)[:, None], lm << 4, 0)) & 0xFF
    d_bytes, d = _f16(np.where(max_scale > 0, d_raw, F32(0)))
    m_bytes, dmin = _f16(np.where(max_min > 0, m_raw, F32(0)))
    dl = (d * (sc & 15).astype(F32)).astype(F32)
    ml = (dmin * (sc >> 4).astype(F32)).astype(F32)
    lv = _requantize(x.reshape(nb, 16, 16), lv, dl, ml, 0, 3).reshape(nb, 256)
    return np.concatenate([sc.astype(np.uint8), _pack2(lv), d_bytes, m_bytes], axis=1)


@by_chunks
def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> q3_k blocks [nb, 110] (``quantize_row_q3_K_ref``)."""
    nb = x.shape[0]
    scales, lv = make_q3_quants(x.reshape(nb * 16, 16), 4)
    scales, lv = scales.reshape(nb, 16), lv.reshape(nb, 16, 16)
    _, max_scale = first_largest(scales)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-32) / max_scale).astype(F32)
        l8 = (nearest_int(iscale[:, None] * scales) & 0xFF).astype(np.uint8).view(np.int8).astype(np.int32)
        d_raw = (F32(1) / iscale).astype(F32)
    has = max_scale != 0
    ls = np.where(has[:, None], np.clip(l8, -32, 31) + 32, 0)
    d_bytes, d = _f16(np.where(has, d_raw, F32(0)))
    packed = np.zeros((nb, 12), np.int32)
    packed[:, :8] = (ls[:, :8] & 15) | ((ls[:, 8:] & 15) << 4)
    for j in range(16):
        packed[:, 8 + j % 4] |= (ls[:, j] >> 4) << (2 * (j // 4))
    dl = (d * (ls - 32).astype(F32)).astype(F32)
    lv = _requantize(x.reshape(nb, 16, 16), lv, dl, None, -4, 3) + np.where((dl != 0)[..., None], 4, 0)
    lv = lv.reshape(nb, 256)
    high = (lv > 3).astype(np.uint8).reshape(nb, 8, 32)  # value v: hmask[v % 32], bit v // 32
    hmask = np.zeros((nb, 32), np.uint8)
    for bit in range(8):
        hmask |= high[:, bit] << np.uint8(bit)
    low = np.where(lv > 3, lv - 4, lv)
    return np.concatenate([hmask, _pack2(low), packed.astype(np.uint8), d_bytes], axis=1)


def _k4_scales(scales: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q4_k/q5_k: (12 packed scale bytes, d bytes, dmin bytes, 6-bit scales and mins [nb, 8, 2])."""
    nb = scales.shape[0]
    max_scale, max_min = _largest_positive(scales), _largest_positive(mins)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv_s = np.where(max_scale > 0, F32(63) / max_scale, F32(0)).astype(F32)
        inv_m = np.where(max_min > 0, F32(63) / max_min, F32(0)).astype(F32)
    ls = np.minimum(nearest_int(inv_s[:, None] * scales) & 0xFF, 63)
    lm = np.minimum(nearest_int(inv_m[:, None] * mins) & 0xFF, 63)
    packed = np.zeros((nb, 12), np.int32)
    packed[:, 0:4], packed[:, 4:8] = ls[:, :4], lm[:, :4]
    packed[:, 8:12] = (ls[:, 4:] & 15) | ((lm[:, 4:] & 15) << 4)
    packed[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    d_bytes, _ = _f16((max_scale / F32(63)).astype(F32))
    m_bytes, _ = _f16((max_min / F32(63)).astype(F32))
    return packed.astype(np.uint8), d_bytes, m_bytes, np.stack([ls, lm], axis=2)


def _k4_levels(x: np.ndarray, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, np.ndarray]:
    """q4_k/q5_k: (d, dmin and packed scale bytes [nb, 16], levels [nb, 256]) after the search and re-quantization."""
    nb = x.shape[0]
    g = x.reshape(nb * 8, 32)
    sum_x2 = np.zeros(nb * 8, F32)
    sq = (g * g).astype(F32)
    with np.errstate(over="ignore"):
        for i in range(32):
            sum_x2 = (sum_x2 + sq[:, i]).astype(F32)
        av_x = np.sqrt((sum_x2 / F32(32)).astype(F32)).astype(F32)
        weights = (av_x[:, None] + np.abs(g)).astype(F32)
    scales, mins, lv = make_qkx2_quants(g, weights, nmax, rmin, 0.1, nstep, False)
    packed, d_bytes, m_bytes, sm = _k4_scales(scales.reshape(nb, 8), mins.reshape(nb, 8))
    d = np.ascontiguousarray(d_bytes).view("<f2").astype(F32)
    dmin = np.ascontiguousarray(m_bytes).view("<f2").astype(F32)
    dl = (d * sm[:, :, 0].astype(F32)).astype(F32)
    ml = (dmin * sm[:, :, 1].astype(F32)).astype(F32)
    lv = _requantize(x.reshape(nb, 8, 32), lv.reshape(nb, 8, 32), dl, ml, 0, nmax).reshape(nb, 256)
    return np.concatenate([d_bytes, m_bytes, packed], axis=1), lv


def _pack4(lv: np.ndarray) -> np.ndarray:
    """Levels [nb, 256] (low 4 bits used) -> [nb, 128]: byte 32c + l = value 64c + l | value 64c + 32 + l << 4."""
    q = (lv & 15).astype(np.uint8).reshape(-1, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)


@by_chunks
def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> q4_k blocks [nb, 144] (``quantize_row_q4_K_ref``)."""
    head, lv = _k4_levels(x, 15, -1.0, 20)
    return np.concatenate([head, _pack4(lv)], axis=1)


@by_chunks
def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> q5_k blocks [nb, 176] (``quantize_row_q5_K_ref``)."""
    head, lv = _k4_levels(x, 31, -0.5, 15)
    high = (lv >> 4).astype(np.uint8).reshape(-1, 8, 32)  # value v: qh[v % 32], bit v // 32
    qh = np.zeros((lv.shape[0], 32), np.uint8)
    for bit in range(8):
        qh |= high[:, bit] << np.uint8(bit)
    return np.concatenate([head, qh, _pack4(lv)], axis=1)


@by_chunks
def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Float32 super-blocks [nb, 256] -> q6_k blocks [nb, 210] (``quantize_row_q6_K_ref``)."""
    nb = x.shape[0]
    scales, lv = make_qx_quants(x.reshape(nb * 16, 16), 32)
    scales, lv = scales.reshape(nb, 16), lv.reshape(nb, 16, 16)
    amax, max_scale = first_largest(scales)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = (F32(-128) / max_scale).astype(F32)
        d_raw = (F32(1) / iscale).astype(F32)
        sc = np.minimum(nearest_int(iscale[:, None] * scales), 127)
    sc = np.where(zero[:, None], 0, (sc & 0xFF).astype(np.uint8).view(np.int8).astype(np.int32))
    d_bytes, d = _f16(np.where(zero, F32(0), d_raw))
    dl = (d * sc.astype(F32)).astype(F32)
    lv = _requantize(x.reshape(nb, 16, 16), lv - 32, dl, None, -32, 31) + 32
    v = np.where(zero[:, None, None], 0, lv).reshape(nb, 2, 4, 32)  # half, j, l: value half*128 + 32j + l
    low = (v & 15).astype(np.uint8)
    ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=2)
    hi = (v >> 4).astype(np.uint8)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    sc_bytes = sc.astype(np.int8).view(np.uint8)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), sc_bytes, d_bytes], axis=1)
