// batch_norm and batch_norm_backward over x [N, C, *S] viewed as rows [N, C, S].
//
// Statistics: one task per channel sums its N rows of S contiguous elements in float64, in
// kChains interleaved chains (two passes: the mean, then the squared deviations), so no thread shares an
// accumulator and the result does not depend on the thread count. Normalising (and dx in
// the backward) then runs one task per (n, c) row. Operands that are not contiguous, or
// are 16-bit floats, are copied to contiguous float32/64 first; outputs are written in
// place when they are contiguous of the working dtype, else through a scratch buffer.
#include "batch_norm.h"

#include <cmath>

#include "buffer.h"
#include "check.h"
#include "iter.h"
#include "kernels.h"
#include "thread_pool.h"

namespace kael {
namespace {

DType work_dtype(DType d) {
  return d == DType::Float64 ? DType::Float64 : DType::Float32;
}

struct Rows {
  int64_t n = 0, c = 0, s = 1;
};

Rows rows_of(const View& x) {
  Rows r{x.shape[0], x.shape[1], 1};
  for (int i = 2; i < x.ndim; ++i) r.s *= x.shape[i];
  return r;
}

// A contiguous view of v in dtype d: v itself when it already is one, else a copy kept in keep.
View dense(const View& v, DType d, Temp* keep) {
  if (v.dtype == d && v.is_contiguous()) return v;
  *keep = to_contiguous(v, d);
  return keep->view;
}

// Where to compute an output: out itself when it is contiguous of dtype d, else scratch (copied at the end).
View target(const View& out, DType d, Temp* keep) {
  if (out.dtype == d && out.is_contiguous()) return out;
  *keep = make_temp(d, out.shape, out.ndim);
  return keep->view;
}

void finish(const View& out, const View& computed) {
  if (computed.data != out.data) copy(out, computed);
}

// Channel sums in float64 run in kChains independent chains (values i, i + kChains, ... of each row), added
// in a fixed order at the end: one chain is a dependent float64 add per value, several times slower, and
// the order still depends on the shape only (never the thread count).
constexpr int64_t kChains = 8;

double fold(const double* acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// sum over channel c's rows of f(row, i), f giving a double.
template <class T, class F>
double channel_sum_of(const T* p, const Rows& r, int64_t c, F f) {
  double acc[kChains] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t n = 0; n < r.n; ++n) {
    const T* row = p + (n * r.c + c) * r.s;
    int64_t i = 0;
    for (; i + kChains <= r.s; i += kChains) {
      for (int64_t k = 0; k < kChains; ++k) acc[k] += f(row, i + k);
    }
    for (; i < r.s; ++i) acc[i % kChains] += f(row, i);
  }
  return fold(acc);
}

template <class T>
double channel_sum(const T* p, const Rows& r, int64_t c) {
  return channel_sum_of(p, r, c, [](const T* row, int64_t i) { return static_cast<double>(row[i]); });
}

template <class T>
void forward_typed(const View& out, const View& mean, const View& rstd, const View& x, const T* w, const T* b,
                   double eps) {
  const Rows r = rows_of(x);
  const T* xp = x.ptr<T>();
  T* mp = mean.ptr<T>();
  T* rp = rstd.ptr<T>();
  const double count = static_cast<double>(r.n * r.s);
  parallel_for(0, r.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, 2 * r.n * r.s)),
               [&](int64_t b0, int64_t e0) {
                 for (int64_t c = b0; c < e0; ++c) {
                   const double mu = channel_sum(xp, r, c) / count;
                   const double v = channel_sum_of(xp, r, c, [mu](const T* row, int64_t i) {
                     const double d = static_cast<double>(row[i]) - mu;
                     return d * d;
                   });
                   mp[c] = static_cast<T>(mu);
                   rp[c] = static_cast<T>(1.0 / std::sqrt(v / count + eps));
                 }
               });
  T* op = out.ptr<T>();
  parallel_for(0, r.n * r.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, r.s)),
               [&](int64_t b0, int64_t e0) {
                 for (int64_t t = b0; t < e0; ++t) {
                   const int64_t c = t % r.c;
                   const T scale = rp[c] * (w != nullptr ? w[c] : T(1)), mu = mp[c];
                   const T shift = b != nullptr ? b[c] : T(0);
                   const T* row = xp + t * r.s;
                   T* o = op + t * r.s;
                   // (x - mean) * scale + bias, not x * scale + (bias - mean * scale): that cancels when scale is large
                   for (int64_t i = 0; i < r.s; ++i) o[i] = (row[i] - mu) * scale + shift;
                 }
               });
}

template <class T>
void backward_typed(const View* dx, const View* dweight, const View* dbias, const View& g, const View& x, const T* mean,
                    const T* rstd, const T* w, DType d) {
  const Rows r = rows_of(x);
  const T* gp = g.ptr<T>();
  const T* xp = x.ptr<T>();
  const int64_t shape1[1] = {r.c};
  Temp sg = make_temp(DType::Float64, shape1, 1), sgx = make_temp(DType::Float64, shape1, 1);
  double* sgp = sg.view.ptr<double>();
  double* sgxp = sgx.view.ptr<double>();
  parallel_for(0, r.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, 2 * r.n * r.s)),
               [&](int64_t b0, int64_t e0) {
                 for (int64_t c = b0; c < e0; ++c) {
                   double a1[kChains] = {0, 0, 0, 0, 0, 0, 0, 0}, a2[kChains] = {0, 0, 0, 0, 0, 0, 0, 0};
                   const double mu = mean[c];
                   for (int64_t n = 0; n < r.n; ++n) {
                     const T* gr = gp + (n * r.c + c) * r.s;
                     const T* xr = xp + (n * r.c + c) * r.s;
                     int64_t i = 0;
                     for (; i + kChains <= r.s; i += kChains) {
                       for (int64_t k = 0; k < kChains; ++k) {
                         const double gv = static_cast<double>(gr[i + k]);
                         a1[k] += gv;
                         a2[k] += gv * (static_cast<double>(xr[i + k]) - mu);
                       }
                     }
                     for (; i < r.s; ++i) {
                       const double gv = static_cast<double>(gr[i]);
                       a1[i % kChains] += gv;
                       a2[i % kChains] += gv * (static_cast<double>(xr[i]) - mu);
                     }
                   }
                   sgp[c] = fold(a1);
                   sgxp[c] = fold(a2) * static_cast<double>(rstd[c]);  // sum(grad * xhat)
                 }
               });
  if (dbias != nullptr) copy(*dbias, sg.view);
  if (dweight != nullptr) copy(*dweight, sgx.view);
  if (dx == nullptr) return;
  Temp keep;
  const View out = target(*dx, d, &keep);
  T* op = out.ptr<T>();
  const double count = static_cast<double>(r.n * r.s);
  parallel_for(0, r.n * r.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, r.s)),
               [&](int64_t b0, int64_t e0) {
                 for (int64_t t = b0; t < e0; ++t) {
                   const int64_t c = t % r.c;
                   const T rs = rstd[c], k = rs * (w != nullptr ? w[c] : T(1));
                   const T m1 = static_cast<T>(sgp[c] / count), m2 = static_cast<T>(sgxp[c] / count);
                   const T mu = mean[c];
                   const T* gr = gp + t * r.s;
                   const T* xr = xp + t * r.s;
                   T* o = op + t * r.s;
                   for (int64_t i = 0; i < r.s; ++i) o[i] = k * (gr[i] - m1 - (xr[i] - mu) * rs * m2);
                 }
               });
  finish(*dx, out);
}

template <class T>
void eval_typed(const View& out, const View& x, const T* mean, const T* var, const T* w, const T* b, double eps) {
  const Rows r = rows_of(x);
  const T* xp = x.ptr<T>();
  T* op = out.ptr<T>();
  parallel_for(
      0, r.n * r.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, r.s)), [&](int64_t b0, int64_t e0) {
        for (int64_t t = b0; t < e0; ++t) {
          const int64_t c = t % r.c;
          const T scale =
              static_cast<T>(1.0 / std::sqrt(static_cast<double>(var[c]) + eps)) * (w != nullptr ? w[c] : T(1));
          const T mu = mean[c], shift = b != nullptr ? b[c] : T(0);
          const T* row = xp + t * r.s;
          T* o = op + t * r.s;
          for (int64_t i = 0; i < r.s; ++i) o[i] = (row[i] - mu) * scale + shift;
        }
      });
}

void check_channels(const char* op, const View* v, int64_t c, const char* name) {
  KAEL_CHECK(v == nullptr || (v->ndim == 1 && v->shape[0] == c), Shape, op, ": ", name, " must be [", c, "]");
}

}  // namespace

void batch_norm(const View& out, const View& mean, const View& rstd, const View& x, const View* weight,
                const View* bias, double eps) {
  KAEL_CHECK(x.ndim >= 2 && is_floating(x.dtype) && out.dtype == x.dtype, DType,
             "batch_norm: x must be a float tensor [N, C, ...] and out of its dtype, got ", dtype_name(x.dtype), " ",
             x.ndim, "-d");
  KAEL_CHECK(out.ndim == x.ndim, Shape, "batch_norm: out must have x's shape");
  for (int i = 0; i < x.ndim; ++i) KAEL_CHECK(out.shape[i] == x.shape[i], Shape, "batch_norm: out must have x's shape");
  const int64_t c = x.shape[1];
  check_channels("batch_norm", &mean, c, "mean");
  check_channels("batch_norm", &rstd, c, "rstd");
  check_channels("batch_norm", weight, c, "weight");
  check_channels("batch_norm", bias, c, "bias");
  const DType d = work_dtype(x.dtype);
  KAEL_CHECK(mean.dtype == d && rstd.dtype == d, DType, "batch_norm: mean and rstd must be ", dtype_name(d));
  if (c == 0) return;
  KAEL_CHECK(x.numel() > 0, Shape, "batch_norm: no values per channel in x");
  Temp xk, wk, bk, ok, mk, rk;
  const View xv = dense(x, d, &xk);
  const View mv = target(mean, d, &mk), rv = target(rstd, d, &rk), ov = target(out, d, &ok);
  if (d == DType::Float64) {
    forward_typed<double>(ov, mv, rv, xv, weight ? dense(*weight, d, &wk).ptr<double>() : nullptr,
                          bias ? dense(*bias, d, &bk).ptr<double>() : nullptr, eps);
  } else {
    forward_typed<float>(ov, mv, rv, xv, weight ? dense(*weight, d, &wk).ptr<float>() : nullptr,
                         bias ? dense(*bias, d, &bk).ptr<float>() : nullptr, eps);
  }
  finish(mean, mv);
  finish(rstd, rv);
  finish(out, ov);
}

void batch_norm_backward(const View* dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                         const View& mean, const View& rstd, const View* weight) {
  KAEL_CHECK(x.ndim >= 2 && is_floating(x.dtype) && grad.dtype == x.dtype, DType,
             "batch_norm_backward: x and grad must share a float dtype, [N, C, ...]");
  KAEL_CHECK(grad.ndim == x.ndim, Shape, "batch_norm_backward: grad must have x's shape");
  for (int i = 0; i < x.ndim; ++i) {
    KAEL_CHECK(grad.shape[i] == x.shape[i] && (dx == nullptr || dx->shape[i] == x.shape[i]), Shape,
               "batch_norm_backward: grad and dx must have x's shape");
  }
  const int64_t c = x.shape[1];
  check_channels("batch_norm_backward", &mean, c, "mean");
  check_channels("batch_norm_backward", &rstd, c, "rstd");
  check_channels("batch_norm_backward", weight, c, "weight");
  check_channels("batch_norm_backward", dweight, c, "dweight");
  check_channels("batch_norm_backward", dbias, c, "dbias");
  if (c == 0 || x.numel() == 0) return;
  const DType d = work_dtype(x.dtype);
  Temp xk, gk, mk, rk, wk;
  const View xv = dense(x, d, &xk), gv = dense(grad, d, &gk), mv = dense(mean, d, &mk), rv = dense(rstd, d, &rk);
  if (d == DType::Float64) {
    backward_typed<double>(dx, dweight, dbias, gv, xv, mv.ptr<double>(), rv.ptr<double>(),
                           weight ? dense(*weight, d, &wk).ptr<double>() : nullptr, d);
  } else {
    backward_typed<float>(dx, dweight, dbias, gv, xv, mv.ptr<float>(), rv.ptr<float>(),
                          weight ? dense(*weight, d, &wk).ptr<float>() : nullptr, d);
  }
}

void batch_norm_eval(const View& out, const View& x, const View& mean, const View& var, const View* weight,
                     const View* bias, double eps) {
  KAEL_CHECK(x.ndim >= 2 && is_floating(x.dtype) && out.dtype == x.dtype && out.ndim == x.ndim, DType,
             "batch_norm_eval: x must be a float tensor [N, C, ...] and out of its dtype and shape");
  for (int i = 0; i < x.ndim; ++i) {
    KAEL_CHECK(out.shape[i] == x.shape[i], Shape, "batch_norm_eval: out must have x's shape");
  }
  const int64_t c = x.shape[1];
  check_channels("batch_norm_eval", &mean, c, "mean");
  check_channels("batch_norm_eval", &var, c, "var");
  check_channels("batch_norm_eval", weight, c, "weight");
  check_channels("batch_norm_eval", bias, c, "bias");
  KAEL_CHECK(is_floating(mean.dtype) && is_floating(var.dtype), DType, "batch_norm_eval: mean and var must be float");
  if (x.numel() == 0) return;
  const DType d = work_dtype(x.dtype);
  Temp xk, mk, vk, wk, bk, ok;
  const View xv = dense(x, d, &xk), mv = dense(mean, d, &mk), vv = dense(var, d, &vk), ov = target(out, d, &ok);
  if (d == DType::Float64) {
    eval_typed<double>(ov, xv, mv.ptr<double>(), vv.ptr<double>(),
                       weight ? dense(*weight, d, &wk).ptr<double>() : nullptr,
                       bias ? dense(*bias, d, &bk).ptr<double>() : nullptr, eps);
  } else {
    eval_typed<float>(ov, xv, mv.ptr<float>(), vv.ptr<float>(), weight ? dense(*weight, d, &wk).ptr<float>() : nullptr,
                      bias ? dense(*bias, d, &bk).ptr<float>() : nullptr, eps);
  }
  finish(out, ov);
}

}  // namespace kael
