"""Table rows for the pooling fused ops: max_pool2d, avg_pool2d and their backwards.

Windows cover the LeNet 2x2/2 case, padding with ceil_mode (a last window hanging over the
edge), stride and dilation, ties (values in steps of 0.5, so the first maximum's index
matters) and non-contiguous inputs and outputs. The backward's indices come from the
forward's definition (the host kernel), so they name real maxima; 1x1 windows with
stride 1 make every element receive exactly one gradient. avg_pool2d rows take PyTorch's
divisor tables, with and without count_include_pad.
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


def _divisors(spec: Spec, include_pad: bool) -> np.ndarray:
    """PyTorch's avg_pool2d divisors for spec's windows (count_include_pad or not)."""
    (_, _, h, w), k, s, p, _, _, _ = spec
    _, _, oh, ow = _out_shape(spec)
    per = []
    for n, kk, ss, pp, o in ((h, k[0], s[0], p[0], oh), (w, k[1], s[1], p[1], ow)):
        start = np.arange(o) * ss - pp
        end = np.minimum(start + kk, n + pp)
        per.append((end - start) if include_pad else (np.minimum(end, n) - np.maximum(start, 0)))
    out: np.ndarray = np.multiply.outer(per[0], per[1]).astype(np.float64)
    return out


# avg_pool2d has no dilation: its rows are the specs with dilation 1
_AVG = {name: spec for name, spec in _SPECS.items() if spec[4] == (1, 1)}


def _avg_pool2d(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, include_pad: bool) -> Builder:
        xs, k, s, p, _, _, lx = spec

        def build(rng: np.random.Generator) -> Call:
            div = Operand(_divisors(spec, include_pad), dt.float64)
            return Call([Out(_out_shape(spec), d), operand(rng, xs, d, lx, _kind(d)), div, k, s, p])

        return build

    return {
        f"{name}_{'incl' if inc else 'excl'}": mk(spec, inc) for name, spec in _AVG.items() for inc in (True, False)
    }


def _avg_pool2d_backward(d: dt.DType) -> dict[str, Builder]:
    def mk(spec: Spec, include_pad: bool) -> Builder:
        xs, k, s, p, _, _, _ = spec

        def build(rng: np.random.Generator) -> Call:
            div = Operand(_divisors(spec, include_pad), dt.float64)
            g = operand(rng, _out_shape(spec), d, "transposed", _kind(d))
            return Call([Out(xs, d), g, div, (xs[2], xs[3]), k, s, p])

        return build

    return {
        f"{name}_{'incl' if inc else 'excl'}": mk(spec, inc) for name, spec in _AVG.items() for inc in (True, False)
    }


def _kind(d: dt.DType) -> str:
    return "unit" if d.itemsize == 2 else "normal"


POOL_BUILDERS: dict[str, tuple[Callable[[dt.DType], dict[str, Builder]], tuple[dt.DType, ...]]] = {
    "max_pool2d": (_max_pool2d, FLOATS),
    "max_pool2d_backward": (_max_pool2d_backward, FLOATS),
    "avg_pool2d": (_avg_pool2d, FLOATS),
    "avg_pool2d_backward": (_avg_pool2d_backward, FLOATS),
}
