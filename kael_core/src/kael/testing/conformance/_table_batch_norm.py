"""Table rows for the batch normalisation fused ops: batch_norm, batch_norm_backward (training) and batch_norm_eval.

Shapes cover [N, C] (BatchNorm1d), [N, C, L] and [N, C, H, W], with and without the affine
weight and bias, a channel whose values are constant (variance 0, so eps alone keeps
rstd finite), channels-last and transposed storage and strided outputs. The backward's
mean and rstd are x's statistics computed here in float64 (the backward is a function of them as given).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, operand, vals
from ._layout import Operand, Out

__all__ = ["BATCH_NORM_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)
# name: (x shape, x layout, affine)
_SPECS: dict[str, tuple[tuple[int, ...], str, bool]] = {
    "nchw": ((3, 4, 5, 6), "contiguous", True),
    "nc": ((6, 5), "transposed", True),
    "ncl_plain": ((2, 3, 7), "contiguous", False),
    "channels_last": ((2, 3, 4, 5), "permute:0,2,3,1", True),
}


def _stat(d: dt.DType) -> dt.DType:
    return dt.float64 if d is dt.float64 else dt.float32


def _kind(d: dt.DType) -> str:
    return "unit" if d.itemsize == 2 else "normal"


def _x(rng: np.random.Generator, shape: tuple[int, ...], d: dt.DType, constant_channel: bool) -> np.ndarray:
    v = vals(rng, shape, d, _kind(d)) * 2 + 0.5
    if constant_channel:
        v[:, 0] = 0.75
    return v


def _batch_norm(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lx: str, affine: bool, out: str, constant: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c, st = shape[1], _stat(d)
            w = operand(rng, (c,), d, "contiguous", _kind(d)) if affine else None
            b = operand(rng, (c,), d, "contiguous", _kind(d)) if affine else None
            x = Operand(_x(rng, shape, d, constant), d, lx)
            return Call([Out(shape, d, out), Out((c,), st), Out((c,), st), x, w, b, 1e-5])

        return build

    rows = {name: mk(shape, lx, affine, "contiguous", False) for name, (shape, lx, affine) in _SPECS.items()}
    if d in FULL:
        rows["strided_out_constant_channel"] = mk((3, 4, 5, 6), "contiguous", True, "strided", True)
    return rows


def _batch_norm_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lx: str, affine: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c, st = shape[1], _stat(d)
            x = _x(rng, shape, d, False)
            xr = x  # any mean and rstd define the backward; these are x's (before rounding to d)
            axes = (0, *range(2, len(shape)))
            mu = xr.mean(axis=axes)
            r = 1 / np.sqrt(((xr - mu.reshape((1, c) + (1,) * (len(shape) - 2))) ** 2).mean(axis=axes) + 1e-5)
            w = operand(rng, (c,), d, "contiguous", _kind(d)) if affine else None
            outs: list[Any] = [Out(shape, d), Out((c,), d), Out((c,), d)]
            g = operand(rng, shape, d, "transposed" if affine else "contiguous", _kind(d))
            return Call([*outs, g, Operand(x, d, lx), Operand(mu, st), Operand(r, st), w])

        return build

    return {name: mk(shape, lx, affine) for name, (shape, lx, affine) in _SPECS.items()}


def _batch_norm_eval(d: dt.DType) -> dict[str, Builder]:
    def mk(shape: tuple[int, ...], lx: str, affine: bool) -> Builder:
        def build(rng: np.random.Generator) -> Call:
            c, st = shape[1], _stat(d)  # running statistics kept in float32 for 16-bit inputs, as PyTorch does
            w = operand(rng, (c,), d, "contiguous", _kind(d)) if affine else None
            b = operand(rng, (c,), d, "contiguous", _kind(d)) if affine else None
            mean, var = Operand(vals(rng, (c,), st), st), Operand(vals(rng, (c,), st, "positive"), st, "strided")
            return Call([Out(shape, d), Operand(_x(rng, shape, d, False), d, lx), mean, var, w, b, 1e-3])

        return build

    return {name: mk(shape, lx, affine) for name, (shape, lx, affine) in _SPECS.items()}


BATCH_NORM_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "batch_norm": (_batch_norm, FLOATS),
    "batch_norm_backward": (_batch_norm_backward, FLOATS),
    "batch_norm_eval": (_batch_norm_eval, FLOATS),
}
