// Causal attention over a paged KV cache (NOTE [paged attention] in kael/ops/_attention_fused.py):
// q [B,H,T,D], cache [NB,2,Hkv,S,D] (block n's keys at [n,0], values at [n,1]), block
// table int64 [B,M], lengths int64 [B]; position p of row b is slot p % S of block
// table[b, p / S], and query t of row b sees positions 0 .. lengths[b]-T+t.
//
// NOTE [paged attention tasks]: the work is attention.cpp's (NOTE [attention blocks]),
// per batch row with Tk = lengths[b]: a decode step (T == 1) with grouped heads makes
// tasks of up to 16 query heads of one kv head, anything else tasks of up to 16 queries
// of one head, spread over the thread pool. A task reads its keys and values in place,
// one block at a time: S = Q K^T is computed a block's columns at a time, P V a block's
// rows at a time (accumulating into the output), by the few-row GEMM kernels that gemm()
// runs for attention's products of at most 16 rows (NOTE [gemm paths]). Those kernels
// sum a dot product's lanes the same way whatever the columns, and an element of P V
// with one multiply-add per key in key order, so cutting the products at block
// boundaries changes no bits: with T <= 16 (and an output contiguous along D) a row's
// result is exactly what attention() gives on its gathered keys with causal = true, and
// it never depends on the other rows or on which blocks hold its keys (both are tested
// in tests/backend_cpu/test_cpu_paged_attention.py). Past 16 queries attention may use
// the packed GEMM instead, so its bits can differ there; the row independence stays.
// With a sliding window a task's products start at the block holding the first key its
// first query sees; the keys before each row's window are exact zeros in P (NOTE
// [attention window] in attention.cpp), so the bits stay attention()'s.
//
// Pools are read in place when they are float32/float64 with D contiguous (and, for
// D == 1, a block's positions contiguous, which the one-column kernel needs); otherwise
// (bfloat16, or other strides) the blocks in use are first converted into a compact
// contiguous float pool, which changes no value (bfloat16 -> float32 is exact).
// float16 runs the NumPy host kernel (kael_backend_cpu/_kernels.py), as attention does.
#include <algorithm>
#include <cstring>
#include <vector>

#include "buffer.h"
#include "kernels.h"
#include "rows.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

// Largest number of rows (stacked heads or queries) one task's products have (NOTE [gemm paths]).
constexpr int64_t kMaxRows = 16;

template <class T>
const GemmKernels<T>& gemm_kernels() {
  if constexpr (std::is_same_v<T, float>) {
    return vec().sgemm;
  } else {
    return vec().dgemm;
  }
}

// One layer's pool as the task loop reads it: element [n, part, h, s, d] at
// base + ids[n]*sb + part*sp + h*sh + s*ss + d (D contiguous).
template <class T>
struct Pool {
  const T* base = nullptr;
  int64_t sb = 0, sp = 0, sh = 0, ss = 0;
  // block j of row b, part (0 keys, 1 values), kv head h: its S x D matrix
  [[nodiscard]] const T* block(int64_t id, int64_t part, int64_t h) const {
    return base + id * sb + part * sp + h * sh;
  }
};

template <class T>
void paged_native(const View& out, const View& q, const Pool<T>& pool, const int64_t* table, int64_t m,
                  const std::vector<int64_t>& lens, int64_t s, int64_t nkv, double scale, int64_t window) {
  const GemmKernels<T>& g = gemm_kernels<T>();
  const int64_t nb = q.shape[0], nh = q.shape[1], tq = q.shape[2], d = q.shape[3];
  const int64_t group = nh / nkv;
  const bool stack = tq == 1 && group > 1;
  const int64_t hs = stack ? std::clamp<int64_t>(nb * nh / parallel_width(), 1, std::min(group, kMaxRows)) : 1;
  const int64_t per_kv = (group + hs - 1) / hs;
  const int64_t hblocks = stack ? per_kv * nkv : nh;
  const int64_t bq = stack ? 1 : std::min<int64_t>(kMaxRows, tq);
  const int64_t qblocks = (tq + bq - 1) / bq;
  const int64_t tasks = nb * hblocks * qblocks;
  int64_t total = 0;
  for (int64_t len : lens) total += len;
  const int64_t work = std::max<int64_t>(1, hs * bq * (total / std::max<int64_t>(1, nb)) * 2 * d);
  const bool out_rows = out.strides[3] == 1 || d == 1;  // P V written straight into out (else via a row buffer)
  const auto sc = static_cast<T>(scale);
  parallel_for(0, tasks, std::max<int64_t>(1, (int64_t{1} << 12) / work), [&](int64_t t0, int64_t t1) {
    std::vector<T> sbuf, qbuf, obuf;
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t blk = task % qblocks, hb = (task / qblocks) % hblocks, b = task / (qblocks * hblocks);
      int64_t h0 = hb, nheads = 1;
      if (stack) {
        h0 = (hb / per_kv) * group + (hb % per_kv) * hs;
        nheads = std::min(hs, (hb / per_kv + 1) * group - h0);
      }
      const int64_t hk = h0 / group;
      const int64_t i0 = blk * bq, rows = stack ? nheads : std::min(bq, tq - i0);
      const int64_t len = lens[static_cast<size_t>(b)], offset = len - tq;
      const int64_t last = stack ? i0 : i0 + rows - 1;
      const int64_t kmax = std::min(len, last + 1 + offset);  // >= 1: len >= tq
      // the products start at the block of the first key the task's first query sees (0 without a window)
      const int64_t kmin = window > 0 ? std::max<int64_t>(0, i0 + offset - window + 1) / s * s : 0;
      const int64_t nk = kmax - kmin;  // >= 1: kmin <= i0 + offset < kmax
      const int64_t* ids = table + b * m;
      // Q rows [rows x d]: query positions, or the stacked heads of a decode step
      const T* qp = q.ptr<T>() + b * q.strides[0] + h0 * q.strides[1] + i0 * q.strides[2];
      int64_t qrs = stack ? q.strides[1] : q.strides[2], qcs = q.strides[3];
      sbuf.resize(static_cast<size_t>(rows * nk));
      T* sp = sbuf.data();
      // S [rows x kmax] = Q K^T, a block's columns at a time, with the kernel gemm() picks for the whole product:
      // one column or D == 1 streams B along its columns (rows_nmajor), else dot products (rows_kmajor, A
      // contiguous along D)
      if (kmax == 1 || d == 1) {
        for (int64_t j0 = kmin; j0 < kmax; j0 += s) {
          const int64_t seg = std::min(s, kmax - j0);
          g.rows_nmajor(rows, seg, d, qp, qrs, qcs, pool.block(ids[j0 / s], 0, hk), 1, sp + j0 - kmin, nk, false);
        }
      } else {
        if (qcs != 1) {  // as gemm() does for the dot kernels: the few rows of A copied contiguous along D
          qbuf.resize(static_cast<size_t>(rows * d));
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t c = 0; c < d; ++c) qbuf[static_cast<size_t>(r * d + c)] = qp[r * qrs + c * qcs];
          }
          qp = qbuf.data();
          qrs = d;
          qcs = 1;
        }
        for (int64_t j0 = kmin; j0 < kmax; j0 += s) {
          const int64_t seg = std::min(s, kmax - j0);
          g.rows_kmajor(rows, seg, d, qp, qrs, pool.block(ids[j0 / s], 0, hk), pool.ss, sp + j0 - kmin, nk, 1, false);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* row = sp + r * nk;
        const int64_t qi = stack ? i0 : i0 + r;
        const int64_t valid = std::min(len, qi + offset + 1) - kmin;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, qi + offset - window + 1) - kmin : 0;
        for (int64_t j = lo; j < valid; ++j) row[j] *= sc;
        if constexpr (std::is_same_v<T, float>) {
          vec().softmax_f32(row + lo, row + lo, valid - lo);
        } else {
          softmax_row_f64(row + lo, row + lo, valid - lo, false);
        }
        std::fill(row, row + lo, T(0));
        std::fill(row + valid, row + nk, T(0));
      }
      // out rows [rows x d] = P V, a block's rows at a time, accumulating
      T* o = out.ptr<T>() + b * out.strides[0] + h0 * out.strides[1] + i0 * out.strides[2];
      const int64_t ors = stack ? out.strides[1] : out.strides[2];
      T* dst = o;
      int64_t drs = ors;
      if (!out_rows) {
        obuf.resize(static_cast<size_t>(rows * d));
        dst = obuf.data();
        drs = d;
      }
      for (int64_t j0 = kmin; j0 < kmax; j0 += s) {
        const int64_t seg = std::min(s, kmax - j0);
        g.rows_nmajor(rows, d, seg, sp + j0 - kmin, nk, 1, pool.block(ids[j0 / s], 1, hk), pool.ss, dst, drs,
                      j0 > kmin);
      }
      if (!out_rows) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < d; ++c) o[r * ors + c * out.strides[3]] = obuf[static_cast<size_t>(r * d + c)];
        }
      }
    }
  });
}

// The blocks the rows use, converted into a compact contiguous pool of dtype `to`; `table` is rewritten to index it.
Temp compact_pool(const View& cache, std::vector<int64_t>& table, int64_t m, const std::vector<int64_t>& lens,
                  int64_t s, DType to) {
  const int64_t nblocks = cache.shape[0];
  std::vector<int64_t> slot(static_cast<size_t>(nblocks), -1), used;
  for (size_t b = 0; b < lens.size(); ++b) {
    const int64_t need = (lens[b] + s - 1) / s;
    for (int64_t j = 0; j < need; ++j) {
      int64_t& id = table[b * static_cast<size_t>(m) + static_cast<size_t>(j)];
      int64_t& at = slot[static_cast<size_t>(id)];
      if (at < 0) {
        at = static_cast<int64_t>(used.size());
        used.push_back(id);
      }
      id = at;
    }
  }
  const int64_t shape[5] = {std::max<int64_t>(1, static_cast<int64_t>(used.size())), 2, cache.shape[2], s,
                            cache.shape[4]};
  Temp pool = make_temp(to, shape, 5);
  View src = cache, dst = pool.view;
  src.ndim = dst.ndim = 4;  // one block [2, Hkv, S, D]
  for (int i = 0; i < 4; ++i) {
    src.shape[i] = cache.shape[i + 1];
    src.strides[i] = cache.strides[i + 1];
    dst.shape[i] = pool.view.shape[i + 1];
    dst.strides[i] = pool.view.strides[i + 1];
  }
  for (size_t u = 0; u < used.size(); ++u) {
    src.data = cache.data + used[u] * cache.strides[0] * cache.elsize();
    dst.data = pool.view.data + static_cast<int64_t>(u) * pool.view.strides[0] * pool.view.elsize();
    copy(dst, src);
  }
  return pool;
}

template <class T>
Pool<T> pool_of(const View& v) {
  return Pool<T>{v.ptr<T>(), v.strides[0], v.strides[1], v.strides[2], v.strides[3]};
}

}  // namespace

void paged_attention(const View& out, const View& q, const View& cache, const View& block_table, const View& lengths,
                     double scale, int64_t window) {
  const char* op = "paged_attention";
  KAEL_CHECK(window >= 0, Shape, op, ": window must be >= 0 (0: no sliding window), got ", window);
  KAEL_CHECK(q.ndim == 4 && out.ndim == 4, Shape, op, ": q and out must be [B, H, T, D]");
  const int64_t nb = q.shape[0], nh = q.shape[1], tq = q.shape[2], d = q.shape[3];
  KAEL_CHECK(cache.ndim == 5 && cache.shape[1] == 2 && cache.shape[4] == d && cache.shape[2] > 0 && cache.shape[3] > 0,
             Shape, op, ": cache must be [NB, 2, Hkv, S, D] with Hkv >= 1, S >= 1 and D = ", d, " (q's), got ",
             cache.ndim, " dims");
  const int64_t nblocks = cache.shape[0], nkv = cache.shape[2], s = cache.shape[3];
  KAEL_CHECK(nh % nkv == 0, Shape, op, ": q has ", nh, " heads, which the cache's ", nkv,
             " kv heads must divide (grouped-query attention)");
  KAEL_CHECK(out.shape[0] == nb && out.shape[1] == nh && out.shape[2] == tq && out.shape[3] == d, Shape, op,
             ": out must be [B, H, T, D] = [", nb, ", ", nh, ", ", tq, ", ", d, "]");
  KAEL_CHECK(q.dtype == out.dtype && cache.dtype == out.dtype, DType, op, ": q, cache and out must share a dtype");
  KAEL_CHECK(is_floating(out.dtype), DType, op, ": expected floating-point tensors, got ", dtype_name(out.dtype));
  KAEL_CHECK(block_table.ndim == 2 && block_table.shape[0] == nb && is_integral(block_table.dtype), Shape, op,
             ": block_table must be an integer [B, M] = [", nb, ", M] tensor");
  KAEL_CHECK(lengths.ndim == 1 && lengths.shape[0] == nb && is_integral(lengths.dtype), Shape, op,
             ": lengths must be an integer [B] = [", nb, "] tensor");
  const int64_t m = block_table.shape[1];
  std::vector<int64_t> lens(static_cast<size_t>(nb)), table(static_cast<size_t>(nb * m));
  if (nb > 0) {
    Temp lt = to_contiguous(lengths, DType::Int64);
    std::copy(lt.view.ptr<int64_t>(), lt.view.ptr<int64_t>() + nb, lens.begin());
  }
  if (nb * m > 0) {
    Temp tt = to_contiguous(block_table, DType::Int64);
    std::copy(tt.view.ptr<int64_t>(), tt.view.ptr<int64_t>() + nb * m, table.begin());
  }
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t len = lens[static_cast<size_t>(b)];
    KAEL_CHECK(tq <= len && len <= m * s, Shape, op, ": lengths[", b, "] = ", len, " is out of range: expected ", tq,
               " <= lengths[b] <= M*S = ", m * s);
    for (int64_t j = 0; j < (len + s - 1) / s; ++j) {
      const int64_t id = table[static_cast<size_t>(b * m + j)];
      KAEL_CHECK(id >= 0 && id < nblocks, Index, op, ": block_table[", b, ", ", j, "] = ", id,
                 " is not a block of the cache's ", nblocks);
    }
  }
  if (out.numel() == 0) return;
  const bool native = out.dtype == DType::Float32 || out.dtype == DType::Float64;
  const bool in_place = native && cache.strides[4] == 1 && (d > 1 || cache.strides[3] == 1);
  if (is_half(out.dtype)) {
    Temp tq32 = to_contiguous(q, DType::Float32);
    Temp pool = compact_pool(cache, table, m, lens, s, DType::Float32);
    Temp to = make_temp(DType::Float32, out.shape, 4);
    paged_native<float>(to.view, tq32.view, pool_of<float>(pool.view), table.data(), m, lens, s, nkv, scale, window);
    copy(out, to.view);
    return;
  }
  KAEL_CHECK(native, DType, op, ": expected a floating-point dtype, got ", dtype_name(out.dtype));
  Temp pool;
  const View* pv = &cache;
  if (!in_place) {
    pool = compact_pool(cache, table, m, lens, s, out.dtype);
    pv = &pool.view;
  }
  KAEL_DISPATCH_FLOAT(out.dtype, op,
                      (paged_native<T>(out, q, pool_of<T>(*pv), table.data(), m, lens, s, nkv, scale, window)));
}

}  // namespace kael
