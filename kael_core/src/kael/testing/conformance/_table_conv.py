"""Table rows for the convolution fused ops: conv2d and conv2d_backward.

Shapes cover plain 3x3 padded convolutions, stride with dilation and groups, depthwise,
1x1, an empty batch and non-contiguous operands and outputs (channels-last storage,
transposed and strided views). Half-precision rows use values below 1 in magnitude, so
the sums of a few dozen products stay within the tolerance of a decomposition that
rounds after each primitive. float32 rows allow for the different summation orders of a
blocked GEMM and NumPy's (a few dozen to a few thousand products per output).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kael.backends import dtypes as dt

from ._cases import FLOATS, Call, operand
from ._layout import Out

__all__ = ["CONV_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
FULL = (dt.float32, dt.float64)
Pair = tuple[int, int]
CHANNELS_LAST = "permute:0,2,3,1"


def _out_hw(x: tuple[int, ...], w: tuple[int, ...], s: Pair, p: Pair, d: Pair) -> Pair:
    return (
        (x[2] + 2 * p[0] - d[0] * (w[2] - 1) - 1) // s[0] + 1,
        (x[3] + 2 * p[1] - d[1] * (w[3] - 1) - 1) // s[1] + 1,
    )


def _tol(d: dt.DType, products: int) -> tuple[float | None, float | None]:
    """Kernel tolerances for float32 (summation order); the defaults for the other dtypes."""
    if d is dt.float32:
        return 1e-5, 4e-6 * max(1, products) ** 0.5
    return None, None


def _kind(d: dt.DType) -> str:
    return "unit" if d.itemsize == 2 else "normal"


Spec = tuple[tuple[int, ...], tuple[int, ...], Pair, Pair, Pair, int]

_SPECS: dict[str, tuple[Spec, str, str, bool]] = {
    # name: ((x shape, w shape, stride, padding, dilation, groups), x layout, w layout, bias)
    "3x3_pad1": (((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1), "contiguous", "contiguous", True),
    "stride_dilation_groups": (
        ((2, 4, 7, 8), (4, 2, 2, 3), (2, 1), (0, 1), (1, 2), 2),
        CHANNELS_LAST,
        "contiguous",
        False,
    ),
    "depthwise": (((1, 3, 5, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3), "contiguous", "transposed", True),
    "1x1": (((2, 5, 4, 4), (3, 5, 1, 1), (1, 1), (0, 0), (1, 1), 1), "strided", "contiguous", True),
}
_FULL_SPECS: dict[str, tuple[Spec, str, str, bool]] = {
    "empty_batch": (((0, 3, 4, 4), (2, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1), "contiguous", "contiguous", True),
    "wide_pad": (((1, 2, 3, 4), (2, 2, 3, 2), (2, 3), (2, 2), (1, 1), 1), "transposed", "strided", True),
}
_LARGE: tuple[Spec, str, str, bool] = (
    ((8, 16, 14, 14), (32, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "contiguous",
    "contiguous",
    True,
)


def _specs(d: dt.DType) -> dict[str, tuple[Spec, str, str, bool]]:
    s = dict(_SPECS)
    if d in FULL:
        s.update(_FULL_SPECS)
    if d is dt.float64:  # many products per output: in float32 the decomposition's rounding exceeds DECOMP_TOL
        s["large"] = _LARGE
    return s


def _conv2d(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, lx: str, lw: str, bias: bool, out: str) -> Builder:
        xs, ws, st, pd, dl, g = spec

        def build(rng: np.random.Generator) -> Call:
            oh, ow = _out_hw(xs, ws, st, pd, dl)
            x = operand(rng, xs, d, lx, _kind(d))
            w = operand(rng, ws, d, lw, _kind(d))
            b = operand(rng, (ws[0],), d, "contiguous", _kind(d)) if bias else None
            rtol, atol = _tol(d, ws[1] * ws[2] * ws[3])
            return Call([Out((xs[0], ws[0], oh, ow), d, out), x, w, b, st, pd, dl, g], rtol, atol)

        return build

    rows = {name: mk(*spec, out="contiguous") for name, spec in _specs(d).items()}
    if d in FULL:
        rows["strided_out"] = mk(*_SPECS["3x3_pad1"], out="strided")
    return rows


def _conv2d_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, lx: str, lw: str, lg: str) -> Builder:
        xs, ws, st, pd, dl, g = spec

        def build(rng: np.random.Generator) -> Call:
            oh, ow = _out_hw(xs, ws, st, pd, dl)
            gs = (xs[0], ws[0], oh, ow)
            outs = [Out(xs, d), Out(ws, d), Out((ws[0],), d)]
            args = [operand(rng, gs, d, lg, _kind(d)), operand(rng, xs, d, lx, _kind(d))]
            args.append(operand(rng, ws, d, lw, _kind(d)))
            rtol, atol = _tol(d, max(xs[0] * oh * ow, ws[0] * ws[2] * ws[3]))
            return Call([*outs, *args, st, pd, dl, g], rtol, atol)

        return build

    return {
        name: mk(spec, lx, lw, "transposed" if bias else "contiguous")
        for name, (spec, lx, lw, bias) in _specs(d).items()
    }


CONV_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "conv2d": (_conv2d, FLOATS),
    "conv2d_backward": (_conv2d_backward, FLOATS),
}
