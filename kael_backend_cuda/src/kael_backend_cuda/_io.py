"""Reading operands as xp arrays and writing results into outputs, strides honoured.

The CUDA twin of ``kael.backends.host``'s read/write: bfloat16 (which neither CuPy nor
NumPy has) is stored as uint16 bits, read widened to float32 and written back
rounded to nearest even. ``compute_dtype`` is the dtype the fused kernels run in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from kael.backends import dtypes as dt
from kael.backends import memory

from ._xp import X, errstate, view

__all__ = ["view", "rd", "wr", "raw_copy", "f32_to_bf16_bits", "compute_dtype", "distinct", "writable_as"]


def rd(t: Any) -> Any:
    """t's values as an xp array (a view when possible; bfloat16 widened to float32)."""
    v = view(t)
    if t.dtype is dt.bfloat16:
        xp = X.xp
        return (v.astype(xp.uint32) << 16).view(xp.float32)
    return v


def f32_to_bf16_bits(x: Any) -> Any:
    """float32 values -> bfloat16 bits (uint16), rounded to nearest even; NaN stays NaN."""
    xp = X.xp
    f = xp.ascontiguousarray(x, dtype=xp.float32)
    bits = f.view(xp.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return xp.where(xp.isnan(f), np.uint16(0x7FC0), rounded.astype(xp.uint16))


def wr(out: Any, value: Any) -> None:
    """Write value (an xp array or a Python number, broadcastable to out's shape) into out."""
    xp = X.xp
    v = view(out)
    if out.dtype is dt.bfloat16:
        value = f32_to_bf16_bits(xp.broadcast_to(xp.asarray(value, dtype=xp.float32), out.shape))
    with errstate():
        xp.copyto(v, value, casting="unsafe")


def raw_copy(out: Any, a: Any) -> None:
    """Copy a's elements into out bit for bit (same dtype), safe when they share storage."""
    src = view(a)
    if memory.same_storage(a, out):
        src = src.copy()
    X.xp.copyto(view(out), src)


def compute_dtype(*ts: Any) -> Any:
    """The NumPy dtype a fused kernel computes in: float64 if any operand is, else float32."""
    return np.float64 if any(t is not None and t.dtype is dt.float64 for t in ts) else np.float32


def distinct(out: Any, *inputs: Any) -> bool:
    """True when out shares storage with none of the inputs (so a kernel may write into it directly)."""
    return all(t is None or not memory.same_storage(out, t) for t in inputs)


def writable_as(out: Any, np_dtype: Any, *inputs: Any) -> bool:
    """True when a kernel computing in np_dtype may write straight into out's strided view."""
    return out.dtype.np == np_dtype and out.dtype is not dt.bfloat16 and distinct(out, *inputs)
