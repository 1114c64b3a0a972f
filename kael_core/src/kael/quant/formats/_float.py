"""Float weight formats: f32, f16, bf16 (one value per "block", the value's own bytes)."""

from __future__ import annotations

import numpy as np

from ._registry import WeightFormat, check_blocks

__all__ = ["F32", "F16", "BF16"]


def _f32(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 4)
    return np.ascontiguousarray(blocks).view("<f4").astype(np.float32)


def _f16(blocks: np.ndarray) -> np.ndarray:
    check_blocks(blocks, 2)
    return np.ascontiguousarray(blocks).view("<f2").astype(np.float32)


def _bf16(blocks: np.ndarray) -> np.ndarray:
    """bfloat16 bits are the top half of a float32's: widen exactly by a 16-bit shift."""
    check_blocks(blocks, 2)
    bits = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


F32 = WeightFormat("f32", 0, "float", 1, 4, "float32", _f32, "f32")
"""IEEE float32."""
F16 = WeightFormat("f16", 1, "float", 1, 2, "float16", _f16, "f16")
"""IEEE float16."""
BF16 = WeightFormat("bf16", 30, "float", 1, 2, "uint16", _bf16, "bf16")
"""bfloat16 (NumPy arrays hold the uint16 bit patterns)."""
