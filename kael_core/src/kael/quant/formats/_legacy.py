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

__all__ = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]


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
    return half(blocks, 0) * _nibbles(blocks[:, 4:]).astype(np.float32) + half(blocks, 2)


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 22)
    q = _nibbles(blocks[:, 6:]) | _fifth_bits(blocks, 2)
    return half(blocks, 0) * (q - 16).astype(np.float32)


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 24)
    q = _nibbles(blocks[:, 8:]) | _fifth_bits(blocks, 4)
    return half(blocks, 0) * q.astype(np.float32) + half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 34)
    return half(blocks, 0) * np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)


Q4_0 = WeightFormat("q4_0", 2, "legacy", 32, 18, "uint8", _q4_0, "q6_k")
"""4-bit, scale only."""
Q4_1 = WeightFormat("q4_1", 3, "legacy", 32, 20, "uint8", _q4_1, "q6_k")
"""4-bit, scale and minimum."""
Q5_0 = WeightFormat("q5_0", 6, "legacy", 32, 22, "uint8", _q5_0, "q6_k")
"""5-bit, scale only."""
Q5_1 = WeightFormat("q5_1", 7, "legacy", 32, 24, "uint8", _q5_1, "q6_k")
"""5-bit, scale and minimum."""
Q8_0 = WeightFormat("q8_0", 8, "legacy", 32, 34, "uint8", _q8_0, "q8_0")
"""8-bit, scale only."""
