"""The CUDA C of the mixture-of-experts kernels (compiled by ``_moe`` through one ``cupy.RawModule``).

``moe_route_rows<T>`` (T float or double) is a row kernel: one thread block per token row of the
router logits. ``expert_linear_tiles<W>`` is one grouped matrix product over every expert hit:
W is the weight's storage type (``float``, ``double``, and the 16-bit ``kael_half`` and
``kael_bf16``, read in place and widened to float as they are loaded); it accumulates in double
for double weights, in float otherwise. ``MOE_KERNEL_NAMES`` lists the template instances
compiled (CuPy's name expressions). Launchers and NumPy twins are in ``_moe.py``.
"""

from __future__ import annotations

__all__ = ["MOE_KERNELS_SOURCE", "MOE_KERNEL_NAMES", "MOE_WEIGHT_TYPES", "TILE_ROWS", "TILE_COLS", "TILE_THREADS"]

MOE_KERNELS_SOURCE = r"""
template <typename T> __device__ __forceinline__ T moe_neg_inf();
template <> __device__ __forceinline__ float moe_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double moe_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// max that propagates NaN, like NumPy's max.
template <typename T> __device__ __forceinline__ T moe_max(T a, T b) { return (a > b || a != a) ? a : b; }

// Block-wide max / sum over warp shuffles; blockDim.x is a multiple of 32 (<= 1024); buf holds 32 values.
// The leading __syncthreads lets a block call these back to back with the same buf.
template <typename T> __device__ T moe_block_max(T v, T* buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = moe_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? buf[lane] : moe_neg_inf<T>();
        for (int o = 16; o > 0; o >>= 1) w = moe_max(w, __shfl_xor_sync(0xffffffffu, w, o));
        if (lane == 0) buf[0] = w;
    }
    __syncthreads();
    return buf[0];
}

template <typename T> __device__ T moe_block_sum(T v, T* buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < nwarps ? buf[lane] : T(0);
        for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
        if (lane == 0) buf[0] = w;
    }
    __syncthreads();
    return buf[0];
}

// Does probability u of expert i come before v of expert j in the routing order? Larger first, equal
// values in index order, NaN after every number (as a stable sort of -p puts them).
template <typename T> __device__ __forceinline__ bool moe_before(T u, int i, T v, int j) {
    if (u != u) return v != v && i < j;
    if (v != v) return true;
    return u > v || (u == v && i < j);
}

// Top-k routing of one token per block (NOTE [routing ties] in kael/ops/_moe_fused.py): p = softmax(x[r]),
// the k largest p in routing order into weights[r] and experts[r], divided by their sum when normalize.
// x, p: [rows, e] (p: scratch); weights, experts: [rows, k]; all C-contiguous; 1 <= k <= e. Expert j's place
// is the number of experts before it (no sort): each row's result is independent of the others and of
// the number of threads.
template <typename T>
__global__ void moe_route_rows(const T* x, T* weights, long long* experts, T* p, int e, int k, int normalize) {
    __shared__ T buf[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * e;
    T* pr = p + row * e;
    T m = moe_neg_inf<T>();
    for (int j = threadIdx.x; j < e; j += blockDim.x) m = moe_max(m, xr[j]);
    m = moe_block_max(m, buf);
    T s = T(0);
    for (int j = threadIdx.x; j < e; j += blockDim.x) s += exp(xr[j] - m);
    s = moe_block_sum(s, buf);
    for (int j = threadIdx.x; j < e; j += blockDim.x) pr[j] = exp(xr[j] - m) / s;
    __syncthreads();  // every p of the row visible to the block
    T* wr = weights + row * k;
    long long* er = experts + row * k;
    for (int j = threadIdx.x; j < e; j += blockDim.x) {
        const T v = pr[j];
        int place = 0;
        for (int i = 0; i < e && place < k; ++i) place += moe_before(pr[i], i, v, j) ? 1 : 0;
        if (place < k) {
            wr[place] = v;
            er[place] = j;
        }
    }
    if (normalize) {
        __syncthreads();
        if (threadIdx.x == 0) {  // the sum in routing order, as the reference sums the k weights
            T total = T(0);
            for (int i = 0; i < k; ++i) total += wr[i];
            buf[0] = total;
        }
        __syncthreads();
        const T total = buf[0];
        for (int i = threadIdx.x; i < k; i += blockDim.x) wr[i] = wr[i] / total;
    }
}

// 16-bit weights, read as their bits and widened exactly to float.
struct kael_half {
    unsigned short bits;
};
struct kael_bf16 {
    unsigned short bits;
};
template <typename W> struct moe_acc {
    typedef float type;
};
template <> struct moe_acc<double> {
    typedef double type;
};
__device__ __forceinline__ float moe_load(float v) { return v; }
__device__ __forceinline__ double moe_load(double v) { return v; }
__device__ __forceinline__ float moe_load(kael_bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }
__device__ __forceinline__ float moe_load(kael_half v) {
    const unsigned int h = v.bits, sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (ex == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (man << 13));  // inf, NaN
    if (ex != 0u) return __uint_as_float(sign | ((ex + 112u) << 23) | (man << 13));
    const float f = (float)man * 5.9604644775390625e-08f;  // zero or subnormal: man * 2^-24, exact
    return sign ? -f : f;
}

#define MOE_TM 64  // rows (assignments) per tile
#define MOE_TN 64  // output columns per tile
#define MOE_TC 16  // the reduction dim per step

// NOTE [expert grouping] in kael/ops/_moe_fused.py, on the device: out[p] = w[experts[p]] @ x[p / K, p % K] for
// the T*K assignments p, grouped by expert. order [T*K]: the assignments sorted by expert (stable);
// row_start [E]: where each expert's rows begin in order; tile_end [E]: the cumulative number of MOE_TM-row
// tiles of experts 0..e. Block (b, y) computes tile b (expert e = the first with tile_end[e] > b; blocks past
// the last tile return) for the output columns y*MOE_TN.., then every gridDim.y * MOE_TN further on. x [T, K, C] (A, strides xs*, in elements: the
// frontend's stride-0 broadcast over K is read in place), w [E, N, C] (strides ws*: the backward's transposed
// view is read in place), out [T*K, N] (A, C-contiguous). 256 threads, each a 4 x 4 block of outputs. Every
// output is the sum over c = 0, 1, .., C-1 in that order, whatever the other rows: batched = alone, bit for bit.
template <typename W>
__global__ void expert_linear_tiles(const typename moe_acc<W>::type* x, const W* w, const long long* order,
                                    const long long* row_start, const long long* tile_end,
                                    typename moe_acc<W>::type* out, int n_experts, int k, int n, int c,
                                    long long total, long long xs0, long long xs1, long long xs2, long long ws0,
                                    long long ws1, long long ws2) {
    typedef typename moe_acc<W>::type A;
    __shared__ A xt[MOE_TC][MOE_TM + 1];
    __shared__ A wt[MOE_TC][MOE_TN + 1];
    __shared__ long long src[MOE_TM];  // each tile row's x offset (t * xs0 + j * xs1)
    __shared__ long long dst[MOE_TM];  // each tile row's assignment p (its output row)
    const long long b = blockIdx.x;
    if (b >= tile_end[n_experts - 1]) return;  // the same for every thread of the block
    int lo = 0, hi = n_experts - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (tile_end[mid] > b) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    const int e = lo;
    const long long first = row_start[e] + (b - (e > 0 ? tile_end[e - 1] : 0LL)) * MOE_TM;
    const long long stop = e + 1 < n_experts ? row_start[e + 1] : total;
    const int rows = (int)(stop - first < MOE_TM ? stop - first : MOE_TM);
    const int tid = threadIdx.x;
    if (tid < MOE_TM) {
        const long long p = tid < rows ? order[first + tid] : 0;
        dst[tid] = p;
        src[tid] = (p / k) * xs0 + (p % k) * xs1;
    }
    __syncthreads();
    const W* we = w + e * ws0;
    const bool n_fast = ws1 == 1 && ws2 != 1;  // w's rows are its columns (the transposed view): load along n
    const int tx = tid & 15, ty = tid >> 4;
    for (long long n0 = (long long)blockIdx.y * MOE_TN; n0 < n; n0 += (long long)gridDim.y * MOE_TN) {
        A acc[4][4];
        for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) acc[i][j] = A(0);
        for (int c0 = 0; c0 < c; c0 += MOE_TC) {
            for (int q = tid; q < MOE_TM * MOE_TC; q += 256) {
                const int r = q / MOE_TC, cc = q % MOE_TC;
                xt[cc][r] = r < rows && c0 + cc < c ? x[src[r] + (long long)(c0 + cc) * xs2] : A(0);
            }
            for (int q = tid; q < MOE_TN * MOE_TC; q += 256) {
                const int nn = n_fast ? q % MOE_TN : q / MOE_TC, cc = n_fast ? q / MOE_TN : q % MOE_TC;
                const bool inside = n0 + nn < n && c0 + cc < c;
                wt[cc][nn] = inside ? moe_load(we[(n0 + nn) * ws1 + (long long)(c0 + cc) * ws2]) : A(0);
            }
            __syncthreads();
            for (int cc = 0; cc < MOE_TC; ++cc) {
                A xa[4], wb[4];
                for (int i = 0; i < 4; ++i) xa[i] = xt[cc][ty * 4 + i];
                for (int j = 0; j < 4; ++j) wb[j] = wt[cc][tx * 4 + j];
                for (int i = 0; i < 4; ++i)
                    for (int j = 0; j < 4; ++j) acc[i][j] += xa[i] * wb[j];
            }
            __syncthreads();
        }
        for (int i = 0; i < 4; ++i) {
            const int r = ty * 4 + i;
            if (r >= rows) continue;
            for (int j = 0; j < 4; ++j) {
                const long long col = n0 + tx * 4 + j;
                if (col < n) out[dst[r] * n + col] = acc[i][j];
            }
        }
    }
}
"""

MOE_WEIGHT_TYPES: tuple[str, ...] = ("float", "double", "kael_half", "kael_bf16")
"""The weight storage types ``expert_linear_tiles`` is compiled for (float32, float64, float16, bfloat16)."""

MOE_KERNEL_NAMES: tuple[str, ...] = tuple(f"moe_route_rows<{t}>" for t in ("float", "double")) + tuple(
    f"expert_linear_tiles<{t}>" for t in MOE_WEIGHT_TYPES
)
"""The template instantiations compiled from MOE_KERNELS_SOURCE (CuPy's name_expressions)."""

TILE_ROWS, TILE_COLS, TILE_THREADS = 64, 64, 256  # MOE_TM, MOE_TN and the block size of expert_linear_tiles
