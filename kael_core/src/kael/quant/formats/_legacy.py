"""GGML's legacy 32-value block formats: q4_0, q4_1, q5_0, q5_1, q8_0.

Layouts (little-endian): q4_0 = f16 d, 16 bytes of nibbles (byte j: value j low,
value j + 16 high), value = d * (q - 8); q4_1 = f16 d, f16 m, nibbles, value = d * q + m;
q5_0 = f16 d, uint32 qh (bit j: the fifth bit of value j), nibbles, value = d * (q - 16);
q5_1 = f16 d, f16 m, qh, nibbles, value = d * q + m; q8_0 = f16 d, 32 int8, value = d * q.
Arithmetic in float32, one multiply (and one add), as ggml's reference code.
"""

from __future__ import annotations

import numpy as np

from ._registry import WeightFormat, check_blocks, half

__all__ = [
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "quantize_q4_0",
    "quantize_q4_1",
    "quantize_q5_0",
    "quantize_q5_1",
    "quantize_q8_0",
]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[nb, 16] bytes -> [nb, 32] values 0..15 (low nibbles are values 0-15, high 16-31)."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=1).astype(np.int32)


def _fifth_bits(blocks: np.ndarray, at: int) -> np.ndarray:
    qh = np.ascontiguousarray(blocks[:, at : at + 4]).view("<u4").astype(np.int64)  # [nb, 1]
    return (((qh >> np.arange(32)) & 1) << 4).astype(np.int32)  # [nb, 32]


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 18)
    return half(blocks, 0) * (_nibbles(blocks[:, 2:]) - 8).astype(np.float32)


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 20)
    out: np.ndarray = half(blocks, 0) * _nibbles(blocks[:, 4:]).astype(np.float32) + half(blocks, 2)
    return out


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 22)
    q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks, 2)
    out: np.ndarray = half(blocks, 0) * (q - 16).astype(np.float32)
    return out


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 24)
    q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks, 4)
    out: np.ndarray = half(blocks, 0) * q.astype(np.float32) + half(blocks, 2)
    return out


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 34)
    return half(blocks, 0) * np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)


def _levels(x: np.ndarray, lo: np.ndarray, d: np.ndarray, offset: float, top: int) -> np.ndarray:
    """trunc((x - lo) / d + offset) clipped to 0..top, all in float32 (1/d is 0 for d = 0)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = (x - lo) * inv + np.float32(offset)
        v = np.trunc(np.where(np.isfinite(v), v, np.float32(0)))
    return np.clip(v, 0, top).astype(np.uint8)


def _pack(q: np.ndarray) -> np.ndarray:
    """[nb, 32] levels -> [nb, 16] bytes: value j in the low nibble, value j + 16 in the high one."""
    return (q[:, :16] & np.uint8(15)) | ((q[:, 16:] & np.uint8(15)) << np.uint8(4))


def _f16_bytes(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return v.astype("<f2").view(np.uint8)


def _fifth_bytes(q: np.ndarray) -> np.ndarray:
    return np.packbits(q >> np.uint8(4), axis=-1, bitorder="little")  # [nb, 4]: bit j = fifth bit of value j


def _first_largest(x: np.ndarray) -> np.ndarray:
    """[nb, 1]: the first value of largest magnitude of each block."""
    return np.take_along_axis(x, np.argmax(np.abs(x), axis=1)[:, None], axis=1)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """Float32 blocks [nb, 32] -> q4_0 blocks [nb, 18]: d = m/-8, q = min(15, trunc(x/d + 8.5))."""
    d = _first_largest(x) / np.float32(-8)
    return np.concatenate([_f16_bytes(d), _pack(_levels(x, np.zeros_like(d), d, 8.5, 15))], axis=1)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Float32 blocks [nb, 32] -> q8_0 blocks [nb, 34]: d = max|x|/127, q = roundf(x/d) (half away from zero)."""
    d = np.max(np.abs(x), axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        v = x * inv
        v = np.where(np.isfinite(v), v, np.float32(0))
    a = np.abs(v)
    whole = np.floor(a)
    q = np.copysign(whole + ((a - whole) >= np.float32(0.5)), v).astype(np.int8)  # C's roundf, exact in float32
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    """Float32 blocks [nb, 32] -> q4_1 blocks [nb, 20]: d = (max - min)/15, q = trunc((x - min)/d + 0.5)."""
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    with np.errstate(over="ignore"):  # a range beyond float32 gives an infinite scale, as ggml
        d = (hi - lo) / np.float32(15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack(_levels(x, lo, d, 0.5, 15))], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    """Float32 blocks [nb, 32] -> q5_0 blocks [nb, 22]: d = m/-16 (m the first value of largest magnitude)."""
    d = _first_largest(x) / np.float32(-16)
    q = _levels(x, np.zeros_like(d), d, 16.5, 31)
    return np.concatenate([_f16_bytes(d), _fifth_bytes(q), _pack(q)], axis=1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    """Float32 blocks [nb, 32] -> q5_1 blocks [nb, 24]: d = (max - min)/31, q = trunc((x - min)/d + 0.5)."""
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    with np.errstate(over="ignore"):  # a range beyond float32 gives an infinite scale, as ggml
        d = (hi - lo) / np.float32(31)
    q = _levels(x, lo, d, 0.5, 31)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _fifth_bytes(q), _pack(q)], axis=1)


Q4_0 = WeightFormat("q4_0", 2, "legacy", 32, 18, "uint8", _q4_0, "q6_k", quantize_q4_0)
"""4-bit, scale only."""
Q4_1 = WeightFormat("q4_1", 3, "legacy", 32, 20, "uint8", _q4_1, "q6_k", quantize_q4_1)
"""4-bit, scale and minimum."""
Q5_0 = WeightFormat("q5_0", 6, "legacy", 32, 22, "uint8", _q5_0, "q6_k", quantize_q5_0)
"""5-bit, scale only."""
Q5_1 = WeightFormat("q5_1", 7, "legacy", 32, 24, "uint8", _q5_1, "q6_k", quantize_q5_1)
"""5-bit, scale and minimum."""
Q8_0 = WeightFormat("q8_0", 8, "legacy", 32, 34, "uint8", _q8_0, "q8_0", quantize_q8_0)
"""8-bit, scale only."""
