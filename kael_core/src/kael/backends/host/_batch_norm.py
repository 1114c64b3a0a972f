"""The batch normalisation fused ops as plain NumPy math: batch_norm and batch_norm_backward (training mode).

Statistics per channel (dim 1) over every other dim of x [N, C, *S], computed in float64:
mean, the biased variance, rstd = 1/sqrt(var + eps); out = (x - mean) * rstd * weight +
bias. The backward is the closed form through the batch statistics (see the catalogue);
``batch_norm_eval`` normalises with given (running) statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, wr

__all__ = ["KERNELS"]


def _dims(v: np.ndarray) -> tuple[int, ...]:
    return (0, *range(2, v.ndim))


def _channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm(out: Any, mean: Any, rstd: Any, x: Any, weight: Any, bias: Any, eps: float) -> None:
    v = rd(x).astype(np.float64)
    mu = v.mean(axis=_dims(v))
    var = ((v - _channel(mu, v.ndim)) ** 2).mean(axis=_dims(v))
    r = 1.0 / np.sqrt(var + eps)
    y = (v - _channel(mu, v.ndim)) * _channel(r, v.ndim)
    if weight is not None:
        y = y * _channel(rd(weight).astype(np.float64), v.ndim)
    if bias is not None:
        y = y + _channel(rd(bias).astype(np.float64), v.ndim)
    wr(mean, mu)
    wr(rstd, r)
    wr(out, y)


def batch_norm_backward(
    dx: Any, dweight: Any, dbias: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any
) -> None:
    v = rd(x).astype(np.float64)
    g = rd(grad).astype(np.float64)
    r = rd(rstd).astype(np.float64)
    xhat = (v - _channel(rd(mean).astype(np.float64), v.ndim)) * _channel(r, v.ndim)
    sg, sgx = g.sum(axis=_dims(v)), (g * xhat).sum(axis=_dims(v))
    if dbias is not None:
        wr(dbias, sg)
    if dweight is not None:
        wr(dweight, sgx)
    if dx is not None:
        m = v.size // v.shape[1] if v.shape[1] else 0
        w = rd(weight).astype(np.float64) if weight is not None else np.ones(v.shape[1])
        k = _channel(r * w, v.ndim)
        wr(dx, k * (g - _channel(sg / max(m, 1), v.ndim) - xhat * _channel(sgx / max(m, 1), v.ndim)))


def batch_norm_eval(out: Any, x: Any, mean: Any, var: Any, weight: Any, bias: Any, eps: float) -> None:
    v = rd(x).astype(np.float64)
    y = (v - _channel(rd(mean).astype(np.float64), v.ndim)) / np.sqrt(
        _channel(rd(var).astype(np.float64), v.ndim) + eps
    )
    if weight is not None:
        y = y * _channel(rd(weight).astype(np.float64), v.ndim)
    if bias is not None:
        y = y + _channel(rd(bias).astype(np.float64), v.ndim)
    wr(out, y)


KERNELS: dict[str, Callable[..., None]] = {
    "batch_norm": batch_norm,
    "batch_norm_backward": batch_norm_backward,
    "batch_norm_eval": batch_norm_eval,
}
