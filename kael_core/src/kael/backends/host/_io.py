"""Reading CPU tensors as NumPy arrays and writing results into outputs, strides honoured.

bfloat16 has no NumPy dtype: it is stored as uint16 bits, read widened to float32,
and written back rounded to nearest even.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import _dtype as dt
from ..._dtype import bf16_bits_to_f32, f32_to_bf16_bits

__all__ = ["view", "rd", "wr", "f32_to_bf16_bits", "bf16_bits_to_f32", "compute_np"]


def view(t: Any) -> np.ndarray:
    """The strided NumPy view of a CPU tensor's elements (uint16 bits for bfloat16); cached on the tensor."""
    return t._np_view()  # type: ignore[no-any-return]


def rd(t: Any) -> np.ndarray:
    """t's values as NumPy (a view when possible; bfloat16 widened to float32)."""
    v = t._np_view()
    if t.dtype is dt.bfloat16:
        return bf16_bits_to_f32(v)
    return v  # type: ignore[no-any-return]


def wr(out: Any, value: Any) -> None:
    """Write value (broadcastable to out's shape) into out, cast to out's dtype."""
    v = out._np_view()
    if out.dtype is dt.bfloat16:
        value = f32_to_bf16_bits(np.broadcast_to(np.asarray(value, dtype=np.float32), out.shape))
    with np.errstate(all="ignore"):
        np.copyto(v, value, casting="unsafe")


def compute_np(d: Any) -> Any:
    """The NumPy dtype to compute in for kael dtype d (float32 for bfloat16, else d's own)."""
    return np.float32 if d is dt.bfloat16 else d.np
