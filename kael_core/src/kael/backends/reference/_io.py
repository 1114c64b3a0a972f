"""Reading operands as NumPy arrays and writing results into outputs, strides honoured.

bfloat16 has no NumPy dtype: it is stored as uint16 bits, read widened to float32,
and written back rounded to nearest even.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _dtype as dt

__all__ = ["rd", "wr", "view", "f32_to_bf16_bits", "compute_np"]


def view(t: Any) -> np.ndarray:
    """The strided NumPy view of a CPU tensor's elements (uint16 bits for bfloat16)."""
    return t._np_view()  # type: ignore[no-any-return]


def rd(t: Any) -> np.ndarray:
    """t's values as NumPy (a view when possible; bfloat16 widened to float32)."""
    v = t._np_view()
    if t.dtype is dt.bfloat16:
        return (v.astype(np.uint32) << 16).view(np.float32)  # type: ignore[no-any-return]
    return v  # type: ignore[no-any-return]


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    f = np.array(x, dtype=np.float32, order="C")  # not ascontiguousarray: that makes 0-d arrays 1-d
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(f)
    out = np.asarray(rounded, dtype=np.uint16)  # an array even for 0-d input (ufuncs return scalars there)
    if nan.any():
        out = np.where(nan, np.uint16(0x7FC0), out).astype(np.uint16)
    return out


def wr(out: Any, value: Any) -> None:
    """Write value (broadcastable to out's shape) into out, cast to out's dtype."""
    v = out._np_view()
    if out.dtype is dt.bfloat16:
        value = f32_to_bf16_bits(np.broadcast_to(np.asarray(value, dtype=np.float32), out.shape))
    with np.errstate(all="ignore"):
        np.copyto(v, value, casting="unsafe")


def compute_np(d: Any) -> Any:
    """The NumPy dtype to compute in for kael dtype d."""
    return np.float32 if d is dt.bfloat16 else d.np
