"""GGML's K-quants: 256-value super-blocks q2_k, q3_k, q4_k, q5_k, q6_k.

Layouts (bytes, little-endian; facts from ggml's ``block_q*_K`` structs):

* q2_k (84): scales[16] (low nibble scale, high nibble min of each 16 values),
  qs[64] (2-bit), f16 d, f16 dmin; value = d*sc*q - dmin*m.
* q3_k (110): hmask[32], qs[64] (low 2 bits), scales[12] (16 6-bit scales), f16 d;
  value = d*(sc - 32) * (q - 4 if the hmask bit is clear else q).
* q4_k (144): f16 d, f16 dmin, scales[12] (8 6-bit scales and mins), qs[128];
  value = d*sc*q - dmin*m per 32 values.
* q5_k (176): as q4_k with qh[32] (fifth bits) before qs.
* q6_k (210): ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d;
  value = d*sc*(q - 32) per 16 values.

Within a 128-value half, 2-bit fields of byte l hold values l, l+32, l+64, l+96. The
index tables below give, for each of the 256 values, its byte and bit position.
"""

from __future__ import annotations

import numpy as np

from ._kquants_quantize import quantize_q2_k, quantize_q3_k, quantize_q4_k, quantize_q5_k, quantize_q6_k
from ._registry import WeightFormat, check_blocks, half

__all__ = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

_V = np.arange(256)
_HALF, _R = _V // 128, _V % 128
_J, _L = _R // 32, _R % 32
# 2-bit quants (q2_k, q3_k): byte half*32 + l, shift 2*j; scale (of 16 values) half*8 + 2*j + l//16
_QS2 = _HALF * 32 + _L
_SHIFT2 = 2 * _J
_SC16 = _HALF * 8 + 2 * _J + _L // 16
# q3_k's high bit: hmask[l], bit half*4 + j
_HBIT3 = _HALF * 4 + _J
# 4-bit quants (q4_k, q5_k): byte (v//64)*32 + v%32, high nibble when (v%64) >= 32; scale of 32 values v//32
_QS4 = (_V // 64) * 32 + _V % 32
_SHIFT4 = np.where(_V % 64 >= 32, 4, 0)
# q6_k: ql byte half*64 + l + 32*(j%2), high nibble when j >= 2; qh byte half*32 + l, shift 2*j;
# scale half*8 + l//16 + 2*j
_QL6 = _HALF * 64 + _L + 32 * (_J % 2)
_SHIFT6 = np.where(_J >= 2, 4, 0)
_QH6 = _HALF * 32 + _L
_SC6 = _HALF * 8 + _L // 16 + 2 * _J


def _bits(b: np.ndarray, idx: np.ndarray, shift: np.ndarray, mask: int) -> np.ndarray:
    out: np.ndarray = ((b[:, idx].astype(np.int32) >> shift) & mask).astype(np.int32)
    return out


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    s = sc.astype(np.int32)
    lo_sc, lo_m = s[:, 0:4] & 63, s[:, 4:8] & 63
    hi_sc = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], axis=1), np.concatenate([lo_m, hi_m], axis=1)


def _scales_q3(sc: np.ndarray) -> np.ndarray:
    """12 bytes -> 16 six-bit scales: low 4 bits from byte i%8 (nibble i//8), high 2 from byte 8+i%4 (pair i//4)."""
    i = np.arange(16)
    s = sc.astype(np.int32)
    low = (s[:, i % 8] >> (4 * (i // 8))) & 15
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    return low | (high << 4)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 84)
    sc = blocks[:, :16].astype(np.int32)
    d, dmin = half(blocks, 80), half(blocks, 82)
    dl = (d * (sc & 15).astype(np.float32))[:, _SC16]
    ml = (dmin * (sc >> 4).astype(np.float32))[:, _SC16]
    q = _bits(blocks[:, 16:80], _QS2, _SHIFT2, 3).astype(np.float32)
    out: np.ndarray = dl * q - ml
    return out


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 110)
    hm = _bits(blocks[:, :32], _L, _HBIT3, 1)
    q = _bits(blocks[:, 32:96], _QS2, _SHIFT2, 3) - 4 * (1 - hm)
    dl = half(blocks, 108) * (_scales_q3(blocks[:, 96:108]) - 32).astype(np.float32)
    out: np.ndarray = dl[:, _SC16] * q.astype(np.float32)
    return out


def _k4_common(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    sc, m = _scale_min_k4(blocks[:, 4:16])
    d = (half(blocks, 0) * sc.astype(np.float32))[:, _V // 32]
    dm = (half(blocks, 2) * m.astype(np.float32))[:, _V // 32]
    out: np.ndarray = d * q.astype(np.float32) - dm
    return out


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 144)
    return _k4_common(blocks, _bits(blocks[:, 16:144], _QS4, _SHIFT4, 15))


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 176)
    high = _bits(blocks[:, 16:48], _V % 32, _V // 32, 1)
    return _k4_common(blocks, _bits(blocks[:, 48:176], _QS4, _SHIFT4, 15) | (high << 4))


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 210)
    low = _bits(blocks[:, :128], _QL6, _SHIFT6, 15)
    high = _bits(blocks[:, 128:192], _QH6, _SHIFT2, 3)
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    d = (half(blocks, 208) * sc)[:, _SC6]
    out: np.ndarray = d * ((low | (high << 4)) - 32).astype(np.float32)
    return out


Q2_K = WeightFormat("q2_k", 10, "k-quant", 256, 84, "uint8", _q2_k, "q6_k", quantize_q2_k)
"""2-bit K-quant (scales and mins per 16 values)."""
Q3_K = WeightFormat("q3_k", 11, "k-quant", 256, 110, "uint8", _q3_k, "q6_k", quantize_q3_k)
"""3-bit K-quant (6-bit scales per 16 values)."""
Q4_K = WeightFormat("q4_k", 12, "k-quant", 256, 144, "uint8", _q4_k, "q6_k", quantize_q4_k)
"""4-bit K-quant (6-bit scales and mins per 32 values)."""
Q5_K = WeightFormat("q5_k", 13, "k-quant", 256, 176, "uint8", _q5_k, "q6_k", quantize_q5_k)
"""5-bit K-quant (6-bit scales and mins per 32 values)."""
Q6_K = WeightFormat("q6_k", 14, "k-quant", 256, 210, "uint8", _q6_k, "q6_k", quantize_q6_k)
"""6-bit K-quant (int8 scales per 16 values)."""
