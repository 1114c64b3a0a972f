"""The max pooling fused ops as plain NumPy math: max_pool2d and max_pool2d_backward (the readable definition).

Kernel offsets are visited row by row; a position replaces the running maximum when it is
inside the input and greater (or the window's first such position), and the first NaN
wins for good, so each output holds its window's first maximum and its flat index
``h * W + w`` in the input plane (-inf and -1 for a window entirely in the padding). The
backward adds every gradient at its index. Average pooling sums each window's positions in
the zero-padded plane and divides by the frontend's divisor table; its backward spreads
grad / divisor over each window. Values are compared and summed in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, wr

__all__ = ["KERNELS"]

Pair = tuple[int, int]


def max_pool2d(
    out: Any, indices: Any, x: Any, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair, ceil_mode: bool
) -> None:
    v = rd(x).astype(np.float64)
    n, c, h, w = v.shape
    oh, ow = out.shape[2], out.shape[3]
    best = np.full((n, c, oh, ow), -np.inf)
    at = np.full((n, c, oh, ow), -1, dtype=np.int64)
    done = np.zeros((n, c, oh, ow), dtype=bool)  # a NaN was found
    for i in range(kernel[0]):
        iy = np.arange(oh) * stride[0] - padding[0] + i * dilation[0]
        for j in range(kernel[1]):
            jx = np.arange(ow) * stride[1] - padding[1] + j * dilation[1]
            inside = ((iy >= 0) & (iy < h))[:, None] & ((jx >= 0) & (jx < w))[None, :]
            vals = v[:, :, np.clip(iy, 0, max(h - 1, 0))][:, :, :, np.clip(jx, 0, max(w - 1, 0))]
            with np.errstate(invalid="ignore"):
                take = inside & ~done & (np.isnan(vals) | (vals > best) | (at < 0))
            best = np.where(take, vals, best)
            at = np.where(take, iy[:, None] * w + jx[None, :], at)
            done |= take & np.isnan(vals)
    wr(out, best)
    wr(indices, at)


def max_pool2d_backward(
    dx: Any, grad: Any, indices: Any, size: Pair, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair
) -> None:
    g = rd(grad).astype(np.float64)
    n, c, oh, ow = g.shape
    idx = rd(indices).reshape(n * c, oh * ow)
    acc = np.zeros((n * c, size[0] * size[1]))
    rows = np.broadcast_to(np.arange(n * c)[:, None], idx.shape)
    keep = idx >= 0
    np.add.at(acc, (rows[keep], idx[keep]), g.reshape(n * c, oh * ow)[keep])
    wr(dx, acc.reshape(n, c, size[0], size[1]))


def _offsets(kernel: Pair, stride: Pair, oh: int, ow: int) -> list[tuple[slice, slice]]:
    """The slices of the padded plane that kernel offset (i, j) reads at every output position."""
    return [
        (slice(i, i + (oh - 1) * stride[0] + 1, stride[0]), slice(j, j + (ow - 1) * stride[1] + 1, stride[1]))
        for i in range(kernel[0])
        for j in range(kernel[1])
    ]


def avg_pool2d(out: Any, x: Any, divisors: Any, kernel: Pair, stride: Pair, padding: Pair) -> None:
    v = rd(x).astype(np.float64)
    n, c, h, w = v.shape
    oh, ow = out.shape[2], out.shape[3]
    ph, pw = padding
    big = np.zeros(
        (n, c, max(h + 2 * ph, (oh - 1) * stride[0] + kernel[0]), max(w + 2 * pw, (ow - 1) * stride[1] + kernel[1]))
    )
    big[:, :, ph : ph + h, pw : pw + w] = v
    total = np.zeros((n, c, oh, ow))
    for rs, cs in _offsets(kernel, stride, oh, ow):
        total += big[:, :, rs, cs]
    wr(out, total / rd(divisors).astype(np.float64))


def avg_pool2d_backward(
    dx: Any, grad: Any, divisors: Any, size: Pair, kernel: Pair, stride: Pair, padding: Pair
) -> None:
    g = rd(grad).astype(np.float64) / rd(divisors).astype(np.float64)
    n, c, oh, ow = g.shape
    ph, pw = padding
    big = np.zeros(
        (
            n,
            c,
            max(size[0] + 2 * ph, (oh - 1) * stride[0] + kernel[0]),
            max(size[1] + 2 * pw, (ow - 1) * stride[1] + kernel[1]),
        )
    )
    for rs, cs in _offsets(kernel, stride, oh, ow):
        big[:, :, rs, cs] += g
    wr(dx, big[:, :, ph : ph + size[0], pw : pw + size[1]])


KERNELS: dict[str, Callable[..., None]] = {
    "max_pool2d": max_pool2d,
    "max_pool2d_backward": max_pool2d_backward,
    "avg_pool2d": avg_pool2d,
    "avg_pool2d_backward": avg_pool2d_backward,
}
