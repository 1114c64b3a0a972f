"""The fused CUDA kernels (CUDA C compiled by CuPy with NVRTC) and their NumPy twins.

On a GPU each launcher below runs a ``cupy.RawModule`` kernel (row-wise kernels: one
thread block per row, block-wide reductions with warp shuffles) or a
``cupy.ElementwiseKernel`` (pointwise kernels, which honour arbitrary strides).
Under emulation (NOTE [host emulation] in ``_xp``) the same launcher runs the NumPy
twin, which does the same arithmetic in the same dtype; twins are used only then.

The Llama family's kernels: ``rms_norm_rows`` (a row reduction like layer norm),
``rope_rows`` (one block per [b, h, t] row, a thread per rotated pair, the table rows
picked by the token's position) and the pointwise ``silu_mul``. Grouped-query attention
needs no kernel of its own: the glue stacks each kv head's query heads on its rows, so
``attention_softmax`` runs unchanged on the [B, H, Tq, Tk] scores. ``paged_attention_rows``
is the whole of attention over a paged KV cache (one block per query row, reading each key
and value in place in its block; NOTE [paged attention] in ``kael/ops/_attention_fused.py``).

Elementwise catalogue ops with a source here (erf, silu) launch through ``pointwise(op,
*inputs, out)``; their NumPy twin is the op's own definition (``Pointwise.compute``).

Contract of every launcher: arrays are xp arrays of one float dtype (float32 or float64,
the kernel's ``T``); row-wise kernels take C-contiguous 2-D ``[rows, cols]`` arrays and
need rows >= 1 and cols >= 1 (the glue in ``_fused`` handles empty shapes); outputs are
preallocated and written in place (an output may be its input). Index arrays are int64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from kael.backends import catalogue

from ._xp import X, state

__all__ = [
    "ROW_KERNELS_SOURCE",
    "ELEMENTWISE_SOURCES",
    "softmax_rows",
    "layer_norm_rows",
    "layer_norm_backward_rows",
    "cross_entropy_rows",
    "attention_softmax",
    "rms_norm_rows",
    "rope_rows",
    "paged_attention_rows",
    "silu_mul",
    "gelu",
    "gelu_backward",
    "adamw",
    "erf",
    "pointwise",
    "row_kernel_names",
]

# --------------------------------------------------------------------------------------------------
# CUDA C: row-wise kernels, templated on T (float or double), one block per row.
# --------------------------------------------------------------------------------------------------
ROW_KERNELS_SOURCE = r"""
template <typename T> __device__ __forceinline__ T kael_neg_inf();
template <> __device__ __forceinline__ float kael_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double kael_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}
template <typename T> __device__ __forceinline__ T kael_nan();
template <> __device__ __forceinline__ float kael_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double kael_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000ULL);
}

// max that propagates NaN, like NumPy's max.
template <typename T> __device__ __forceinline__ T kael_max(T a, T b) { return (a > b || a != a) ? a : b; }

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = kael_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum / max; blockDim.x is a multiple of 32 (<= 1024); buf holds 32 values.
// The leading __syncthreads lets a block call these back to back with the same buf.
template <typename T> __device__ T block_sum(T v, T* buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? buf[lane] : T(0);
        w = warp_sum(w);
        if (lane == 0) buf[0] = w;
    }
    __syncthreads();
    return buf[0];
}

template <typename T> __device__ T block_max(T v, T* buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? buf[lane] : kael_neg_inf<T>();
        w = warp_max(w);
        if (lane == 0) buf[0] = w;
    }
    __syncthreads();
    return buf[0];
}

// y[r, :] = softmax(x[r, :]) or log_softmax. x, y: [rows, cols]; y may be x.
template <typename T>
__global__ void softmax_rows(const T* x, T* y, int cols, int log_out) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    T m = kael_neg_inf<T>();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = kael_max(m, xr[j]);
    m = block_max(m, buf);
    T s = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += exp(xr[j] - m);
    s = block_sum(s, buf);
    if (log_out) {
        const T ls = log(s);
        for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - m) - ls;
    } else {
        for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = exp(xr[j] - m) / s;
    }
}

// y = (x - mean) * rstd * w + b over each row; mean, rstd: [rows]. w, b: [cols], read when has_w / has_b.
template <typename T>
__global__ void layer_norm_rows(const T* x, const T* w, const T* b, T* y, T* mean, T* rstd, int cols, T eps,
                                int has_w, int has_b) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    T s = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
    const T mu = block_sum(s, buf) / T(cols);
    T v = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const T d = xr[j] - mu;
        v += d * d;
    }
    const T var = block_sum(v, buf) / T(cols);
    const T r = T(1) / sqrt(var + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        T o = (xr[j] - mu) * r;
        if (has_w) o *= w[j];
        if (has_b) o += b[j];
        yr[j] = o;
    }
    if (threadIdx.x == 0) {
        mean[row] = mu;
        rstd[row] = r;
    }
}

// dx for layer norm: dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), gw = g * w.
template <typename T>
__global__ void layer_norm_backward_rows(const T* g, const T* x, const T* mean, const T* rstd, const T* w, T* dx,
                                         int cols, int has_w) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const T* gr = g + row * cols;
    const T* xr = x + row * cols;
    T* dr = dx + row * cols;
    const T mu = mean[row], r = rstd[row];
    T s1 = T(0), s2 = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const T gw = has_w ? gr[j] * w[j] : gr[j];
        s1 += gw;
        s2 += gw * ((xr[j] - mu) * r);
    }
    s1 = block_sum(s1, buf) / T(cols);
    s2 = block_sum(s2, buf) / T(cols);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const T gw = has_w ? gr[j] * w[j] : gr[j];
        const T xhat = (xr[j] - mu) * r;
        dr[j] = r * (gw - s1 - xhat * s2);
    }
}

// losses[r] = logsumexp(z[r]) - z[r, t] (with label smoothing), 0 where t == ignore_index, NaN for t out of range.
template <typename T>
__global__ void cross_entropy_rows(const T* logits, const long long* target, T* losses, int cols,
                                   long long ignore_index, T smoothing) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const long long t = target[row];
    if (t == ignore_index) {  // uniform across the block, so returning early is safe
        if (threadIdx.x == 0) losses[row] = T(0);
        return;
    }
    const T* zr = logits + row * cols;
    T m = kael_neg_inf<T>();
    for (int j = threadIdx.x; j < cols; j += blockDim.x) m = kael_max(m, zr[j]);
    m = block_max(m, buf);
    T s = T(0), sz = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        s += exp(zr[j] - m);
        sz += zr[j];
    }
    s = block_sum(s, buf);
    if (smoothing != T(0)) sz = block_sum(sz, buf);
    if (threadIdx.x == 0) {
        const T lse = m + log(s);
        T nll = (t >= 0 && t < cols) ? lse - zr[t] : kael_nan<T>();
        if (smoothing != T(0)) nll = (T(1) - smoothing) * nll - smoothing * (sz / T(cols) - lse);
        losses[row] = nll;
    }
}

// In place on scores [B*H*Tq, Tk]: p = softmax(scale * s) over the keys each query may see, 0 elsewhere.
// Query i of Tq sees key j when j <= i + Tk - Tq (causal; the last query is aligned with the last key of
// the KV cache) and j < lengths[b]. A row that sees no key is all zeros.
template <typename T>
__global__ void attention_softmax(T* scores, const long long* lengths, int rows_per_batch, int tq, int tk, T scale,
                                  int causal, int has_lengths) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const int b = (int)(row / rows_per_batch);
    const int i = (int)(row % tq);
    T* sr = scores + row * tk;
    long long limit = tk;
    if (causal) limit = min(limit, (long long)i + (tk - tq) + 1);
    if (has_lengths) limit = min(limit, lengths[b]);
    if (limit < 0) limit = 0;
    const int n = (int)limit;
    T m = kael_neg_inf<T>();
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = kael_max(m, sr[j] * scale);
    m = block_max(m, buf);
    T s = T(0);
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += exp(sr[j] * scale - m);
    s = block_sum(s, buf);
    for (int j = threadIdx.x; j < tk; j += blockDim.x) sr[j] = j < n ? exp(sr[j] * scale - m) / s : T(0);
}

// RMSNorm (Hugging Face's LlamaRMSNorm) over each row: rstd[r] = 1/sqrt(mean(x^2) + eps), y = x * rstd * w.
// x, y: [rows, cols]; w: [cols], read when has_w (the glue passes has_w = 0 for 16-bit inputs, whose
// normalised value must be rounded to the input dtype before the weight is applied).
template <typename T>
__global__ void rms_norm_rows(const T* x, const T* w, T* y, T* rstd, int cols, T eps, int has_w) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    T s = T(0);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j] * xr[j];
    const T r = T(1) / sqrt(block_sum(s, buf) / T(cols) + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = has_w ? (xr[j] * r) * w[j] : xr[j] * r;
    if (threadIdx.x == 0) rstd[row] = r;
}

// Rotary embedding (rotate-half) of x [B*H*T rows, 2*half] (C-contiguous, row = (b*H + h)*T + t) at
// positions pos [B, T] of the tables cos, sin [P, half]: y[.., j] = x1*c - x2*s, y[.., half+j] = x2*c + x1*s.
// One block per row, a thread per rotated pair; positions were range-checked by the frontend.
template <typename T>
__global__ void rope_rows(const T* x, const T* cos_t, const T* sin_t, const long long* pos, T* y, int heads,
                          int t, int half) {
    const long long row = blockIdx.x;
    const long long b = row / ((long long)heads * t);
    const long long p = pos[b * t + row % t];
    const T* xr = x + row * 2 * half;
    T* yr = y + row * 2 * half;
    const T* cr = cos_t + p * half;
    const T* sr = sin_t + p * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const T x1 = xr[j], x2 = xr[j + half], c = cr[j], s = sr[j];
        yr[j] = x1 * c - x2 * s;
        yr[j + half] = x2 * c + x1 * s;
    }
}

// Causal attention over a paged KV cache (NOTE [paged attention] in kael/ops/_attention_fused.py), one block per
// query row = (b*H + h)*Tq + i of out [B*H*Tq, D]. q [B, H, Tq, D], cache [NB, 2, Hkv, S, D] (block n's keys
// at [n, 0], values at [n, 1]), table [B, M], lengths [B]: all C-contiguous. Position p of row b is slot p % S
// of block table[b, p / S]; query i sees positions 0..lengths[b]-Tq+i (at least one: lengths[b] >= Tq, and
// every block id in use is in range, both checked by the frontend). scratch [B*H*Tq, M*S] holds the row's
// scores, then exp(score - max); each output element is sum_p (e_p / sum) * v_p, as the reference computes.
template <typename T>
__global__ void paged_attention_rows(const T* q, const T* cache, const long long* table, const long long* lengths,
                                     T* out, T* scratch, int heads, int kv_heads, int tq, int d, int s, int m,
                                     T scale) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const long long b = row / ((long long)heads * tq);
    const int h = (int)((row / tq) % heads);
    const int i = (int)(row % tq);
    const int j = h / (heads / kv_heads);  // the kv head of query head h (grouped-query attention)
    const int n = (int)(lengths[b] - tq + i + 1);
    const T* qr = q + row * d;
    const long long* blocks = table + b * m;
    T* sr = scratch + row * ((long long)m * s);
    const long long head_stride = (long long)s * d;  // one kv head of one block
    const long long block_stride = 2LL * kv_heads * head_stride;
    T mx = kael_neg_inf<T>();
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const T* kp = cache + blocks[p / s] * block_stride + j * head_stride + (long long)(p % s) * d;
        T acc = T(0);
        for (int c = 0; c < d; ++c) acc += qr[c] * kp[c];
        const T z = acc * scale;
        sr[p] = z;
        mx = kael_max(mx, z);
    }
    mx = block_max(mx, buf);
    T sum = T(0);
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
        const T e = exp(sr[p] - mx);
        sr[p] = e;
        sum += e;
    }
    sum = block_sum(sum, buf);  // its barriers also publish every thread's e to the block
    const T* vbase = cache + (long long)(kv_heads + j) * head_stride;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        T acc = T(0);
        for (int p = 0; p < n; ++p) {
            acc += (sr[p] / sum) * vbase[blocks[p / s] * block_stride + (long long)(p % s) * d + c];
        }
        out[row * d + c] = acc;
    }
}
"""

_ROW_KERNELS = (
    "softmax_rows",
    "layer_norm_rows",
    "layer_norm_backward_rows",
    "cross_entropy_rows",
    "attention_softmax",
    "rms_norm_rows",
    "rope_rows",
    "paged_attention_rows",
)


def row_kernel_names() -> list[str]:
    """The template instantiations compiled from ROW_KERNELS_SOURCE (CuPy's name_expressions)."""
    return [f"{k}<{t}>" for k in _ROW_KERNELS for t in ("float", "double")]


# --------------------------------------------------------------------------------------------------
# CUDA C: pointwise kernels (cupy.ElementwiseKernel: in_params, out_params, operation).
# --------------------------------------------------------------------------------------------------
# An entry named after an elementwise catalogue op (erf, silu) is that op's kernel (inputs T x..., output T y).
ELEMENTWISE_SOURCES: dict[str, tuple[str, str, str]] = {
    "erf": ("T x", "T y", "y = erf(x);"),
    "silu": ("T x", "T y", "y = x / ((T)1 + exp(-x));"),
    "silu_mul": ("T g, T u", "T y", "y = g / ((T)1 + exp(-g)) * u;"),
    "gelu": (
        "T x, int32 approx_tanh",
        "T y",
        """
        if (approx_tanh) {
            const T inner = (T)0.7978845608028654 * (x + (T)0.044715 * x * x * x);
            y = (T)0.5 * x * ((T)1 + tanh(inner));
        } else {
            y = (T)0.5 * x * ((T)1 + erf(x * (T)0.7071067811865476));
        }""",
    ),
    "gelu_backward": (
        "T g, T x, int32 approx_tanh",
        "T dx",
        """
        if (approx_tanh) {
            const T x2 = x * x;
            const T t = tanh((T)0.7978845608028654 * (x + (T)0.044715 * x * x2));
            const T d = (T)0.5 * ((T)1 + t)
                      + (T)0.5 * x * ((T)1 - t * t) * (T)0.7978845608028654 * ((T)1 + (T)(3 * 0.044715) * x2);
            dx = g * d;
        } else {
            const T cdf = (T)0.5 * ((T)1 + erf(x * (T)0.7071067811865476));
            const T pdf = exp((T)-0.5 * x * x) * (T)0.3989422804014327;
            dx = g * (cdf + x * pdf);
        }""",
    ),
    "adamw": (
        "T g, float64 lr, float64 beta1, float64 beta2, float64 eps, float64 decay, float64 bc1, float64 bc2",
        "T p, T m, T v",
        """
        const T mm = (T)beta1 * m + (T)(1 - beta1) * g;
        const T vv = (T)beta2 * v + (T)(1 - beta2) * g * g;
        m = mm;
        v = vv;
        const T pp = p * (T)(1 - lr * decay);
        p = pp - (T)lr * (mm / (T)bc1) / (sqrt(vv / (T)bc2) + (T)eps);""",
    ),
}

# --------------------------------------------------------------------------------------------------
# Compiled-kernel caches (GPU only).
# --------------------------------------------------------------------------------------------------
_module: Any = None
_elementwise: dict[str, Any] = {}


def _row_kernel(name: str, dtype: Any) -> Any:
    global _module
    if _module is None:
        cupy = state().cupy
        _module = cupy.RawModule(code=ROW_KERNELS_SOURCE, options=("--std=c++14",), name_expressions=row_kernel_names())
    return _module.get_function(f"{name}<{'double' if dtype == np.float64 else 'float'}>")


def _ew(name: str) -> Any:
    k = _elementwise.get(name)
    if k is None:
        ins, outs, body = ELEMENTWISE_SOURCES[name]
        k = state().cupy.ElementwiseKernel(ins, outs, body, f"kael_{name}")
        _elementwise[name] = k
    return k


def _block(cols: int) -> int:
    """Threads per block for a row of `cols` elements: a multiple of 32, at most 1024."""
    n = 32
    while n < cols and n < 1024:
        n *= 2
    return n


def _launch(name: str, rows: int, cols: int, dtype: Any, args: tuple[Any, ...]) -> None:
    _row_kernel(name, dtype)((rows,), (_block(cols),), args)


def _scalar(dtype: Any, v: float) -> Any:
    return np.float64(v) if dtype == np.float64 else np.float32(v)


# --------------------------------------------------------------------------------------------------
# Launchers (GPU) and NumPy twins (emulation).
# --------------------------------------------------------------------------------------------------
def _nanmax(x: np.ndarray) -> np.ndarray:
    return np.max(x, axis=-1, keepdims=True)  # NumPy's max propagates NaN, like kael_max


def softmax_rows(x: Any, y: Any, log: bool) -> None:
    """y = softmax(x) (or log_softmax) along the last axis. x, y: [rows, cols]."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            m = _nanmax(x)
            s = np.sum(np.exp(x - m), axis=-1, keepdims=True)
            y[...] = (x - m) - np.log(s) if log else np.exp(x - m) / s
        return
    _launch("softmax_rows", rows, cols, x.dtype, (x, y, np.int32(cols), np.int32(log)))


def layer_norm_rows(x: Any, w: Any, b: Any, y: Any, mean: Any, rstd: Any, eps: float) -> None:
    """y = (x - mean) * rstd * w + b per row; also writes mean, rstd [rows]. w, b: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            mu = np.sum(x, axis=-1) / x.dtype.type(cols)
            d = x - mu[:, None]
            var = np.sum(d * d, axis=-1) / x.dtype.type(cols)
            r = x.dtype.type(1) / np.sqrt(var + x.dtype.type(eps))
            o = d * r[:, None]
            if w is not None:
                o = o * w
            if b is not None:
                o = o + b
            y[...] = o
            mean[...] = mu
            rstd[...] = r
        return
    _launch(
        "layer_norm_rows",
        rows,
        cols,
        x.dtype,
        (
            x,
            w if w is not None else x,
            b if b is not None else x,
            y,
            mean,
            rstd,
            np.int32(cols),
            _scalar(x.dtype, eps),
            np.int32(w is not None),
            np.int32(b is not None),
        ),
    )


def layer_norm_backward_rows(g: Any, x: Any, mean: Any, rstd: Any, w: Any, dx: Any) -> None:
    """dx of layer norm per row. g, x, dx: [rows, cols]; mean, rstd: [rows]; w: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            r = rstd[:, None]
            xhat = (x - mean[:, None]) * r
            gw = g * w if w is not None else g
            s1 = np.sum(gw, axis=-1, keepdims=True) / x.dtype.type(cols)
            s2 = np.sum(gw * xhat, axis=-1, keepdims=True) / x.dtype.type(cols)
            dx[...] = r * (gw - s1 - xhat * s2)
        return
    _launch(
        "layer_norm_backward_rows",
        rows,
        cols,
        x.dtype,
        (g, x, mean, rstd, w if w is not None else x, dx, np.int32(cols), np.int32(w is not None)),
    )


def cross_entropy_rows(logits: Any, target: Any, losses: Any, ignore_index: int, smoothing: float) -> None:
    """losses[r] = -log_softmax(logits[r])[target[r]] (label-smoothed), 0 where target == ignore_index."""
    rows, cols = logits.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            one = logits.dtype.type
            m = _nanmax(logits)
            lse = (m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True)))[:, 0]
            valid = (target >= 0) & (target < cols)
            picked = logits[np.arange(rows), np.where(valid, target, 0)]
            nll = np.where(valid, lse - picked, one(np.nan))
            if smoothing:
                s = one(smoothing)
                nll = (one(1) - s) * nll - s * (np.sum(logits, axis=-1) / one(cols) - lse)
            losses[...] = np.where(target == ignore_index, one(0), nll)
        return
    _launch(
        "cross_entropy_rows",
        rows,
        cols,
        logits.dtype,
        (logits, target, losses, np.int32(cols), np.int64(ignore_index), _scalar(logits.dtype, smoothing)),
    )


def attention_softmax(scores: Any, lengths: Any, heads: int, tq: int, scale: float, causal: bool) -> None:
    """In place on scores [B, H, Tq, Tk]: masked, scaled softmax over the keys (see the CUDA source)."""
    b, h, _, tk = scores.shape
    rows = b * h * tq
    if X.emulated:
        with np.errstate(all="ignore"):
            one = scores.dtype.type
            limit = np.full((b, 1, tq, 1), tk, dtype=np.int64)
            if causal:
                limit = np.minimum(limit, (np.arange(tq) + (tk - tq) + 1)[None, None, :, None])
            if lengths is not None:
                limit = np.minimum(limit, lengths[:, None, None, None])
            keep = np.arange(tk)[None, None, None, :] < limit
            s = np.where(keep, scores * one(scale), one(-np.inf))
            m = np.max(s, axis=-1, keepdims=True)
            e = np.where(keep, np.exp(s - m), one(0))
            den = np.sum(e, axis=-1, keepdims=True)
            scores[...] = np.where(keep, e / np.where(den == 0, one(1), den), one(0))
        return
    lens = lengths if lengths is not None else X.xp.zeros(1, np.int64)  # unread when has_lengths == 0
    _launch(
        "attention_softmax",
        rows,
        tk,
        scores.dtype,
        (
            scores,
            lens,
            np.int32(heads * tq),
            np.int32(tq),
            np.int32(tk),
            _scalar(scores.dtype, scale),
            np.int32(causal),
            np.int32(lengths is not None),
        ),
    )


def rms_norm_rows(x: Any, w: Any, y: Any, rstd: Any, eps: float) -> None:
    """y = x * rstd (* w) per row, rstd [rows] = 1/sqrt(mean(x^2) + eps). x, y: [rows, cols]; w: [cols] or None."""
    rows, cols = x.shape
    if X.emulated:
        with np.errstate(all="ignore"):
            one = x.dtype.type
            r = one(1) / np.sqrt(np.sum(x * x, axis=-1) / one(cols) + one(eps))
            o = x * r[:, None]
            y[...] = o * w if w is not None else o
            rstd[...] = r
        return
    _launch(
        "rms_norm_rows",
        rows,
        cols,
        x.dtype,
        (x, w if w is not None else x, y, rstd, np.int32(cols), _scalar(x.dtype, eps), np.int32(w is not None)),
    )


def rope_rows(x: Any, cos: Any, sin: Any, positions: Any, y: Any) -> None:
    """Rotate-half rotary embedding. x, y: C-contiguous [B, H, T, D]; cos, sin: [P, D/2]; positions: int64 [B, T]."""
    b, h, t, d = x.shape
    half = d // 2
    if X.emulated:
        c = cos[positions][:, None]  # [B, 1, T, D/2]
        s = sin[positions][:, None]
        x1, x2 = x[..., :half], x[..., half:]
        y1, y2 = x1 * c - x2 * s, x2 * c + x1 * s
        y[..., :half] = y1
        y[..., half:] = y2
        return
    _launch(
        "rope_rows", b * h * t, half, x.dtype, (x, cos, sin, positions, y, np.int32(h), np.int32(t), np.int32(half))
    )


def paged_attention_rows(q: Any, cache: Any, table: Any, lengths: Any, out: Any, scale: float) -> None:
    """out [B, H, Tq, D] = causal attention of q [B, H, Tq, D] over the paged cache [NB, 2, Hkv, S, D].

    table int64 [B, M], lengths int64 [B] (checked by the frontend); see the CUDA source. The twin
    gathers each row's keys and values and runs the same arithmetic in q's dtype.
    """
    b, h, tq, d = q.shape
    hkv, s = cache.shape[2], cache.shape[3]
    m = table.shape[1]
    if X.emulated:
        one = q.dtype.type
        g = h // hkv
        with np.errstate(all="ignore"):
            for r in range(b):
                n = int(lengths[r])
                nb = -(-n // s)
                picked = cache[table[r, :nb]]  # [nb, 2, Hkv, S, D]
                k, v = (picked[:, part].transpose(1, 0, 2, 3).reshape(hkv, nb * s, d)[:, :n] for part in (0, 1))
                z = np.matmul(q[r].reshape(hkv, g * tq, d), k.transpose(0, 2, 1)) * one(scale)  # [Hkv, g*Tq, n]
                keep = np.arange(n)[None, :] <= (np.arange(tq) + (n - tq))[:, None]  # [Tq, n]
                keep = np.broadcast_to(keep[None, None], (hkv, g, tq, n)).reshape(hkv, g * tq, n)
                z = np.where(keep, z, one(-np.inf))
                e = np.where(keep, np.exp(z - np.max(z, axis=-1, keepdims=True)), one(0))
                p = e / np.sum(e, axis=-1, keepdims=True)
                out[r] = np.matmul(p, v).reshape(h, tq, d)
        return
    scratch = X.xp.empty((b * h * tq, m * s), q.dtype)
    _launch(
        "paged_attention_rows",
        b * h * tq,
        max(m * s, d),
        q.dtype,
        (
            q,
            cache,
            table,
            lengths,
            out,
            scratch,
            np.int32(h),
            np.int32(hkv),
            np.int32(tq),
            np.int32(d),
            np.int32(s),
            np.int32(m),
            _scalar(q.dtype, scale),
        ),
    )


def silu_mul(g: Any, u: Any, y: Any) -> None:
    """y = silu(g) * u = g / (1 + exp(-g)) * u, elementwise on any strides (same shape and dtype)."""
    if X.emulated:
        one = g.dtype.type
        with np.errstate(all="ignore"):
            y[...] = g / (one(1) + np.exp(-g)) * u
        return
    _ew("silu_mul")(g, u, y)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erf_np = np.vectorize(math.erf, otypes=[np.float64])


def pointwise(op: str, *arrays: Any) -> None:
    """arrays = (*inputs, out): out = op(*inputs) for an elementwise catalogue op with a source, on any strides."""
    *inputs, out = arrays
    if X.emulated:
        spec = catalogue.op(op).pointwise
        assert spec is not None, f"{op!r} is not an elementwise op"
        out[...] = spec.compute(np, *inputs)
        return
    _ew(op)(*inputs, out)


def erf(x: Any, y: Any) -> None:
    """y = erf(x), elementwise on any strides."""
    pointwise("erf", x, y)


def gelu(x: Any, y: Any, approx_tanh: bool) -> None:
    """y = gelu(x) (tanh form when approx_tanh), elementwise on any strides."""
    if X.emulated:
        one = x.dtype.type
        with np.errstate(all="ignore"):
            if approx_tanh:
                y[...] = one(0.5) * x * (one(1) + np.tanh(one(_SQRT_2_OVER_PI) * (x + one(0.044715) * x * x * x)))
            else:
                y[...] = one(0.5) * x * (one(1) + _erf_np(x * one(1 / math.sqrt(2.0))).astype(x.dtype))
        return
    _ew("gelu")(x, np.int32(approx_tanh), y)


def gelu_backward(g: Any, x: Any, dx: Any, approx_tanh: bool) -> None:
    """dx = g * gelu'(x), elementwise on any strides."""
    if X.emulated:
        one = x.dtype.type
        with np.errstate(all="ignore"):
            if approx_tanh:
                c = one(_SQRT_2_OVER_PI)
                t = np.tanh(c * (x + one(0.044715) * x * x * x))
                d = one(0.5) * (one(1) + t) + one(0.5) * x * (one(1) - t * t) * c * (one(1) + one(3 * 0.044715) * x * x)
            else:
                cdf = one(0.5) * (one(1) + _erf_np(x * one(1 / math.sqrt(2.0))).astype(x.dtype))
                d = cdf + x * np.exp(one(-0.5) * x * x) * one(1 / math.sqrt(2 * math.pi))
            dx[...] = g * d
        return
    _ew("gelu_backward")(g, x, np.int32(approx_tanh), dx)


def adamw(
    p: Any,
    g: Any,
    m: Any,
    v: Any,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    decay: float,
    bc1: float,
    bc2: float,
) -> None:
    """One AdamW step in place on p, m, v (same dtype and shape, any strides)."""
    if X.emulated:
        one = p.dtype.type
        with np.errstate(all="ignore"):
            mm = one(beta1) * m + one(1 - beta1) * g
            vv = one(beta2) * v + one(1 - beta2) * g * g
            m[...] = mm
            v[...] = vv
            p[...] = p * one(1 - lr * decay) - one(lr) * (mm / one(bc1)) / (np.sqrt(vv / one(bc2)) + one(eps))
        return
    _ew("adamw")(g, lr, beta1, beta2, eps, decay, bc1, bc2, p, m, v)
