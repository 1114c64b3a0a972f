// Reductions over any set of dims: sum, prod, amax, amin, argmax, argmin, any, all.
//
// NOTE [reduction layouts]: the reduced dims (R) and kept dims (K) are coalesced
// separately. When R is one contiguous run, each output reduces a contiguous row
// (float32 sums use the vector table; few long rows are split across threads and
// the partial results combined). When K's innermost dim is contiguous instead
// (reducing over leading dims), rows of R are accumulated into a block of columns
// at once. Anything else walks R with strided pointers per output element. float32
// sums and products accumulate in float64 (a float32 running product can underflow
// or overflow part way, depending on the order, where a float64 one does not);
// integers wrap; max/min propagate nan; arg ops return the first extremum (the first
// nan, if any), like NumPy.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "buffer.h"
#include "elementwise.h"
#include "kernels.h"
#include "vec.h"

namespace kael {
namespace {

template <class T>
inline bool isnan_(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    (void)v;
    return false;
  }
}

// How one op accumulates elements of T (arg ops are handled separately).
template <ReduceOp OP, class T>
struct Policy {
  static constexpr bool logical = OP == ReduceOp::Any || OP == ReduceOp::All ||
                                  (std::is_same_v<T, bool> && (OP == ReduceOp::Sum || OP == ReduceOp::Prod));
  using A = std::conditional_t<
      logical, bool,
      std::conditional_t<((OP == ReduceOp::Sum || OP == ReduceOp::Prod) && std::is_same_v<T, float>), double, T>>;
  static A init() {
    if constexpr (logical) {
      return OP == ReduceOp::All || OP == ReduceOp::Prod;
    } else if constexpr (OP == ReduceOp::Sum) {
      return A(0);
    } else if constexpr (OP == ReduceOp::Prod) {
      return A(1);
    } else if constexpr (OP == ReduceOp::Amax) {
      return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                  : std::numeric_limits<T>::lowest();
    } else {
      return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
    }
  }
  static A step(A acc, T v) {
    if constexpr (logical) {
      if constexpr (OP == ReduceOp::All || OP == ReduceOp::Prod) {
        return acc && v != T(0);
      } else {
        return acc || v != T(0);
      }
    } else if constexpr (OP == ReduceOp::Sum) {
      if constexpr (std::is_floating_point_v<A>)
        return acc + static_cast<A>(v);
      else
        return wrap_add<A>(acc, v);
    } else if constexpr (OP == ReduceOp::Prod) {
      if constexpr (std::is_floating_point_v<A>)
        return acc * v;
      else
        return wrap_mul<A>(acc, v);
    } else if constexpr (OP == ReduceOp::Amax) {
      return (v > acc || isnan_(v)) ? v : acc;
    } else {
      return (v < acc || isnan_(v)) ? v : acc;
    }
  }
  static A combine(A x, A y) {
    if constexpr (logical || OP == ReduceOp::Amax || OP == ReduceOp::Amin) {
      return step(x, static_cast<T>(y));
    } else if constexpr (OP == ReduceOp::Sum) {
      if constexpr (std::is_floating_point_v<A>)
        return x + y;
      else
        return wrap_add<A>(x, y);
    } else {
      if constexpr (std::is_floating_point_v<A>)
        return x * y;
      else
        return wrap_mul<A>(x, y);
    }
  }
  // A contiguous row.
  static A row(const T* p, int64_t n) {
    if constexpr (OP == ReduceOp::Sum && std::is_same_v<T, float>) {
      return vec().sum_f32(p, n);
    } else if constexpr (OP == ReduceOp::Sum && std::is_same_v<T, double>) {
      double s[4] = {0, 0, 0, 0};  // four chains: vectorisable and a little more accurate
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) {
        for (int j = 0; j < 4; ++j) s[j] += p[i + j];
      }
      for (; i < n; ++i) s[0] += p[i];
      return (s[0] + s[1]) + (s[2] + s[3]);
    } else {
      A acc = init();
      for (int64_t i = 0; i < n; ++i) acc = step(acc, p[i]);
      return acc;
    }
  }
};

// Arg ops: (value, index) with "first extremum, nan first".
template <ReduceOp OP, class T>
inline bool better(T v, T best) {
  if (isnan_(v)) return !isnan_(best);
  return OP == ReduceOp::Argmax ? v > best : v < best;
}

struct Geometry {
  int nk = 0, nr = 0;
  int64_t kshape[kMaxDims] = {}, ka[kMaxDims] = {}, ko[kMaxDims] = {};  // kept dims: a and out strides (elements)
  int64_t rshape[kMaxDims] = {}, ra[kMaxDims] = {};                     // reduced dims: a strides
  int64_t nkept = 1, nred = 1;
};

Geometry geometry(const View& out, const View& a, const std::vector<int>& dims) {
  Geometry g;
  bool red[kMaxDims] = {};
  for (int d : dims) red[d] = true;
  int kd[kMaxDims], rd[kMaxDims];
  int nk = 0, nr = 0;
  for (int d = 0; d < a.ndim; ++d) {
    if (a.shape[d] == 1) continue;
    (red[d] ? rd[nr++] : kd[nk++]) = d;
  }
  // R: strides descending, then coalesce
  std::stable_sort(rd, rd + nr, [&](int x, int y) { return a.strides[x] > a.strides[y]; });
  for (int i = 0; i < nr; ++i) {
    const int d = rd[i];
    if (g.nr > 0 && g.ra[g.nr - 1] == a.strides[d] * a.shape[d]) {
      g.rshape[g.nr - 1] *= a.shape[d];
      g.ra[g.nr - 1] = a.strides[d];
    } else {
      g.rshape[g.nr] = a.shape[d];
      g.ra[g.nr] = a.strides[d];
      ++g.nr;
    }
  }
  for (int i = 0; i < nk; ++i) {
    const int d = kd[i];
    if (g.nk > 0 && g.ka[g.nk - 1] == a.strides[d] * a.shape[d] && g.ko[g.nk - 1] == out.strides[d] * a.shape[d]) {
      g.kshape[g.nk - 1] *= a.shape[d];
      g.ka[g.nk - 1] = a.strides[d];
      g.ko[g.nk - 1] = out.strides[d];
    } else {
      g.kshape[g.nk] = a.shape[d];
      g.ka[g.nk] = a.strides[d];
      g.ko[g.nk] = out.strides[d];
      ++g.nk;
    }
  }
  for (int i = 0; i < g.nk; ++i) g.nkept *= g.kshape[i];
  for (int i = 0; i < g.nr; ++i) g.nred *= g.rshape[i];
  return g;
}

// Offsets (a, out) of kept index i.
inline void kept_offsets(const Geometry& g, int64_t i, int64_t* oa, int64_t* oo) {
  int64_t a = 0, o = 0;
  for (int d = g.nk - 1; d >= 0; --d) {
    const int64_t idx = i % g.kshape[d];
    i /= g.kshape[d];
    a += idx * g.ka[d];
    o += idx * g.ko[d];
  }
  *oa = a;
  *oo = o;
}

// Visit every reduced element of the slice at p: f(value, linear reduced index).
template <class T, class F>
inline void walk_reduced(const Geometry& g, const T* p, F&& f) {
  if (g.nr == 0) {
    f(*p, 0);
    return;
  }
  int64_t idx[kMaxDims] = {};
  const int last = g.nr - 1;
  const int64_t n = g.rshape[last], s = g.ra[last];
  int64_t lin = 0;
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < last; ++d) off += idx[d] * g.ra[d];
    const T* q = p + off;
    for (int64_t j = 0; j < n; ++j) f(q[j * s], lin + j);
    lin += n;
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < g.rshape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

template <ReduceOp OP, class T>
void reduce_values(const View& out, const View& a, const Geometry& g) {
  using P = Policy<OP, T>;
  using A = typename P::A;
  using O = std::conditional_t<P::logical, bool, T>;
  const T* base = a.ptr<T>();
  O* obase = out.ptr<O>();
  const bool inner_rows = g.nr == 1 && g.ra[0] == 1;
  if (inner_rows && g.nkept < int64_t{2} * get_num_threads() && g.nred >= (int64_t{1} << 16)) {
    // few long rows: split each row across threads
    for (int64_t i = 0; i < g.nkept; ++i) {
      int64_t oa = 0, oo = 0;
      kept_offsets(g, i, &oa, &oo);
      const int64_t n = g.nred;
      const int64_t chunks = std::max<int64_t>(1, parallel_chunks(0, n, 1 << 15));
      std::vector<A> part(static_cast<size_t>(chunks), P::init());
      parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
          part[static_cast<size_t>(c)] = P::row(base + oa + b, e - b);
        }
      });
      A acc = part[0];
      for (size_t c = 1; c < part.size(); ++c) acc = P::combine(acc, part[c]);
      obase[oo] = convert<O>(acc);
    }
    return;
  }
  if (inner_rows) {
    parallel_for(0, g.nkept, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.nred)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t i = b; i < e; ++i) {
                     int64_t oa = 0, oo = 0;
                     kept_offsets(g, i, &oa, &oo);
                     obase[oo] = convert<O>(P::row(base + oa, g.nred));
                   }
                 });
    return;
  }
  if (g.nk >= 1 && g.ka[g.nk - 1] == 1 && g.ko[g.nk - 1] == 1) {
    // columns: K's inner dim is contiguous; accumulate blocks of columns over R
    constexpr int64_t kCols = 256;
    const int64_t cols = g.kshape[g.nk - 1];
    const int64_t outer = g.nkept / cols;
    const int64_t cblocks = (cols + kCols - 1) / kCols;
    Geometry go = g;  // the outer kept dims only
    go.nk = g.nk - 1;
    parallel_for(0, outer * cblocks, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.nred * kCols)),
                 [&](int64_t b, int64_t e) {
                   A acc[kCols];
                   for (int64_t t = b; t < e; ++t) {
                     const int64_t ob = t / cblocks, c0 = (t % cblocks) * kCols;
                     const int64_t w = std::min(kCols, cols - c0);
                     int64_t oa = 0, oo = 0;
                     kept_offsets(go, ob, &oa, &oo);
                     for (int64_t j = 0; j < w; ++j) acc[j] = P::init();
                     const T* p = base + oa + c0;
                     int64_t idx[kMaxDims] = {};
                     for (;;) {
                       int64_t off = 0;
                       for (int d = 0; d < g.nr; ++d) off += idx[d] * g.ra[d];
                       const T* q = p + off;
                       for (int64_t j = 0; j < w; ++j) acc[j] = P::step(acc[j], q[j]);
                       int d = g.nr - 1;
                       for (; d >= 0; --d) {
                         if (++idx[d] < g.rshape[d]) break;
                         idx[d] = 0;
                       }
                       if (d < 0) break;
                     }
                     for (int64_t j = 0; j < w; ++j) obase[oo + c0 + j] = convert<O>(acc[j]);
                   }
                 });
    return;
  }
  if (g.nr >= 2 && g.ra[g.nr - 1] == 1 && g.rshape[g.nr - 1] >= 8) {
    // R's inner run is contiguous (a sum over (0, 2, 3) of [N, C, H, W]): each output combines
    // the vector row results of its contiguous runs instead of stepping element by element
    Geometry go = g;  // the outer reduced dims only
    go.nr = g.nr - 1;
    const int64_t run = g.rshape[g.nr - 1];
    parallel_for(0, g.nkept, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.nred)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t i = b; i < e; ++i) {
                     int64_t oa = 0, oo = 0;
                     kept_offsets(g, i, &oa, &oo);
                     A acc = P::init();
                     const T* p = base + oa;
                     int64_t idx[kMaxDims] = {};
                     for (;;) {
                       int64_t off = 0;
                       for (int d = 0; d < go.nr; ++d) off += idx[d] * go.ra[d];
                       acc = P::combine(acc, P::row(p + off, run));
                       int d = go.nr - 1;
                       for (; d >= 0; --d) {
                         if (++idx[d] < go.rshape[d]) break;
                         idx[d] = 0;
                       }
                       if (d < 0) break;
                     }
                     obase[oo] = convert<O>(acc);
                   }
                 });
    return;
  }
  parallel_for(0, g.nkept, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.nred)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t oa = 0, oo = 0;
      kept_offsets(g, i, &oa, &oo);
      A acc = P::init();
      walk_reduced(g, base + oa, [&](T v, int64_t) { acc = P::step(acc, v); });
      obase[oo] = convert<O>(acc);
    }
  });
}

template <ReduceOp OP, class T>
void reduce_arg(const View& out, const View& a, const Geometry& g) {
  const T* base = a.ptr<T>();
  auto* obase = out.ptr<int64_t>();
  parallel_for(0, g.nkept, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.nred)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int64_t oa = 0, oo = 0;
      kept_offsets(g, i, &oa, &oo);
      T best = base[oa];
      int64_t where = 0;
      walk_reduced(g, base + oa, [&](T v, int64_t j) {
        if (better<OP, T>(v, best)) {
          best = v;
          where = j;
        }
      });
      obase[oo] = where;
    }
  });
}

template <class T>
void reduce_typed(ReduceOp op, const View& out, const View& a, const Geometry& g) {
  switch (op) {
    case ReduceOp::Sum:
      reduce_values<ReduceOp::Sum, T>(out, a, g);
      break;
    case ReduceOp::Prod:
      reduce_values<ReduceOp::Prod, T>(out, a, g);
      break;
    case ReduceOp::Amax:
      reduce_values<ReduceOp::Amax, T>(out, a, g);
      break;
    case ReduceOp::Amin:
      reduce_values<ReduceOp::Amin, T>(out, a, g);
      break;
    case ReduceOp::Argmax:
      reduce_arg<ReduceOp::Argmax, T>(out, a, g);
      break;
    case ReduceOp::Argmin:
      reduce_arg<ReduceOp::Argmin, T>(out, a, g);
      break;
    case ReduceOp::Any:
      reduce_values<ReduceOp::Any, T>(out, a, g);
      break;
    case ReduceOp::All:
      reduce_values<ReduceOp::All, T>(out, a, g);
      break;
  }
}

const char* op_name(ReduceOp op) {
  static const char* const names[] = {"sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all"};
  return names[static_cast<int>(op)];
}

}  // namespace

void reduce(ReduceOp op, const View& out, const View& a, const std::vector<int>& dims) {
  const char* name = op_name(op);
  KAEL_CHECK(out.ndim == a.ndim, Shape, name, ": output must keep the input's ", a.ndim, " dims");
  bool red[kMaxDims] = {};
  for (int d : dims) {
    KAEL_CHECK(d >= 0 && d < std::max(a.ndim, 1), Index, name, ": dim ", d, " out of range");
    if (a.ndim) red[d] = true;
  }
  for (int d = 0; d < a.ndim; ++d) {
    KAEL_CHECK(out.shape[d] == (red[d] ? 1 : a.shape[d]), Shape, name, ": output size ", out.shape[d], " at dim ", d,
               " should be ", red[d] ? 1 : a.shape[d]);
  }
  const bool arg = op == ReduceOp::Argmax || op == ReduceOp::Argmin;
  KAEL_CHECK(!arg || dims.size() == 1, Shape, name, ": expected exactly one dim, got ", dims.size());
  if (out.numel() == 0) return;
  int64_t nred = 1;
  for (int d : dims) nred *= a.ndim ? a.shape[d] : 1;
  const bool needs_elements = op == ReduceOp::Amax || op == ReduceOp::Amin || arg;
  KAEL_CHECK(!needs_elements || nred > 0, Shape, name, ": cannot reduce over an empty dimension");

  // The dtype the reduction runs in, and the one it produces.
  DType work;
  DType result;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Prod:
      work = is_half(out.dtype) ? DType::Float32 : out.dtype;
      result = work;
      break;
    case ReduceOp::Any:
    case ReduceOp::All:
      work = DType::Bool;
      result = DType::Bool;
      break;
    case ReduceOp::Argmax:
    case ReduceOp::Argmin:
      work = is_half(a.dtype) ? DType::Float32 : a.dtype;
      result = DType::Int64;
      break;
    default:
      work = is_half(a.dtype) ? DType::Float32 : a.dtype;
      result = work;
      break;
  }
  if (a.dtype != work) {
    Temp t = to_contiguous(a, work);
    reduce(op, out, t.view, dims);
    return;
  }
  if (out.dtype != result) {
    Temp t = make_temp(result, out.shape, out.ndim);
    reduce(op, t.view, a, dims);
    copy(out, t.view);
    return;
  }
  if (nred == 0) {  // empty reduction: the identity
    Scalar s;
    s.i = (op == ReduceOp::Prod || op == ReduceOp::All) ? 1 : 0;
    fill(out, s);
    return;
  }
  const Geometry g = geometry(out, a, dims);
  KAEL_DISPATCH_NATIVE(work, name, (reduce_typed<T>(op, out, a, g)));
}

}  // namespace kael
