"""Table rows for the max pooling fused ops: max_pool2d and max_pool2d_backward.

Windows cover the LeNet 2x2/2 case, padding with ceil_mode (a last window hanging over the
edge), stride and dilation, ties (values in steps of 0.5, so the first maximum's index
matters) and non-contiguous inputs and outputs. The backward's indices come from the
forward's definition (the host kernel), so they name real maxima; 1x1 windows with
stride 1 make every element receive exactly one gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kael.backends import dtypes as dt
from kael.backends import host

from ._cases import FLOATS, Call, operand, vals
from ._layout import Operand, Out

__all__ = ["POOL_BUILDERS"]

Builder = Callable[[np.random.Generator], Call]
Pair = tuple[int, int]
FULL = (dt.float32, dt.float64)
# name: (x shape, kernel, stride, padding, dilation, ceil_mode, x layout)
Spec = tuple[tuple[int, int, int, int], Pair, Pair, Pair, Pair, bool, str]
_SPECS: dict[str, Spec] = {
    "2x2_stride2": ((2, 3, 8, 6), (2, 2), (2, 2), (0, 0), (1, 1), False, "contiguous"),
    "3x3_pad1_ceil": ((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), (1, 1), True, "permute:0,2,3,1"),
    "dilated": ((2, 2, 9, 8), (3, 2), (1, 2), (1, 0), (2, 1), False, "strided"),
    "1x1": ((2, 2, 3, 4), (1, 1), (1, 1), (0, 0), (1, 1), False, "transposed"),
}


def _out_len(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = n + 2 * p - d * (k - 1) - 1
    o = (-(-num // s) if ceil_mode else num // s) + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o


def _out_shape(spec: Spec) -> tuple[int, int, int, int]:
    (n, c, h, w), k, s, p, d, cm, _ = spec
    return n, c, _out_len(h, k[0], s[0], p[0], d[0], cm), _out_len(w, k[1], s[1], p[1], d[1], cm)


def _max_pool2d(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, out: str) -> Builder:
        xs, k, s, p, dl, cm, lx = spec

        def build(rng: np.random.Generator) -> Call:
            os_ = _out_shape(spec)
            return Call([Out(os_, d, out), Out(os_, dt.int64, out), operand(rng, xs, d, lx, "halves"), k, s, p, dl, cm])

        return build

    rows = {name: mk(spec, "contiguous") for name, spec in _SPECS.items()}
    if d in FULL:
        rows["strided_out"] = mk(_SPECS["2x2_stride2"], "strided")
        rows["empty_batch"] = mk(((0, 2, 4, 4), (2, 2), (2, 2), (0, 0), (1, 1), False, "contiguous"), "contiguous")
    return rows


def _indices(spec: Spec, rng: np.random.Generator) -> np.ndarray:
    """The indices max_pool2d's definition gives on random values of spec's input."""
    import kael

    xs, k, s, p, dl, cm, _ = spec
    x = kael.tensor(vals(rng, xs, dt.float64, "halves"))
    out, idx = kael.empty(*_out_shape(spec), dtype=kael.float64), kael.empty(*_out_shape(spec), dtype=kael.int64)
    host.kernel("max_pool2d")(out, idx, x, k, s, p, dl, cm)
    return np.asarray(idx.numpy())


def _max_pool2d_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, lg: str) -> Builder:
        xs, k, s, p, dl, _, _ = spec

        def build(rng: np.random.Generator) -> Call:
            args: list[Any] = [
                Out(xs, d),
                operand(rng, _out_shape(spec), d, lg),
                Operand(_indices(spec, rng), dt.int64),
            ]
            return Call([*args, (xs[2], xs[3]), k, s, p, dl])

        return build

    return {name: mk(spec, "transposed" if i % 2 else "contiguous") for i, (name, spec) in enumerate(_SPECS.items())}


POOL_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "max_pool2d": (_max_pool2d, FLOATS),
    "max_pool2d_backward": (_max_pool2d_backward, FLOATS),
}
