"""conv2d and conv2d_backward on CUDA: raw im2col / col2im kernels around cuBLAS batched matmuls.

The layout is the CPU backend's (NOTE [conv2d columns] in kael_backend_cpu/csrc/conv.cpp):
x [N, C, H, W] unfolds into columns [C*KH*KW, N*P] (P = OH*OW; row (c*KH + i)*KW + j,
column n*P + oy*OW + ox; zeros in the padding), so group g's rows are one contiguous
block and the whole batch is one ``xp.matmul`` of [G, O/G, Kg] by [G, Kg, N*P] (cuBLAS).
The backward multiplies the transposed operands and folds the column gradient back with
``conv_col2im``, which gives each input element one thread that gathers every column
entry reading it (no atomics, so the result is deterministic); dbias is a sum over dims
(0, 2, 3). 16-bit floats compute in float32. Under emulation (NOTE [host emulation] in
``_xp``) the two raw kernels run their NumPy twins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import compute_dtype, rd, wr
from ._xp import X, quiet, state

__all__ = ["CONV_KERNELS_SOURCE", "CONV_KERNEL_NAMES", "KERNELS", "im2col", "col2im"]

CONV_KERNELS_SOURCE = r"""
// cols [C*KH*KW, N*OH*OW] from x [N, C, H, W]: one thread per column entry (grid-stride).
template <typename T>
__global__ void conv_im2col(const T* x, T* cols, int n, int c, int h, int w, int kh, int kw, int oh, int ow,
                            int sh, int sw, int ph, int pw, int dh, int dw) {
    const long long total = (long long)c * kh * kw * n * oh * ow;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int ox = (int)(idx % ow);
        long long t = idx / ow;
        const int oy = (int)(t % oh);
        t /= oh;
        const int b = (int)(t % n);
        t /= n;
        const int j = (int)(t % kw);
        t /= kw;
        const int i = (int)(t % kh);
        const int ch = (int)(t / kh);
        const int iy = oy * sh - ph + i * dh, ix = ox * sw - pw + j * dw;
        cols[idx] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? x[(((long long)b * c + ch) * h + iy) * w + ix] : T(0);
    }
}

// dx [N, C, H, W] = the columns [C*KH*KW, N*OH*OW] folded back: one thread per input element
// sums the column entries that read it.
template <typename T>
__global__ void conv_col2im(const T* cols, T* dx, int n, int c, int h, int w, int kh, int kw, int oh, int ow,
                            int sh, int sw, int ph, int pw, int dh, int dw) {
    const long long total = (long long)n * c * h * w;
    const long long np = (long long)n * oh * ow;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int ix = (int)(idx % w);
        long long t = idx / w;
        const int iy = (int)(t % h);
        t /= h;
        const int ch = (int)(t % c);
        const int b = (int)(t / c);
        T s = T(0);
        for (int i = 0; i < kh; ++i) {
            const int ty = iy + ph - i * dh;
            if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
            for (int j = 0; j < kw; ++j) {
                const int tx = ix + pw - j * dw;
                if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
                const long long row = ((long long)ch * kh + i) * kw + j;
                s += cols[row * np + (long long)b * oh * ow + (long long)(ty / sh) * ow + tx / sw];
            }
        }
        dx[idx] = s;
    }
}
"""
"""The CUDA source of the convolution kernels (compiled by NVRTC at first use; by nvcc in CI)."""

CONV_KERNEL_NAMES: tuple[str, ...] = tuple(
    f"{k}<{t}>" for k in ("conv_im2col", "conv_col2im") for t in ("float", "double")
)
_THREADS = 256
_MAX_BLOCKS = 65535

_module: Any = None

Geom = tuple[int, ...]  # (n, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw)


def _kernel(name: str, dtype: Any) -> Any:
    global _module
    if _module is None:
        _module = state().cupy.RawModule(
            code=CONV_KERNELS_SOURCE, options=("--std=c++14",), name_expressions=CONV_KERNEL_NAMES
        )
    return _module.get_function(f"{name}<{'double' if dtype == np.float64 else 'float'}>")


def _launch(name: str, total: int, dtype: Any, arrays: tuple[Any, ...], g: Geom) -> None:
    blocks = max(1, min(_MAX_BLOCKS, (total + _THREADS - 1) // _THREADS))
    _kernel(name, dtype)((blocks,), (_THREADS,), (*arrays, *(np.int32(v) for v in g)))


def _windows(g: Geom) -> list[tuple[int, int, slice, slice]]:
    """(i, j, rows, cols) per kernel offset: the slices of the padded input that offset reads."""
    _, _, _, _, kh, kw, oh, ow, sh, sw, _, _, dh, dw = g
    return [
        (i, j, slice(i * dh, i * dh + (oh - 1) * sh + 1, sh), slice(j * dw, j * dw + (ow - 1) * sw + 1, sw))
        for i in range(kh)
        for j in range(kw)
    ]


def im2col(x: Any, cols: Any, g: Geom) -> None:
    """cols [C*KH*KW, N*OH*OW] = the columns of x [N, C, H, W] (both C-contiguous, one float dtype)."""
    n, c, _, _, kh, kw, oh, ow, _, _, ph, pw, _, _ = g
    if cols.size == 0:
        return
    if X.emulated:
        xp_ = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        out = cols.reshape(c, kh, kw, n, oh, ow)
        for i, j, rs, cs in _windows(g):
            out[:, i, j] = xp_[:, :, rs, cs].transpose(1, 0, 2, 3)
        return
    _launch("conv_im2col", cols.size, x.dtype, (x, cols), g)


def col2im(cols: Any, dx: Any, g: Geom) -> None:
    """dx [N, C, H, W] = the columns [C*KH*KW, N*OH*OW] folded back (the adjoint of im2col)."""
    n, c, h, w, kh, kw, oh, ow, _, _, ph, pw, _, _ = g
    if dx.size == 0:
        return
    if X.emulated:
        acc = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dx.dtype)
        src = cols.reshape(c, kh, kw, n, oh, ow)
        for i, j, rs, cs in _windows(g):
            acc[:, :, rs, cs] += src[:, i, j].transpose(1, 0, 2, 3)
        dx[...] = acc[:, :, ph : ph + h, pw : pw + w]
        return
    _launch("conv_col2im", dx.size, dx.dtype, (cols, dx), g)


def _geom(x: Any, weight: Any, grad_or_out: Any, stride: Any, padding: Any, dilation: Any) -> Geom:
    n, c, h, w = x.shape
    _, _, kh, kw = weight.shape
    oh, ow = grad_or_out.shape[2], grad_or_out.shape[3]
    return (n, c, h, w, kh, kw, oh, ow, stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


def conv2d(out: Any, x: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> None:
    xp = X.xp
    if out.numel() == 0:
        return
    cd = compute_dtype(x, weight)
    g = _geom(x, weight, out, stride, padding, dilation)
    n, c, _, _, kh, kw, oh, ow = g[:8]
    o = weight.shape[0]
    kg = c // groups * kh * kw
    cols = xp.empty((c * kh * kw, n * oh * ow), cd)
    im2col(xp.ascontiguousarray(rd(x), dtype=cd), cols, g)
    wv = xp.ascontiguousarray(rd(weight), dtype=cd).reshape(groups, o // groups, kg)
    y = xp.matmul(wv, cols.reshape(groups, kg, n * oh * ow)).reshape(o, n, oh, ow).transpose(1, 0, 2, 3)
    if bias is not None:
        y = y + rd(bias).astype(cd)[:, None, None]
    wr(out, y)


def conv2d_backward(
    dx: Any,
    dweight: Any,
    dbias: Any,
    grad: Any,
    x: Any,
    weight: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> None:
    xp = X.xp
    cd = compute_dtype(x, weight)
    g = _geom(x, weight, grad, stride, padding, dilation)
    n, c, h, w, kh, kw, oh, ow = g[:8]
    o = weight.shape[0]
    kg, np_ = c // groups * kh * kw, n * oh * ow
    gv = xp.ascontiguousarray(rd(grad).astype(cd).transpose(1, 0, 2, 3)).reshape(groups, o // groups, np_)
    if dbias is not None:
        wr(dbias, gv.reshape(o, np_).sum(axis=1))
    if dweight is not None:
        cols = xp.empty((c * kh * kw, np_), cd)
        im2col(xp.ascontiguousarray(rd(x), dtype=cd), cols, g)
        wr(dweight, xp.matmul(gv, cols.reshape(groups, kg, np_).transpose(0, 2, 1)).reshape(weight.shape))
    if dx is not None:
        wv = xp.ascontiguousarray(rd(weight), dtype=cd).reshape(groups, o // groups, kg)
        dcols = xp.ascontiguousarray(xp.matmul(wv.transpose(0, 2, 1), gv)).reshape(c * kh * kw, np_)
        dxv = xp.empty((n, c, h, w), cd)
        col2im(dcols, dxv, g)
        wr(dx, dxv)


_PLAIN: dict[str, Callable[..., None]] = {"conv2d": conv2d, "conv2d_backward": conv2d_backward}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
