"""The convolution fused ops as plain NumPy math: conv2d and conv2d_backward (the readable definition).

x [N, C, H, W] is zero-padded, then for each kernel offset (i, j) the strided slice
``xp[:, :, i*dh : ... : sh, j*dw : ... : sw]`` is the input every output position sees
through weight[:, :, i, j]; the output is the sum over offsets and a group's channels.
The backward is the adjoint of the same gather: dweight and dbias are sums over the
batch and positions, dx adds each offset's contribution back into the padded input.
Every dtype is computed in float64 and rounded once to the output's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import rd, wr

__all__ = ["KERNELS"]

Pair = tuple[int, int]


def _ct(v: np.ndarray) -> Any:
    """Every dtype is computed in float64 (rounded once on the write): the oracle, not a fast path."""
    return np.float64


def _columns(xp: np.ndarray, kh: int, kw: int, oh: int, ow: int, stride: Pair, dilation: Pair) -> np.ndarray:
    """The padded input xp [N, C, Hp, Wp] gathered as [N, C, KH, KW, OH, OW]."""
    n, c = xp.shape[:2]
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=xp.dtype)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dilation[0], j * dilation[1]
            cols[:, :, i, j] = xp[
                :, :, r0 : r0 + (oh - 1) * stride[0] + 1 : stride[0], c0 : c0 + (ow - 1) * stride[1] + 1 : stride[1]
            ]
    return cols


def _grouped(cols: np.ndarray, groups: int) -> np.ndarray:
    """[N, C, KH, KW, OH, OW] -> [G, N, C/G*KH*KW, OH*OW]."""
    n, c, kh, kw, oh, ow = cols.shape
    return cols.reshape(n, groups, (c // groups) * kh * kw, oh * ow).transpose(1, 0, 2, 3)


def conv2d(out: Any, x: Any, weight: Any, bias: Any, stride: Pair, padding: Pair, dilation: Pair, groups: int) -> None:
    v = rd(x)
    ct = _ct(v)
    w = rd(weight).astype(ct)
    o, _, kh, kw = w.shape
    n = v.shape[0]
    oh, ow = out.shape[2], out.shape[3]
    xp = np.pad(v.astype(ct), ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    cols = _grouped(_columns(xp, kh, kw, oh, ow, stride, dilation), groups)  # [G, N, Kg, P]
    wg = w.reshape(groups, o // groups, -1)  # [G, Og, Kg]
    y = np.einsum("gok,gnkp->ngop", wg, cols).reshape(n, o, oh, ow)
    if bias is not None:
        y = y + rd(bias).astype(ct)[:, None, None]
    wr(out, y)


def conv2d_backward(
    dx: Any,
    dweight: Any,
    dbias: Any,
    grad: Any,
    x: Any,
    weight: Any,
    stride: Pair,
    padding: Pair,
    dilation: Pair,
    groups: int,
) -> None:
    v = rd(x)
    ct = _ct(v)
    g = rd(grad).astype(ct)
    w = rd(weight).astype(ct)
    o, cg, kh, kw = w.shape
    n, c, h, wd = v.shape
    oh, ow = g.shape[2], g.shape[3]
    gg = g.reshape(n, groups, o // groups, oh * ow).transpose(1, 0, 2, 3)  # [G, N, Og, P]
    if dbias is not None:
        wr(dbias, g.sum(axis=(0, 2, 3), dtype=np.float64))
    if dweight is not None:
        xp = np.pad(v.astype(ct), ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
        cols = _grouped(_columns(xp, kh, kw, oh, ow, stride, dilation), groups)
        wr(dweight, np.einsum("gnop,gnkp->gok", gg, cols).reshape(w.shape))
    if dx is not None:
        wg = w.reshape(groups, o // groups, cg * kh * kw)
        dcols = np.einsum("gok,gnop->gnkp", wg, gg)  # [G, N, Kg, P]
        dcols = dcols.transpose(1, 0, 2, 3).reshape(n, c, kh, kw, oh, ow)
        dxp = np.zeros((n, c, h + 2 * padding[0], wd + 2 * padding[1]), dtype=ct)
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation[0], j * dilation[1]
                dxp[
                    :, :, r0 : r0 + (oh - 1) * stride[0] + 1 : stride[0], c0 : c0 + (ow - 1) * stride[1] + 1 : stride[1]
                ] += dcols[:, :, i, j]
        wr(dx, dxp[:, :, padding[0] : padding[0] + h, padding[1] : padding[1] + wd])


KERNELS: dict[str, Callable[..., None]] = {"conv2d": conv2d, "conv2d_backward": conv2d_backward}
