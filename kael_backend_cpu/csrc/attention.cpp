// Scaled dot-product attention over a KV cache: causal alignment of the last query
// with the last key, optional per-batch key lengths.
//
// NOTE [attention blocks]: work is split into (batch, head, query block) tasks across
// the thread pool. A task computes S = Q_blk K^T only for the keys any of its
// queries may see (a causal block stops at its last query's diagonal), applies the
// scale and each row's mask inside the softmax, and writes P V straight into the
// output view. Both products are gemm() calls that read q/k/v/out through their
// strides (no copies of the cache); inside a task they run single-threaded.
//
// NOTE [grouped-query attention]: k/v may have Hkv heads with H % Hkv == 0; query head h
// reads kv head h / g (g = H / Hkv, Hugging Face's repeat_kv order) through its strides,
// never a repeated copy. A decode step (Tq == 1) makes one task per (batch, kv head,
// stack of up to 16 query heads): the stack's queries are the rows of one S = Q K^T and
// one P V product, so each K/V row is read once for the whole stack. Stacks are smaller
// only when there would otherwise be fewer tasks than threads. Up to 16 rows a
// gemm row equals that row's product alone (NOTE [gemm paths]), so grouped results are
// bit-identical to the per-head ones (and Hkv == H runs exactly as before).
//
// NOTE [attention window]: with a sliding window W (NOTE [sliding window] in
// kael/ops/_attention_fused.py) a task's products start at the first key its first query
// sees (kmin); each row masks the keys before its own window inside the softmax (exact
// zeros), so a row's bits do not depend on where its task's products start.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "buffer.h"
#include "gemm.h"
#include "kernels.h"
#include "rows.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

// Largest number of query heads one decode task stacks into a product (NOTE [gemm paths]).
constexpr int64_t kMaxGroupRows = 16;

template <class T>
void attention_native(const View& out, const View& q, const View& k, const View& v, double scale, bool causal,
                      const std::vector<int64_t>& lens, int64_t window) {
  const int64_t nb = q.shape[0], nh = q.shape[1], tq = q.shape[2], d = q.shape[3];
  const int64_t nkv = k.shape[1], group = nh / nkv;
  const int64_t tk = k.shape[2], dv = v.shape[3];
  const int64_t offset = tk - tq;
  // A decode step stacks the query heads of one kv head (up to kMaxGroupRows at a time, and
  // fewer when that would leave threads idle); otherwise a task is a block of bq queries of
  // one head. A row's result does not depend on the stacking (NOTE [gemm paths]).
  const bool stack = tq == 1 && group > 1;
  const int64_t hs =
      stack ? std::clamp<int64_t>(nb * nh / parallel_width(), 1, std::min(group, kMaxGroupRows)) : 1;  // heads/task
  const int64_t per_kv = (group + hs - 1) / hs;       // tasks per kv head when stacking
  const int64_t hblocks = stack ? per_kv * nkv : nh;  // head tasks per batch row
  const int64_t bq =
      stack ? 1
            : std::clamp<int64_t>((int64_t{1} << 18) / std::max<int64_t>(1, tk * static_cast<int64_t>(sizeof(T))), 1,
                                  std::min<int64_t>(64, std::max<int64_t>(1, tq)));
  const int64_t qblocks = (tq + bq - 1) / bq;
  const int64_t tasks = nb * hblocks * qblocks;
  const auto sc = static_cast<T>(scale);
  const int64_t work = std::max<int64_t>(1, hs * bq * tk * (d + dv));
  // A chunk holds at least 4K multiply-adds: one query over a short cache (a decode step)
  // still spreads its heads over the threads, as its keys and values come cold from memory.
  parallel_for(0, tasks, std::max<int64_t>(1, (int64_t{1} << 12) / work), [&](int64_t t0, int64_t t1) {
    std::vector<T> s(static_cast<size_t>(hs * bq * tk));
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t blk = task % qblocks, hb = (task / qblocks) % hblocks, b = task / (qblocks * hblocks);
      // query heads [h0, h0 + nheads) of kv head hk; with stacking, their rows are the product's rows
      int64_t h0 = hb, nheads = 1;
      if (stack) {
        h0 = (hb / per_kv) * group + (hb % per_kv) * hs;
        nheads = std::min(hs, (hb / per_kv + 1) * group - h0);
      }
      const int64_t hk = h0 / group;
      const int64_t i0 = blk * bq, rows = stack ? nheads : std::min(bq, tq - i0);
      // row stride of the product's rows: query positions, or query heads when stacked
      const int64_t qrs = stack ? q.strides[1] : q.strides[2], ors = stack ? out.strides[1] : out.strides[2];
      const int64_t len = lens.empty() ? tk : std::clamp<int64_t>(lens[static_cast<size_t>(b)], 0, tk);
      const int64_t last = stack ? i0 : i0 + rows - 1;  // the last query position in the task
      const int64_t kmax = std::min(len, causal ? last + 1 + offset : tk);
      // NOTE [attention window]: the first key the task's first query sees
      const int64_t kmin = window > 0 ? std::max<int64_t>(0, i0 + offset - window + 1) : 0;
      T* o = out.ptr<T>() + b * out.strides[0] + h0 * out.strides[1] + i0 * out.strides[2];
      if (kmax <= kmin) {
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < dv; ++j) o[r * ors + j * out.strides[3]] = T(0);
        }
        continue;
      }
      const T* qp = q.ptr<T>() + b * q.strides[0] + h0 * q.strides[1] + i0 * q.strides[2];
      const T* kp = k.ptr<T>() + b * k.strides[0] + hk * k.strides[1] + kmin * k.strides[2];
      const T* vp = v.ptr<T>() + b * v.strides[0] + hk * v.strides[1] + kmin * v.strides[2];
      const int64_t nk = kmax - kmin;  // the product's columns: keys kmin .. kmax-1
      T* sp = s.data();
      // S [rows x nk] = Q_blk [rows x d] @ K[kmin:kmax]^T [d x nk]
      gemm<T>(rows, nk, d, qp, qrs, q.strides[3], kp, k.strides[3], k.strides[2], sp, nk, 1, false);
      for (int64_t r = 0; r < rows; ++r) {
        T* row = sp + r * nk;
        const int64_t qi = stack ? i0 : i0 + r;
        const int64_t valid = std::min(len, causal ? qi + offset + 1 : tk) - kmin;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, qi + offset - window + 1) - kmin : 0;
        if (valid <= lo) {
          std::fill(row, row + nk, T(0));
          continue;
        }
        for (int64_t j = lo; j < valid; ++j) row[j] *= sc;
        if constexpr (std::is_same_v<T, float>) {
          vec().softmax_f32(row + lo, row + lo, valid - lo);
        } else {
          softmax_row_f64(row + lo, row + lo, valid - lo, false);
        }
        std::fill(row, row + lo, T(0));
        std::fill(row + valid, row + nk, T(0));
      }
      // out block [rows x dv] = P [rows x nk] @ V[kmin:kmax] [nk x dv]
      gemm<T>(rows, dv, nk, sp, nk, 1, vp, v.strides[2], v.strides[3], o, ors, out.strides[3], false);
    }
  });
}

}  // namespace

void attention(const View& out, const View& q, const View& k, const View& v, double scale, bool causal,
               const View* lengths, int64_t window) {
  KAEL_CHECK(q.ndim == 4 && k.ndim == 4 && v.ndim == 4 && out.ndim == 4, Shape,
             "attention: q, k, v and out must be [B, H, T, D]");
  KAEL_CHECK(k.shape[0] == q.shape[0] && k.shape[3] == q.shape[3] && v.shape[0] == k.shape[0] &&
                 v.shape[1] == k.shape[1] && v.shape[2] == k.shape[2],
             Shape, "attention: q [", q.shape[0], ", ", q.shape[1], ", ", q.shape[2], ", ", q.shape[3], "], k [",
             k.shape[0], ", ", k.shape[1], ", ", k.shape[2], ", ", k.shape[3], "] and v [", v.shape[0], ", ",
             v.shape[1], ", ", v.shape[2], ", ", v.shape[3], "] do not fit");
  KAEL_CHECK(k.shape[1] > 0 ? q.shape[1] % k.shape[1] == 0 : q.shape[1] == 0, Shape, "attention: q has ", q.shape[1],
             " heads, which k/v's ", k.shape[1], " heads must divide (grouped-query attention)");
  KAEL_CHECK(out.shape[0] == q.shape[0] && out.shape[1] == q.shape[1] && out.shape[2] == q.shape[2] &&
                 out.shape[3] == v.shape[3],
             Shape, "attention: output must be [B, H, Tq, Dv]");
  KAEL_CHECK(q.dtype == out.dtype && k.dtype == out.dtype && v.dtype == out.dtype, DType,
             "attention: q, k, v and out must share a dtype");
  KAEL_CHECK(is_floating(out.dtype), DType, "attention: expected floating-point tensors, got ", dtype_name(out.dtype));
  KAEL_CHECK(window >= 0, Shape, "attention: window must be >= 0 (0: no sliding window), got ", window);
  KAEL_CHECK(window == 0 || causal, Shape, "attention: a sliding window (window = ", window,
             ") needs causal attention");
  std::vector<int64_t> lens;
  if (lengths != nullptr) {
    KAEL_CHECK(lengths->ndim == 1 && lengths->shape[0] == q.shape[0], Shape, "attention: lengths must be [", q.shape[0],
               "]");
    Temp lt = to_contiguous(*lengths, DType::Int64);
    lens.assign(lt.view.ptr<int64_t>(), lt.view.ptr<int64_t>() + q.shape[0]);
  }
  if (out.numel() == 0) return;
  if (is_half(out.dtype)) {
    Temp tq = to_contiguous(q, DType::Float32), tk = to_contiguous(k, DType::Float32),
         tv = to_contiguous(v, DType::Float32);
    Temp to = make_temp(DType::Float32, out.shape, 4);
    attention_native<float>(to.view, tq.view, tk.view, tv.view, scale, causal, lens, window);
    copy(out, to.view);
    return;
  }
  KAEL_DISPATCH_FLOAT(out.dtype, "attention", (attention_native<T>(out, q, k, v, scale, causal, lens, window)));
}

}  // namespace kael
