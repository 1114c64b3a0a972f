// Indexing kernels: gather, index_select, index_add, scatter_add, cat, nonzero,
// sort, topk and embedding. Copies move raw items (any dtype); indices are int64.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "buffer.h"
#include "iter.h"
#include "kernels.h"
#include "lines.h"

namespace kael {
namespace {

// index as a contiguous int64 tensor (a copy only when needed).
Temp int64_index(const View& index, const View** out) {
  Temp t;
  if (index.dtype == DType::Int64) {
    *out = &index;
    return t;
  }
  KAEL_CHECK(is_integral(index.dtype), DType, "index must be an integer tensor, got ", dtype_name(index.dtype));
  t = to_contiguous(index, DType::Int64);
  *out = nullptr;
  return t;
}

template <class U>
void gather_items(const View& out, const View& index, const View& src, int64_t sdim, int64_t bound) {
  const View* ops[3] = {&out, &index, &src};
  const int64_t sb = sdim * static_cast<int64_t>(sizeof(U));
  for_each(ops, kGrainCheap, [sb, bound](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = *reinterpret_cast<const int64_t*>(p[1] + i * s[1]);
      KAEL_CHECK(j >= 0 && j < bound, Index, "gather: index ", j, " is out of bounds for size ", bound);
      std::memcpy(p[0] + i * s[0], p[2] + i * s[2] + j * sb, sizeof(U));
    }
  });
}

template <class T>
using key_t = compute_t<T>;

// Strict weak orders with nan after everything (ascending) or before (descending).
template <class C>
inline bool asc_less(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(x)) return false;
    if (std::isnan(y)) return true;
  }
  return x < y;
}
template <class C>
inline bool desc_less(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(y)) return false;
    if (std::isnan(x)) return true;
  }
  return x > y;
}

template <class T>
void sort_typed(const View& values, const View& indices, const View& a, int dim, bool descending) {
  using C = key_t<T>;
  const int64_t n = a.shape[dim];
  const Lines la = lines_of(a, dim), lv = lines_of(values, dim), li = lines_of(indices, dim);
  const int64_t sa = a.strides[dim], sv = values.strides[dim], si = indices.strides[dim];
  parallel_for(0, la.count, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    std::vector<C> keys(static_cast<size_t>(n));
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t line = b; line < e; ++line) {
      const T* src = a.ptr<T>() + la.offset(line);
      for (int64_t j = 0; j < n; ++j) keys[static_cast<size_t>(j)] = convert<C>(src[j * sa]);
      std::iota(perm.begin(), perm.end(), 0);
      if (descending) {
        std::stable_sort(perm.begin(), perm.end(), [&](int64_t x, int64_t y) {
          return desc_less(keys[static_cast<size_t>(x)], keys[static_cast<size_t>(y)]);
        });
      } else {
        std::stable_sort(perm.begin(), perm.end(), [&](int64_t x, int64_t y) {
          return asc_less(keys[static_cast<size_t>(x)], keys[static_cast<size_t>(y)]);
        });
      }
      T* vo = values.ptr<T>() + lv.offset(line);
      int64_t* io = indices.ptr<int64_t>() + li.offset(line);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t p = perm[static_cast<size_t>(j)];
        vo[j * sv] = src[p * sa];
        io[j * si] = p;
      }
    }
  });
}

template <class T>
void topk_typed(const View& values, const View& indices, const View& x, int64_t k) {
  using C = key_t<T>;
  const int dim = x.ndim - 1;
  const int64_t n = x.shape[dim];
  const Lines lx = lines_of(x, dim), lv = lines_of(values, dim), li = lines_of(indices, dim);
  const int64_t sx = x.strides[dim], sv = values.strides[dim], si = indices.strides[dim];
  parallel_for(0, lx.count, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    std::vector<C> keys(static_cast<size_t>(n));
    std::vector<int64_t> perm(static_cast<size_t>(n));
    for (int64_t line = b; line < e; ++line) {
      const T* src = x.ptr<T>() + lx.offset(line);
      for (int64_t j = 0; j < n; ++j) keys[static_cast<size_t>(j)] = convert<C>(src[j * sx]);
      std::iota(perm.begin(), perm.end(), 0);
      // a total order (ties by index), so the partial sort is deterministic
      auto before = [&](int64_t p, int64_t q) {
        const C kp = keys[static_cast<size_t>(p)], kq = keys[static_cast<size_t>(q)];
        if (desc_less(kp, kq)) return true;
        if (desc_less(kq, kp)) return false;
        return p < q;
      };
      std::partial_sort(perm.begin(), perm.begin() + k, perm.end(), before);
      T* vo = values.ptr<T>() + lv.offset(line);
      int64_t* io = indices.ptr<int64_t>() + li.offset(line);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = perm[static_cast<size_t>(j)];
        vo[j * sv] = src[p * sx];
        io[j * si] = p;
      }
    }
  });
}

template <class T>
void scatter_add_typed(const View& out, const View& index, const View& src, int dim) {
  using C = compute_t<T>;
  const int64_t n = index.shape[dim], bound = out.shape[dim];
  const Lines lx = lines_of(index, dim);
  // the same line positions in out and src: index's shape, their strides
  View o = out, s = src;
  for (int d = 0; d < index.ndim; ++d) {
    o.shape[d] = index.shape[d];
    s.shape[d] = index.shape[d];
  }
  const Lines lo = lines_of(o, dim), ls = lines_of(s, dim);
  const int64_t sx = index.strides[dim], so = out.strides[dim], ss = src.strides[dim];
  parallel_for(0, lx.count, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    for (int64_t line = b; line < e; ++line) {
      const int64_t* ip = index.ptr<int64_t>() + lx.offset(line);
      T* op = out.ptr<T>() + lo.offset(line);
      const T* sp = src.ptr<T>() + ls.offset(line);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = ip[j * sx];
        KAEL_CHECK(t >= 0 && t < bound, Index, "scatter_add: index ", t, " is out of bounds for size ", bound);
        T& dst = op[t * so];
        if constexpr (std::is_same_v<T, bool>) {
          dst = dst || sp[j * ss];
        } else {
          dst = convert<T>(static_cast<C>(convert<C>(dst) + convert<C>(sp[j * ss])));
        }
      }
    }
  });
}

// index_add along dim 0 with contiguous rows: threads own column ranges, so
// duplicate indices never race.
template <class T>
void index_add_rows(const View& out, const int64_t* idx, int64_t count, const View& src) {
  const int64_t d = out.numel() / std::max<int64_t>(1, out.shape[0]);
  const int64_t so = out.strides[0], ss = src.strides[0];
  parallel_for(0, d, std::max<int64_t>(64, kGrainCheap / std::max<int64_t>(1, count)), [&](int64_t c0, int64_t c1) {
    for (int64_t j = 0; j < count; ++j) {
      T* o = out.ptr<T>() + idx[j] * so;
      const T* s = src.ptr<T>() + j * ss;
      for (int64_t c = c0; c < c1; ++c) o[c] += s[c];
    }
  });
}

bool rows_contiguous(const View& v) {
  int64_t expected = 1;
  for (int d = v.ndim - 1; d >= 1; --d) {
    if (v.shape[d] != 1 && v.strides[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

}  // namespace

void gather(const View& out, const View& a, const View& index, int dim) {
  KAEL_CHECK(index.ndim == a.ndim && out.ndim == a.ndim, Shape, "gather: index and output need the input's ", a.ndim,
             " dims");
  for (int d = 0; d < a.ndim; ++d) {
    KAEL_CHECK(out.shape[d] == index.shape[d], Shape, "gather: output shape must equal the index shape");
    KAEL_CHECK(d == dim || index.shape[d] <= a.shape[d], Shape, "gather: index size ", index.shape[d],
               " exceeds the input's ", a.shape[d], " at dim ", d);
  }
  if (out.numel() == 0) return;
  KAEL_CHECK(out.dtype == a.dtype, DType, "gather: output dtype must equal the input's");
  const View* ip = nullptr;
  Temp it = int64_index(index, &ip);
  const View& idx = ip ? *ip : it.view;
  View src = a;
  int64_t sdim = 0, bound = 1;
  if (a.ndim > 0) {
    for (int d = 0; d < a.ndim; ++d) src.shape[d] = index.shape[d];
    sdim = a.strides[dim];
    bound = a.shape[dim];
    src.strides[dim] = 0;
  }
  switch (a.elsize()) {
    case 1:
      gather_items<uint8_t>(out, idx, src, sdim, bound);
      break;
    case 2:
      gather_items<uint16_t>(out, idx, src, sdim, bound);
      break;
    case 4:
      gather_items<uint32_t>(out, idx, src, sdim, bound);
      break;
    default:
      gather_items<uint64_t>(out, idx, src, sdim, bound);
      break;
  }
}

void index_select(const View& out, const View& a, const View& index, int dim) {
  KAEL_CHECK(index.ndim <= 1, Shape, "index_select: index must be 0-d or 1-d");
  KAEL_CHECK(out.ndim == a.ndim && dim < a.ndim, Shape, "index_select: output must have the input's rank");
  const int64_t count = index.ndim ? index.shape[0] : 1;
  KAEL_CHECK(out.shape[dim] == count, Shape, "index_select: output size ", out.shape[dim], " at dim ", dim,
             " != number of indices ", count);
  if (out.numel() == 0) return;
  const View* ip = nullptr;
  Temp it = int64_index(index, &ip);
  const View& idx = ip ? *ip : it.view;
  const int64_t st = idx.ndim ? idx.strides[0] : 0, bound = a.shape[dim];
  const int64_t inner = out.numel() / count;
  const bool rows = dim == 0 && rows_contiguous(out) && rows_contiguous(a) && out.dtype == a.dtype;
  parallel_for(0, count, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, inner)), [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const int64_t t = idx.ptr<int64_t>()[j * st];
      KAEL_CHECK(t >= 0 && t < bound, Index, "index_select: index ", t, " is out of bounds for dimension ", dim,
                 " with size ", bound);
      if (rows) {
        std::memcpy(out.data + j * out.strides[0] * out.elsize(), a.data + t * a.strides[0] * a.elsize(),
                    static_cast<size_t>(inner * a.elsize()));
      } else {
        copy(select(out, dim, j), select(a, dim, t));
      }
    }
  });
}

void index_add(const View& out, const View& index, const View& src, int dim) {
  KAEL_CHECK(index.ndim <= 1, Shape, "index_add: index must be 0-d or 1-d");
  const int64_t count = index.ndim ? index.shape[0] : 1;
  KAEL_CHECK(src.ndim == out.ndim && src.shape[dim] == count, Shape, "index_add: source size ",
             src.ndim ? src.shape[dim] : 0, " at dim ", dim, " != number of indices ", count);
  if (count == 0 || out.numel() == 0) return;
  const View* ip = nullptr;
  Temp it = int64_index(index, &ip);
  const View& idx = ip ? *ip : it.view;
  const int64_t st = idx.ndim ? idx.strides[0] : 0, bound = out.shape[dim];
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const int64_t t = idx.ptr<int64_t>()[j * st];
    KAEL_CHECK(t >= 0 && t < bound, Index, "index_add: index ", t, " is out of bounds for dimension ", dim,
               " with size ", bound);
    ids[static_cast<size_t>(j)] = t;
  }
  if (is_half(out.dtype)) {  // accumulate in float32, round once
    Temp acc = to_contiguous(out, DType::Float32);
    index_add(acc.view, index, src, dim);
    copy(out, acc.view);
    return;
  }
  if (dim == 0 && src.dtype == out.dtype && rows_contiguous(out) && rows_contiguous(src) &&
      (out.dtype == DType::Float32 || out.dtype == DType::Float64)) {
    KAEL_DISPATCH_FLOAT(out.dtype, "index_add", (index_add_rows<T>(out, ids.data(), count, src)));
    return;
  }
  for (int64_t j = 0; j < count; ++j) {
    const View o = select(out, dim, ids[static_cast<size_t>(j)]);
    binary(BinaryOp::Add, o, o, select(src, dim, j));
  }
}

void scatter_add(const View& out, const View& index, const View& src, int dim) {
  KAEL_CHECK(index.ndim == out.ndim && src.ndim == out.ndim, Shape, "scatter_add: index, source and output need ",
             "the same rank");
  for (int d = 0; d < index.ndim; ++d) {
    KAEL_CHECK(index.shape[d] <= src.shape[d] && (d == dim || index.shape[d] <= out.shape[d]), Shape,
               "scatter_add: index shape exceeds the source or output at dim ", d);
  }
  if (index.numel() == 0) return;
  const View* ip = nullptr;
  Temp it = int64_index(index, &ip);
  const View& idx = ip ? *ip : it.view;
  if (src.dtype != out.dtype) {
    Temp ts = to_contiguous(src, out.dtype);
    scatter_add(out, idx, ts.view, dim);
    return;
  }
  KAEL_DISPATCH(out.dtype, "scatter_add", (scatter_add_typed<T>(out, idx, src, dim)));
}

void cat(const View& out, const std::vector<View>& parts, int dim) {
  int64_t off = 0;
  for (const View& p : parts) {
    KAEL_CHECK(p.ndim == out.ndim, Shape, "cat: every tensor needs the output's ", out.ndim, " dims");
    for (int d = 0; d < out.ndim; ++d) {
      KAEL_CHECK(d == dim || p.shape[d] == out.shape[d], Shape, "cat: sizes differ at dim ", d);
    }
    const int64_t len = p.shape[dim];
    KAEL_CHECK(off + len <= out.shape[dim], Shape, "cat: parts exceed the output along dim ", dim);
    if (len > 0 && p.numel() > 0) copy(narrow(out, dim, off, len), p);
    off += len;
  }
  KAEL_CHECK(off == out.shape[dim], Shape, "cat: parts cover ", off, " of ", out.shape[dim], " along dim ", dim);
}

void nonzero(const View& out, const View& mask) {
  KAEL_CHECK(out.dtype == DType::Int64 && out.ndim == 2 && out.shape[1] == mask.ndim, Shape,
             "nonzero: output must be int64 [n, ", mask.ndim, "]");
  if (mask.ndim == 0) return;
  Temp tb;
  const View* m = &mask;
  if (mask.dtype != DType::Bool) {
    tb = to_contiguous(mask, DType::Bool);
    m = &tb.view;
  }
  const int64_t total = m->numel(), rows = out.shape[0];
  int64_t idx[kMaxDims] = {};
  int64_t found = 0;
  for (int64_t i = 0; i < total; ++i) {
    if (*reinterpret_cast<const uint8_t*>(m->at(idx)) != 0) {
      KAEL_CHECK(found < rows, Shape, "nonzero: more true elements than the output's ", rows, " rows");
      int64_t* row = out.ptr<int64_t>() + found * out.strides[0];
      for (int d = 0; d < m->ndim; ++d) row[d * out.strides[1]] = idx[d];
      ++found;
    }
    for (int d = m->ndim - 1; d >= 0; --d) {
      if (++idx[d] < m->shape[d]) break;
      idx[d] = 0;
    }
  }
  KAEL_CHECK(found == rows, Shape, "nonzero: found ", found, " true elements for an output of ", rows, " rows");
}

void sort(const View& values, const View& indices, const View& a, int dim, bool descending) {
  KAEL_CHECK(values.dtype == a.dtype && indices.dtype == DType::Int64, DType,
             "sort: values must have the input's dtype and indices int64");
  KAEL_CHECK(values.ndim == a.ndim && indices.ndim == a.ndim, Shape, "sort: outputs need the input's shape");
  if (a.numel() == 0) return;
  if (a.ndim == 0) {
    copy(values, a);
    Scalar zero;
    fill(indices, zero);
    return;
  }
  KAEL_DISPATCH(a.dtype, "sort", (sort_typed<T>(values, indices, a, dim, descending)));
}

void topk(const View& values, const View& indices, const View& x, int64_t k) {
  KAEL_CHECK(x.ndim >= 1, Shape, "topk: expected at least one dimension");
  const int dim = x.ndim - 1;
  KAEL_CHECK(k >= 0 && k <= x.shape[dim], Shape, "topk: k=", k, " is out of range for a last dimension of size ",
             x.shape[dim]);
  KAEL_CHECK(values.dtype == x.dtype && indices.dtype == DType::Int64, DType,
             "topk: values must have the input's dtype and indices int64");
  KAEL_CHECK(values.ndim == x.ndim && indices.ndim == x.ndim && values.shape[dim] == k && indices.shape[dim] == k,
             Shape, "topk: outputs must be [..., ", k, "]");
  if (values.numel() == 0) return;
  KAEL_DISPATCH(x.dtype, "topk", (topk_typed<T>(values, indices, x, k)));
}

void embedding(const View& out, const View& weight, const View& ids) {
  KAEL_CHECK(weight.ndim == 2, Shape, "embedding: weight must be [num_embeddings, dim]");
  KAEL_CHECK(out.ndim == ids.ndim + 1 && out.shape[out.ndim - 1] == weight.shape[1], Shape,
             "embedding: output must be [*ids.shape, ", weight.shape[1], "]");
  KAEL_CHECK(out.dtype == weight.dtype, DType, "embedding: output dtype must equal the weight's");
  const int64_t n = ids.numel(), d = weight.shape[1], bound = weight.shape[0];
  if (n == 0 || d == 0) return;
  Temp it;
  const View* idv = &ids;
  if (ids.dtype != DType::Int64 || !ids.is_contiguous()) {
    it = to_contiguous(ids, DType::Int64);
    idv = &it.view;
  }
  Temp ot;
  const View* ov = &out;
  if (!out.is_contiguous()) {
    ot = make_temp(out.dtype, out.shape, out.ndim);
    ov = &ot.view;
  }
  const int64_t* id = idv->ptr<int64_t>();
  const int64_t isz = weight.elsize();
  const View wrow0 = select(weight, 0, 0);
  parallel_for(0, n, std::max<int64_t>(1, kGrainCheap / d), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t t = id[p];
      KAEL_CHECK(t >= 0 && t < bound, Index, "embedding: id ", t, " is out of range for ", bound, " embeddings");
      char* dst = ov->data + p * d * isz;
      const char* src = weight.data + t * weight.strides[0] * isz;
      if (weight.strides[1] == 1) {
        std::memcpy(dst, src, static_cast<size_t>(d * isz));
      } else {
        View from = wrow0;
        from.data = const_cast<char*>(src);
        copy(contiguous_view(dst, out.dtype, {d}), from);
      }
    }
  });
  if (ov != &out) copy(out, *ov);
}

}  // namespace kael
