"""The Gemma family's fused ops on CUDA: the glue around their pointwise kernels.

``gelu_tanh_mul`` (GeGLU's gelu_tanh(gate) * up) and ``softcap`` (cap * tanh(x / cap)) are
``ElementwiseKernel``s of ``_pointwise_kernels`` (any strides, so float32/float64 operands are
read in place and the result goes straight into the output when its layout fits). 16-bit
inputs round where PyTorch's eager ops do (NOTE [16-bit rounding of the Gemma ops] in
``kael/ops/_fused_gemma.py``), as ``silu_mul`` does: gelu_tanh_mul runs the gelu kernel (tanh
form, PyTorch's formula) in float32, rounds it to the dtype, then multiplies; softcap computes
x / cap, its tanh and the product in float32 with cap as a float32, rounding after each.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import _raw_kernels as raw
from ._fused import _dst, _finish, _round_to, gated
from ._io import compute_dtype, rd, wr
from ._xp import X, quiet

__all__ = ["KERNELS"]


def gelu_tanh_mul(out: Any, gate: Any, up: Any) -> None:
    gated(out, gate, up, lambda g, a: raw.gelu(g, a, True), raw.gelu_tanh_mul)


def softcap(out: Any, x: Any, cap: float) -> None:
    if out.numel() == 0:
        return
    cd = compute_dtype(x)
    xv = rd(x).astype(cd, copy=False)
    if x.dtype.itemsize == 2:  # (x / cap).tanh() * cap: each op rounded to the 16-bit dtype
        c = np.float32(cap)
        wr(out, _round_to(x, X.xp.tanh(_round_to(x, xv / c))) * c)
        return
    y, direct = _dst(out, cd, out.shape, x)
    raw.softcap(xv, float(cap), y)
    _finish(out, y, direct)


_PLAIN: dict[str, Callable[..., None]] = {"gelu_tanh_mul": gelu_tanh_mul, "softcap": softcap}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
