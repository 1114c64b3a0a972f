"""max_pool2d and max_pool2d_backward on CUDA: two raw kernels (NOTE [max_pool2d fused op] in kael/ops/_pool_fused.py).

``pool_max2d`` gives each output position one thread that walks its window (positions
outside the input skipped, first maximum kept, first NaN wins) and writes the value and
the flat index ``h*W + w`` in the plane. ``pool_max2d_backward`` gives each input element
one thread that visits the output positions whose window can reach it and adds the
gradients whose index names it: no atomics, so the result is deterministic. 16-bit floats
compute in float32. Under emulation (NOTE [host emulation] in ``_xp``) both run NumPy twins.
``avg_pool2d`` (NOTE [avg_pool2d fused op]) is CuPy array code: the K strided slices of the
zero-padded input summed on the device, divided by the frontend's divisor table; its
backward adds grad / divisor into the same slices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._io import compute_dtype, rd, wr
from ._xp import X, quiet, state

__all__ = ["POOL_KERNELS_SOURCE", "POOL_KERNEL_NAMES", "KERNELS", "max_pool_planes", "max_pool_backward_planes"]

POOL_KERNELS_SOURCE = r"""
// -inf without <cmath> (NVRTC has no INFINITY): from its bits.
template <typename T> __device__ __forceinline__ T pool_neg_inf();
template <> __device__ __forceinline__ float pool_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double pool_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// out, idx [P, OH, OW] from x [P, H, W] (P = N*C planes): one thread per output (grid-stride).
template <typename T>
__global__ void pool_max2d(const T* x, T* out, long long* idx, long long planes, int h, int w, int oh, int ow,
                           int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const long long total = planes * oh * ow;
    for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < total;
         q += (long long)gridDim.x * blockDim.x) {
        const int ox = (int)(q % ow);
        const int oy = (int)((q / ow) % oh);
        const T* src = x + (q / ((long long)oh * ow)) * h * w;
        T best = pool_neg_inf<T>();
        long long at = -1;
        bool nan = false;
        for (int i = 0; i < kh && !nan; ++i) {
            const int iy = oy * sh - ph + i * dh;
            if (iy < 0 || iy >= h) continue;
            for (int j = 0; j < kw; ++j) {
                const int jx = ox * sw - pw + j * dw;
                if (jx < 0 || jx >= w) continue;
                const T v = src[(long long)iy * w + jx];
                if (v != v) {
                    best = v;
                    at = (long long)iy * w + jx;
                    nan = true;
                    break;
                }
                if (v > best || at < 0) {
                    best = v;
                    at = (long long)iy * w + jx;
                }
            }
        }
        out[q] = best;
        idx[q] = at;
    }
}

// dx [P, H, W] = the gradients g [P, OH, OW] whose index names each element: one thread per element.
template <typename T>
__global__ void pool_max2d_backward(const T* g, const long long* idx, T* dx, long long planes, int h, int w, int oh,
                                    int ow, int kh, int kw, int sh, int sw, int ph, int pw, int dh, int dw) {
    const long long total = planes * h * w;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int ix = (int)(e % w);
        const int iy = (int)((e / w) % h);
        const long long plane = e / ((long long)h * w);
        const long long self = (long long)iy * w + ix;
        T s = T(0);
        for (int i = 0; i < kh; ++i) {
            const int ty = iy + ph - i * dh;
            if (ty < 0 || ty % sh != 0 || ty / sh >= oh) continue;
            for (int j = 0; j < kw; ++j) {
                const int tx = ix + pw - j * dw;
                if (tx < 0 || tx % sw != 0 || tx / sw >= ow) continue;
                const long long q = (plane * oh + ty / sh) * ow + tx / sw;
                if (idx[q] == self) s += g[q];
            }
        }
        dx[e] = s;
    }
}
"""
"""The CUDA source of the max pooling kernels (compiled by NVRTC at first use; by nvcc in CI)."""

POOL_KERNEL_NAMES: tuple[str, ...] = tuple(
    f"{k}<{t}>" for k in ("pool_max2d", "pool_max2d_backward") for t in ("float", "double")
)
_THREADS = 256
_MAX_BLOCKS = 65535

_module: Any = None

Window = tuple[int, ...]  # (kh, kw, sh, sw, ph, pw, dh, dw)


def _kernel(name: str, dtype: Any) -> Any:
    global _module
    if _module is None:
        _module = state().cupy.RawModule(
            code=POOL_KERNELS_SOURCE, options=("--std=c++14",), name_expressions=POOL_KERNEL_NAMES
        )
    return _module.get_function(f"{name}<{'double' if dtype == np.float64 else 'float'}>")


def _launch(name: str, total: int, dtype: Any, arrays: tuple[Any, ...], ints: tuple[int, ...]) -> None:
    blocks = max(1, min(_MAX_BLOCKS, (total + _THREADS - 1) // _THREADS))
    planes, *rest = ints
    _kernel(name, dtype)((blocks,), (_THREADS,), (*arrays, np.int64(planes), *(np.int32(v) for v in rest)))


def max_pool_planes(x: Any, out: Any, idx: Any, win: Window) -> None:
    """out [P, OH, OW], idx int64 [P, OH, OW] = max pooling of x [P, H, W] (C-contiguous xp arrays)."""
    planes, h, w = x.shape
    oh, ow = out.shape[1:]
    kh, kw, sh, sw, ph, pw, dh, dw = win
    if out.size == 0:
        return
    if X.emulated:
        best = np.full(out.shape, -np.inf, x.dtype)
        at = np.full(out.shape, -1, np.int64)
        done = np.zeros(out.shape, bool)
        for i in range(kh):
            iy = np.arange(oh) * sh - ph + i * dh
            for j in range(kw):
                jx = np.arange(ow) * sw - pw + j * dw
                inside = ((iy >= 0) & (iy < h))[:, None] & ((jx >= 0) & (jx < w))[None, :]
                vals = x[:, np.clip(iy, 0, h - 1)][:, :, np.clip(jx, 0, w - 1)]
                with np.errstate(invalid="ignore"):
                    take = inside & ~done & (np.isnan(vals) | (vals > best) | (at < 0))
                best = np.where(take, vals, best)
                at = np.where(take, iy[:, None] * w + jx[None, :], at)
                done |= take & np.isnan(vals)
        out[...] = best
        idx[...] = at
        return
    _launch("pool_max2d", out.size, x.dtype, (x, out, idx), (planes, h, w, oh, ow, *win))


def max_pool_backward_planes(g: Any, idx: Any, dx: Any, win: Window) -> None:
    """dx [P, H, W] = each gradient of g [P, OH, OW] added at its index idx (C-contiguous xp arrays)."""
    planes, h, w = dx.shape
    oh, ow = g.shape[1:]
    if dx.size == 0:
        return
    if X.emulated:
        acc = np.zeros((planes, h * w), dx.dtype)
        flat, gi = idx.reshape(planes, -1), g.reshape(planes, -1)
        rows = np.broadcast_to(np.arange(planes)[:, None], flat.shape)
        keep = flat >= 0
        np.add.at(acc, (rows[keep], flat[keep]), gi[keep])
        dx[...] = acc.reshape(dx.shape)
        return
    _launch("pool_max2d_backward", dx.size, dx.dtype, (g, idx, dx), (planes, h, w, oh, ow, *win))


def _win(kernel: Any, stride: Any, padding: Any, dilation: Any) -> Window:
    return (kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1])


def max_pool2d(
    out: Any, indices: Any, x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool
) -> None:
    xp = X.xp
    if out.numel() == 0:
        return
    cd = compute_dtype(x)
    n, c, h, w = x.shape
    xv = xp.ascontiguousarray(rd(x), dtype=cd).reshape(n * c, h, w)
    o = xp.empty((n * c, out.shape[2], out.shape[3]), cd)
    i = xp.empty(o.shape, np.int64)
    max_pool_planes(xv, o, i, _win(kernel, stride, padding, dilation))
    wr(out, o.reshape(out.shape))
    wr(indices, i.reshape(out.shape))


def max_pool2d_backward(
    dx: Any, grad: Any, indices: Any, size: Any, kernel: Any, stride: Any, padding: Any, dilation: Any
) -> None:
    xp = X.xp
    if dx.numel() == 0:
        return
    cd = compute_dtype(grad)
    n, c, oh, ow = grad.shape
    gv = xp.ascontiguousarray(rd(grad), dtype=cd).reshape(n * c, oh, ow)
    iv = xp.ascontiguousarray(rd(indices), dtype=np.int64).reshape(n * c, oh, ow)
    d = xp.empty((n * c, size[0], size[1]), cd)
    max_pool_backward_planes(gv, iv, d, _win(kernel, stride, padding, dilation))
    wr(dx, d.reshape(dx.shape))


def _padded(n: int, c: int, size: Any, out: Any, kernel: Any, stride: Any, padding: Any, dtype: Any) -> Any:
    return X.xp.zeros(
        (
            n,
            c,
            max(size[0] + 2 * padding[0], (out[0] - 1) * stride[0] + kernel[0]),
            max(size[1] + 2 * padding[1], (out[1] - 1) * stride[1] + kernel[1]),
        ),
        dtype,
    )


def _offsets(kernel: Any, stride: Any, out: Any) -> list[tuple[slice, slice]]:
    return [
        (slice(i, i + (out[0] - 1) * stride[0] + 1, stride[0]), slice(j, j + (out[1] - 1) * stride[1] + 1, stride[1]))
        for i in range(kernel[0])
        for j in range(kernel[1])
    ]


def avg_pool2d(out: Any, x: Any, divisors: Any, kernel: Any, stride: Any, padding: Any) -> None:
    """Window sums as K strided slices of the zero-padded input added on the device (CuPy), / the divisor table."""
    if out.numel() == 0:
        return
    cd = compute_dtype(x)
    n, c, h, w = x.shape
    o = (out.shape[2], out.shape[3])
    big = _padded(n, c, (h, w), o, kernel, stride, padding, cd)
    big[:, :, padding[0] : padding[0] + h, padding[1] : padding[1] + w] = rd(x)
    total = X.xp.zeros((n, c) + o, cd)
    for rs, cs in _offsets(kernel, stride, o):
        total += big[:, :, rs, cs]
    wr(out, total / rd(divisors).astype(cd))


def avg_pool2d_backward(dx: Any, grad: Any, divisors: Any, size: Any, kernel: Any, stride: Any, padding: Any) -> None:
    """grad / divisors added into each window's strided slice of a zero-padded plane (on the device), cropped."""
    if dx.numel() == 0:
        return
    cd = compute_dtype(grad)
    n, c, oh, ow = grad.shape
    g = rd(grad).astype(cd) / rd(divisors).astype(cd)
    big = _padded(n, c, size, (oh, ow), kernel, stride, padding, cd)
    for rs, cs in _offsets(kernel, stride, (oh, ow)):
        big[:, :, rs, cs] += g
    wr(dx, big[:, :, padding[0] : padding[0] + size[0], padding[1] : padding[1] + size[1]])


_PLAIN: dict[str, Callable[..., None]] = {
    "max_pool2d": max_pool2d,
    "max_pool2d_backward": max_pool2d_backward,
    "avg_pool2d": avg_pool2d,
    "avg_pool2d_backward": avg_pool2d_backward,
}
KERNELS: dict[str, Callable[..., None]] = {name: quiet(k) for name, k in _PLAIN.items()}
