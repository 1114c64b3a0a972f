// moe_route (top-k mixture-of-experts routing) and expert_linear (the expert-grouped matmul), the
// mixture-of-experts fused ops of kael/ops/_moe_fused.py.
//
// NOTE [moe_route bits]: the routing equals the frontend decomposition on this backend bit for
// bit (weights and experts): softmax_decomp's steps (amax, x - max, exp, sum, division) in the
// same arithmetic (float32 exp through the vector table's exp_f32, the same function the unary
// exp kernel runs; float64 std::exp; the sums through reduce(), the very kernel the
// decomposition's sum runs), then the stable descending sort's first k (ties in index order, a
// nan row first in index order) and, when asked, the division by the sum of the k weights (again
// through reduce()). Not the softmax kernel's arithmetic (softmax_f32 multiplies by 1 / sum):
// a probability one rounding away could reorder two nearly equal experts.
//
// NOTE [expert_linear grouping]: the T*K (token, slot) assignments are grouped by expert with a
// counting sort (stable: each group in assignment order), the rows of x gathered group by group,
// and each expert hit runs one product over all its rows, so its [N, C] matrix is read once per
// call. The threads split (expert, column tile) tasks. A long prompt's groups go in waves of at
// most kWaveBytes of gathered rows (an expert's rows all in one wave): the scratch stays bounded.
// A product runs through the few-row GEMM kernels (vec_gemm_rows.h: rows_kmajor for a weight
// contiguous along C, the usual layout; rows_nmajor for one contiguous along N, the transposed
// view the backward passes) for an expert with at most kMaxRows rows: those kernels sum each
// element's products in the same order whatever the number of rows, so up to 16 rows an expert
// (a decode batch) a row's result does not depend on how many other rows chose its expert (nor on
// the tile or the thread count), the guarantee ``linear`` gives (NOTE [gemm paths] in gemm.h).
// float16/bfloat16, or a weight contiguous along neither dim, has each tile widened (copied) into
// a contiguous [C, tile] float32 (float64) block first and runs rows_nmajor over it: matmul's
// float32 path for the 16-bit floats (to_contiguous, then the few-row GEMM over B contiguous
// along N). A float32/float64 expert with more rows (a prompt) runs the GEMM driver over all of
// them, as matmul does (the packed, cache-blocked kernel, the threads inside it). So a float32 or
// float64 expert gives the decomposition's bits (an index_select, an mm and an index_add per
// expert) for any number of rows, and a 16-bit one up to 16 rows; past 16 the 16-bit floats keep
// the row kernels (matmul's 16-bit product rounds differently there).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "buffer.h"
#include "gemm.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

// -- moe_route ------------------------------------------------------------------------------

// The stable sort's order for descending keys: nan before everything, then larger first.
template <class C>
inline bool desc_before(C x, C y) {
  if (std::isnan(y)) return false;
  if (std::isnan(x)) return true;
  return x > y;
}

template <class C>
const VecTable* exp_table() {
  if constexpr (std::is_same_v<C, float>) {
    return &vec();
  } else {
    return nullptr;
  }
}

// C: float (float32, float16 and bfloat16 logits) or double (float64 logits).
template <class T, class C>
void moe_route_typed(const View& weights, const View& experts, const View& logits, int64_t k, bool normalize) {
  const int64_t rows = logits.shape[0], e = logits.shape[1];
  const VecTable* table = exp_table<C>();  // picked here: throws on a bad KAEL_CPU_ISA before any work
  const DType cd = dtype_of<C>();
  // p [rows, e]: exp(x - max) in place of x, then divided by its row's sum
  const int64_t pshape[2] = {rows, e}, sshape[2] = {rows, 1}, wshape[2] = {rows, k};
  Temp p = make_temp(cd, pshape, 2);
  C* pv = p.view.ptr<C>();
  const T* xs = logits.ptr<T>();
  const int64_t s0 = logits.strides[0], s1 = logits.strides[1];
  const int64_t grain = std::max<int64_t>(1, 8192 / e);
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      C* row = pv + r * e;
      C m = -std::numeric_limits<C>::infinity();  // reduce()'s amax: nan once seen
      for (int64_t j = 0; j < e; ++j) {
        const C v = convert<C>(xs[r * s0 + j * s1]);
        row[j] = v;
        m = (v > m || std::isnan(v)) ? v : m;
      }
      for (int64_t j = 0; j < e; ++j) row[j] = row[j] - m;
      if constexpr (std::is_same_v<C, float>) {
        table->exp_f32(row, row, e);
      } else {
        for (int64_t j = 0; j < e; ++j) row[j] = std::exp(row[j]);
      }
    }
  });
  Temp sums = make_temp(cd, sshape, 2);
  reduce(ReduceOp::Sum, sums.view, p.view, {1});
  Temp w = make_temp(cd, wshape, 2);
  C* wv = w.view.ptr<C>();
  const C* sv = sums.view.ptr<C>();
  int64_t* ev = experts.ptr<int64_t>();
  const int64_t es0 = experts.strides[0], es1 = experts.strides[1];
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> perm(static_cast<size_t>(e));
    for (int64_t r = r0; r < r1; ++r) {
      C* row = pv + r * e;
      const C s = sv[r];
      for (int64_t j = 0; j < e; ++j) row[j] = row[j] / s;
      std::iota(perm.begin(), perm.end(), 0);
      // the stable sort's first k: equal values (nan with nan) in index order
      std::partial_sort(perm.begin(), perm.begin() + k, perm.end(), [&](int64_t a, int64_t b) {
        const C x = row[a], y = row[b];
        if (desc_before(x, y)) return true;
        if (desc_before(y, x)) return false;
        return a < b;
      });
      for (int64_t j = 0; j < k; ++j) {
        const int64_t i = perm[static_cast<size_t>(j)];
        ev[r * es0 + j * es1] = i;
        wv[r * k + j] = row[i];
      }
    }
  });
  if (normalize) {
    reduce(ReduceOp::Sum, sums.view, w.view, {1});
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) wv[r * k + j] = wv[r * k + j] / sv[r];
    }
  }
  copy(weights, w.view);
}

// -- expert_linear --------------------------------------------------------------------------

// Rows per call of a few-row kernel (matmul's kSmall, NOTE [gemm paths] in gemm.h).
constexpr int64_t kMaxRows = 16;
// The most bytes of gathered x rows held at once (NOTE [expert_linear grouping]: the waves).
constexpr int64_t kWaveBytes = int64_t{32} << 20;

// How a tile of one expert's matrix reaches the row kernels.
enum class WeightPath {
  KMajor,  // in place, contiguous along C: rows_kmajor (dot products)
  NMajor,  // in place, contiguous along N: rows_nmajor (B's rows streamed through C)
  Packed,  // widened / copied into a contiguous [C, tile] block: rows_nmajor
};

template <class C>
const GemmKernels<C>& gemm_table() {
  if constexpr (std::is_same_v<C, float>) {
    return vec().sgemm;
  } else {
    return vec().dgemm;
  }
}

// One expert's rows: [begin, end) of the assignments sorted by expert.
struct Group {
  int64_t expert, begin, end;
};

// T: the storage dtype of x, weight and out; C: what the product runs in (float for the 16-bit floats).
template <class T>
void expert_linear_typed(const View& out, const View& x, const View& weight, const std::vector<int64_t>& ids) {
  using C = compute_t<T>;
  const GemmKernels<C>& g = gemm_table<C>();  // picked here: throws on a bad KAEL_CPU_ISA before any work
  const int64_t tk = static_cast<int64_t>(ids.size()), kk = x.shape[1], c = x.shape[2];
  const int64_t ne = weight.shape[0], n = weight.shape[1];
  const int64_t ws0 = weight.strides[0], ws1 = weight.strides[1], ws2 = weight.strides[2];

  // The counting sort: order[r] = the r-th assignment (t * K + j) by expert, stable.
  std::vector<int64_t> start(static_cast<size_t>(ne) + 1, 0);
  for (const int64_t id : ids) ++start[static_cast<size_t>(id) + 1];
  for (int64_t i = 0; i < ne; ++i) start[static_cast<size_t>(i) + 1] += start[static_cast<size_t>(i)];
  std::vector<int64_t> order(ids.size());
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t a = 0; a < tk; ++a) order[static_cast<size_t>(next[static_cast<size_t>(ids[a])]++)] = a;
  }
  std::vector<Group> groups;
  for (int64_t i = 0; i < ne; ++i) {
    if (start[i + 1] > start[i]) groups.push_back({i, start[i], start[i + 1]});
  }

  // The path matmul's few-row GEMM takes for B = W[e]^T [C, N] (rsb = ws2, csb = ws1): n-major
  // when csb == 1 (a single column counts as contiguous), else k-major when rsb == 1.
  WeightPath path = WeightPath::Packed;
  if constexpr (std::is_same_v<T, C>) {
    if (ws1 == 1 || n == 1) {
      path = WeightPath::NMajor;
    } else if (ws2 == 1 || c == 1) {
      path = WeightPath::KMajor;
    }
  }
  // Column tiles: about 64 KiB of the matrix each, a multiple of 48 columns (the row kernels' 8- and
  // 3-column blocks, whole vectors); longer runs along N for the in-place n-major path.
  const int64_t per_col = c * static_cast<int64_t>(sizeof(C));
  int64_t tile = std::max<int64_t>(48, (int64_t{64} << 10) / per_col / 48 * 48);
  if (path == WeightPath::NMajor) tile = std::max<int64_t>(tile, 256);
  tile = std::min(tile, n);
  const int64_t tiles = (n + tile - 1) / tile;

  // Waves of consecutive groups whose rows take at most kWaveBytes gathered (one group at least),
  // so a long prompt's scratch stays bounded: [first group, last group + 1) each.
  std::vector<std::pair<size_t, size_t>> waves;
  int64_t most = 0;  // rows of the largest wave
  for (size_t g0 = 0; g0 < groups.size();) {
    size_t g1 = g0;
    int64_t rows = 0;
    do {
      rows += groups[g1].end - groups[g1].begin;
      ++g1;
    } while (g1 < groups.size() && (rows + groups[g1].end - groups[g1].begin) * per_col <= kWaveBytes);
    waves.emplace_back(g0, g1);
    most = std::max(most, rows);
    g0 = g1;
  }
  Buffer xbuf(static_cast<size_t>(most * c) * sizeof(C));
  C* xs = xbuf.get<C>();
  const T* xp = x.ptr<T>();
  const int64_t xs0 = x.strides[0], xs1 = x.strides[1], xs2 = x.strides[2];
  T* op = out.ptr<T>();
  const int64_t os0 = out.strides[0], os1 = out.strides[1], os2 = out.strides[2];
  const T* wp = weight.ptr<T>();

  // out[t, j, n0:n0 + w] = 0 + the product's rows rounded to T: the decomposition's index_add into zeros.
  // y [m, ldy] holds the rows of sorted assignments r0 .. r0 + m.
  auto put = [&](int64_t r0, int64_t m, const C* y, int64_t ldy, int64_t n0, int64_t w) {
    for (int64_t i = 0; i < m; ++i) {
      const int64_t asg = order[static_cast<size_t>(r0 + i)];
      T* dst = op + (asg / kk) * os0 + (asg % kk) * os1 + n0 * os2;
      const C* yr = y + i * ldy;
      for (int64_t j = 0; j < w; ++j) dst[j * os2] = convert<T>(convert<C>(convert<T>(yr[j])) + C(0));
    }
  };
  // An expert whose rows run through the GEMM driver (float32/float64, more than kMaxRows rows)
  auto by_gemm = [&](const Group& grp) { return std::is_same_v<T, C> && grp.end - grp.begin > kMaxRows; };

  for (const auto& wave : waves) {
    const size_t g0 = wave.first, g1 = wave.second;  // (plain names: a lambda captures them)
    const int64_t base = groups[g0].begin, rows = groups[g1 - 1].end - base;
    // x's rows of this wave in the sorted order, as C: xs [rows, c] (x may be a stride-0 broadcast over K)
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t a = order[static_cast<size_t>(base + r)];
        const T* src = xp + (a / kk) * xs0 + (a % kk) * xs1;
        C* dst = xs + r * c;
        if constexpr (std::is_same_v<T, C>) {
          if (xs2 == 1) {
            std::memcpy(dst, src, static_cast<size_t>(c) * sizeof(C));
            continue;
          }
        }
        for (int64_t i = 0; i < c; ++i) dst[i] = convert<C>(src[i * xs2]);
      }
    });
    // (expert, column tile) tasks: serial when the whole wave is a small product
    const auto tasks = static_cast<int64_t>(g1 - g0) * tiles;
    const int64_t grain = rows * n * c < (int64_t{1} << 16) ? tasks : 1;
    parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
      Buffer ybuf(static_cast<size_t>(kMaxRows * tile) * sizeof(C));
      Buffer pbuf;
      if (path == WeightPath::Packed) pbuf = Buffer(static_cast<size_t>(c * tile) * sizeof(C));
      C* y = ybuf.get<C>();
      C* packed = pbuf.get<C>();
      for (int64_t task = t0; task < t1; ++task) {
        const Group& grp = groups[g0 + static_cast<size_t>(task / tiles)];
        if (by_gemm(grp)) continue;  // below, over all its columns
        const int64_t n0 = (task % tiles) * tile, w = std::min(tile, n - n0);
        const T* we = wp + grp.expert * ws0 + n0 * ws1;  // W[e, n0:n0 + w, :]
        if (path == WeightPath::Packed) {                // [C, w]: packed[i * w + j] = W[e, n0 + j, i]
          for (int64_t j = 0; j < w; ++j) {
            for (int64_t i = 0; i < c; ++i) packed[i * w + j] = convert<C>(we[j * ws1 + i * ws2]);
          }
        }
        for (int64_t r0 = grp.begin; r0 < grp.end; r0 += kMaxRows) {
          const int64_t m = std::min(kMaxRows, grp.end - r0);
          const C* a = xs + (r0 - base) * c;
          if (path == WeightPath::KMajor) {
            g.rows_kmajor(m, w, c, a, c, reinterpret_cast<const C*>(we), ws1, y, w, 1, false);
          } else if (path == WeightPath::NMajor) {
            g.rows_nmajor(m, w, c, a, c, 1, reinterpret_cast<const C*>(we), ws2, y, w, false);
          } else {
            g.rows_nmajor(m, w, c, a, c, 1, packed, w, y, w, false);
          }
          put(r0, m, y, w, n0, w);
        }
      }
    });
    // the experts with many rows: matmul's product of the gathered rows [m, C] and W[e]^T [C, N]
    for (size_t gi = g0; gi < g1; ++gi) {
      const Group& grp = groups[gi];
      if (!by_gemm(grp)) continue;
      const int64_t m = grp.end - grp.begin;
      Buffer ybuf(static_cast<size_t>(m * n) * sizeof(C));
      C* y = ybuf.get<C>();
      gemm<C>(m, n, c, xs + (grp.begin - base) * c, c, 1, reinterpret_cast<const C*>(wp + grp.expert * ws0), ws2, ws1,
              y, n, 1, false);
      parallel_for(0, m, std::max<int64_t>(1, 16384 / n),
                   [&](int64_t i0, int64_t i1) { put(grp.begin + i0, i1 - i0, y + i0 * n, n, 0, n); });
    }
  }
}

}  // namespace

void moe_route(const View& weights, const View& experts, const View& logits, int64_t k, bool normalize) {
  KAEL_CHECK(logits.ndim == 2, Shape, "moe_route: logits must be [T, E], got ", logits.ndim, " dims");
  KAEL_CHECK(is_floating(logits.dtype), DType, "moe_route: logits must be floating-point, got ",
             dtype_name(logits.dtype));
  const int64_t rows = logits.shape[0], e = logits.shape[1];
  KAEL_CHECK(k >= 1 && k <= e, Shape, "moe_route: k=", k, " must be in [1, ", e, "] (the number of experts)");
  const DType wd = logits.dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  KAEL_CHECK(weights.dtype == wd && experts.dtype == DType::Int64, DType, "moe_route: weights must be ", dtype_name(wd),
             " and experts int64 for ", dtype_name(logits.dtype), " logits, got ", dtype_name(weights.dtype), " and ",
             dtype_name(experts.dtype));
  for (const View* v : {&weights, &experts}) {
    KAEL_CHECK(v->ndim == 2 && v->shape[0] == rows && v->shape[1] == k, Shape,
               "moe_route: weights and experts must be [", rows, ", ", k, "]");
  }
  if (rows == 0) return;
  switch (logits.dtype) {
    case DType::Float16:
      moe_route_typed<Half, float>(weights, experts, logits, k, normalize);
      break;
    case DType::BFloat16:
      moe_route_typed<BFloat16, float>(weights, experts, logits, k, normalize);
      break;
    case DType::Float32:
      moe_route_typed<float, float>(weights, experts, logits, k, normalize);
      break;
    default:
      moe_route_typed<double, double>(weights, experts, logits, k, normalize);
      break;
  }
}

void expert_linear(const View& out, const View& x, const View& weight, const View& experts) {
  KAEL_CHECK(x.ndim == 3 && weight.ndim == 3 && experts.ndim == 2 && out.ndim == 3, Shape,
             "expert_linear: expected x [T, K, C], weight [E, N, C], experts [T, K] and out [T, K, N], got ", x.ndim,
             ", ", weight.ndim, ", ", experts.ndim, " and ", out.ndim, " dims");
  const int64_t t = experts.shape[0], kk = experts.shape[1], ne = weight.shape[0], n = weight.shape[1],
                c = weight.shape[2];
  KAEL_CHECK(x.shape[0] == t && x.shape[1] == kk && x.shape[2] == c && out.shape[0] == t && out.shape[1] == kk &&
                 out.shape[2] == n,
             Shape, "expert_linear: x [", x.shape[0], ", ", x.shape[1], ", ", x.shape[2], "] and out [", out.shape[0],
             ", ", out.shape[1], ", ", out.shape[2], "] do not fit experts [", t, ", ", kk, "] and weight [", ne, ", ",
             n, ", ", c, "] (expected x [", t, ", ", kk, ", ", c, "] and out [", t, ", ", kk, ", ", n, "])");
  KAEL_CHECK(is_floating(out.dtype) && x.dtype == out.dtype && weight.dtype == out.dtype, DType,
             "expert_linear: x, weight and out must share a floating-point dtype, got ", dtype_name(x.dtype), ", ",
             dtype_name(weight.dtype), " and ", dtype_name(out.dtype));
  KAEL_CHECK(experts.dtype == DType::Int64, DType, "expert_linear: experts must be int64, got ",
             dtype_name(experts.dtype));
  // the ids, checked before anything is written
  std::vector<int64_t> ids(static_cast<size_t>(t * kk));
  const auto* ep = experts.ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < kk; ++j) {
      const int64_t id = ep[i * experts.strides[0] + j * experts.strides[1]];
      KAEL_CHECK(id >= 0 && id < ne, Index, "expert_linear: expert ", id, " at [", i, ", ", j, "] is out of range for ",
                 ne, " experts (expected 0 <= expert < ", ne, ")");
      ids[static_cast<size_t>(i * kk + j)] = id;
    }
  }
  if (out.numel() == 0) return;
  if (c == 0) {  // empty products: zeros (the row kernels need a depth)
    fill(out, Scalar{});
    return;
  }
  KAEL_DISPATCH_FLOATS(out.dtype, "expert_linear", (expert_linear_typed<T>(out, x, weight, ids)));
}

}  // namespace kael
