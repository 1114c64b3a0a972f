"""batch_norm, batch_norm_backward and batch_norm_eval on CUDA (NOTE [batch_norm fused op] in
kael/ops/_batch_norm_fused.py).

Per-channel statistics are CuPy reductions over x viewed [N, C, S] (axes 0 and 2, on
the device, no host round trip), accumulated in float64 for float32 and 16-bit inputs as
the CPU kernels do; the normalisation, the closed-form backward and ``batch_norm_eval``
(given statistics) are CuPy elementwise expressions over the same view. Under emulation
(NOTE [host emulation] in ``_xp``) ``X.xp`` is NumPy and the same code runs on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import compute_dtype, rd, wr
from ._xp import X, quiet

__all__ = ["KERNELS"]


def _rows(t: Any, dtype: Any) -> Any:
    """t [N, C, *S] as a C-contiguous xp array [N, C, S] of dtype."""
    v = X.xp.ascontiguousarray(rd(t), dtype=dtype)
    return v.reshape(v.shape[0], v.shape[1], -1) if v.size else v.reshape(v.shape[0], v.shape[1], 0)


def _col(v: Any) -> Any:
    return v.reshape(1, -1, 1)


def batch_norm(out: Any, mean: Any, rstd: Any, x: Any, weight: Any, bias: Any, eps: float) -> None:
    if x.numel() == 0:
        return
    xv = _rows(x, np.float64)
    mu = xv.mean(axis=(0, 2))
    d = xv - _col(mu)
    r = 1.0 / X.xp.sqrt((d * d).mean(axis=(0, 2)) + eps)
    scale = r * (rd(weight).astype(np.float64) if weight is not None else 1.0)
    shift = rd(bias).astype(np.float64) if bias is not None else X.xp.zeros_like(mu)
    cd = compute_dtype(x)
    # (x - mean) * scale + bias, not x * scale + (bias - mean * scale): that cancels when scale is large
    y = (_rows(x, cd) - _col(mu.astype(cd))) * _col(scale.astype(cd)) + _col(shift.astype(cd))
    wr(mean, mu)
    wr(rstd, r)
    wr(out, y.reshape(out.shape))


def batch_norm_backward(
    dx: Any, dweight: Any, dbias: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any
) -> None:
    if x.numel() == 0:
        return
    g, xv = _rows(grad, np.float64), _rows(x, np.float64)
    r = rd(rstd).astype(np.float64)
    xhat = (xv - _col(rd(mean).astype(np.float64))) * _col(r)
    sg, sgx = g.sum(axis=(0, 2)), (g * xhat).sum(axis=(0, 2))
    if dbias is not None:
        wr(dbias, sg)
    if dweight is not None:
        wr(dweight, sgx)
    if dx is not None:
        m = x.numel() // x.shape[1]
        k = r * (rd(weight).astype(np.float64) if weight is not None else 1.0)
        wr(dx, (_col(k) * (g - _col(sg / m) - xhat * _col(sgx / m))).reshape(dx.shape))


def batch_norm_eval(out: Any, x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> None:
    if x.numel() == 0:
        return
    cd = compute_dtype(x)
    scale = 1.0 / X.xp.sqrt(rd(var).astype(np.float64) + eps)
    if weight is not None:
        scale = scale * rd(weight).astype(np.float64)
    shift = rd(bias).astype(cd) if bias is not None else X.xp.zeros(x.shape[1], cd)
    y = (_rows(x, cd) - _col(rd(mean).astype(cd))) * _col(scale.astype(cd)) + _col(shift)
    wr(out, y.reshape(out.shape))


_PLAIN: dict[str, Callable[..., None]] = {
    "batch_norm": batch_norm,
    "batch_norm_backward": batch_norm_backward,
    "batch_norm_eval": batch_norm_eval,
}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
