"""The CUDA C of the fused row-wise kernels (compiled by ``_raw_kernels`` through one ``cupy.RawModule``).

Templated on T (float or double), one thread block per row; ``row_kernel_names`` lists the
template instances compiled (CuPy's name expressions). Launchers and NumPy twins are in
``_raw_kernels.py``.
"""

from __future__ import annotations

__all__ = ["ROW_KERNELS_SOURCE", "row_kernel_names"]

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
// the KV cache) and j < lengths[b], and with a sliding window (window > 0) j > i + Tk - Tq - window.
// A row that sees no key is all zeros.
template <typename T>
__global__ void attention_softmax(T* scores, const long long* lengths, int rows_per_batch, int tq, int tk, T scale,
                                  int causal, int has_lengths, int window) {
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
    const int lo = window > 0 ? max(0, i + (tk - tq) - window + 1) : 0;  // the first key in the window
    T m = kael_neg_inf<T>();
    for (int j = lo + threadIdx.x; j < n; j += blockDim.x) m = kael_max(m, sr[j] * scale);
    m = block_max(m, buf);
    T s = T(0);
    for (int j = lo + threadIdx.x; j < n; j += blockDim.x) s += exp(sr[j] * scale - m);
    s = block_sum(s, buf);
    for (int j = threadIdx.x; j < tk; j += blockDim.x) sr[j] = j >= lo && j < n ? exp(sr[j] * scale - m) / s : T(0);
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
// every block id in use is in range, both checked by the frontend); with a sliding window (window > 0) only
// the last `window` of them. scratch [B*H*Tq, M*S] holds the row's scores, then exp(score - max); each output
// element is sum_p (e_p / sum) * v_p, as the reference computes.
template <typename T>
__global__ void paged_attention_rows(const T* q, const T* cache, const long long* table, const long long* lengths,
                                     T* out, T* scratch, int heads, int kv_heads, int tq, int d, int s, int m,
                                     T scale, int window) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const long long b = row / ((long long)heads * tq);
    const int h = (int)((row / tq) % heads);
    const int i = (int)(row % tq);
    const int j = h / (heads / kv_heads);  // the kv head of query head h (grouped-query attention)
    const int n = (int)(lengths[b] - tq + i + 1);
    const int lo = window > 0 ? max(0, n - window) : 0;  // the first position in the window
    const T* qr = q + row * d;
    const long long* blocks = table + b * m;
    T* sr = scratch + row * ((long long)m * s);
    const long long head_stride = (long long)s * d;  // one kv head of one block
    const long long block_stride = 2LL * kv_heads * head_stride;
    T mx = kael_neg_inf<T>();
    for (int p = lo + threadIdx.x; p < n; p += blockDim.x) {
        const T* kp = cache + blocks[p / s] * block_stride + j * head_stride + (long long)(p % s) * d;
        T acc = T(0);
        for (int c = 0; c < d; ++c) acc += qr[c] * kp[c];
        const T z = acc * scale;
        sr[p] = z;
        mx = kael_max(mx, z);
    }
    mx = block_max(mx, buf);
    T sum = T(0);
    for (int p = lo + threadIdx.x; p < n; p += blockDim.x) {
        const T e = exp(sr[p] - mx);
        sr[p] = e;
        sum += e;
    }
    sum = block_sum(sum, buf);  // its barriers also publish every thread's e to the block
    const T* vbase = cache + (long long)(kv_heads + j) * head_stride;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        T acc = T(0);
        for (int p = lo; p < n; ++p) {
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
