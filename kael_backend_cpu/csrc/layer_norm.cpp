// layer_norm and layer_norm_backward over the last dim: one pass per row for the statistics
// (mean, then the variance about it), float32 rows through the vector table, float64 rows in
// float64 and float16 rows the way NumPy computes them in float16 (the reference backend).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "buffer.h"
#include "iter.h"
#include "kernels.h"
#include "lines.h"
#include "nn_checks.h"
#include "rows.h"
#include "vec.h"

namespace kael {
namespace {

// Store a statistic (mean or rstd) into a float32 or float64 view.
inline void store_stat(const View& v, int64_t off, double value) {
  if (v.dtype == DType::Float64) {
    v.ptr<double>()[off] = value;
  } else {
    v.ptr<float>()[off] = static_cast<float>(value);
  }
}
inline double load_stat(const View& v, int64_t off) {
  return v.dtype == DType::Float64 ? v.ptr<double>()[off] : static_cast<double>(v.ptr<float>()[off]);
}

// An optional 1-d parameter as a contiguous array of C (empty when absent).
template <class C>
std::vector<C> param_vector(const View* p, int64_t n) {
  std::vector<C> v;
  if (p == nullptr) return v;
  Temp t = to_contiguous(*p, std::is_same_v<C, double> ? DType::Float64 : DType::Float32);
  const C* src = t.view.ptr<C>();
  v.assign(src, src + n);
  return v;
}

inline float round_half(float v) {
  return static_cast<float>(Half(v));
}

// float16 rows the way NumPy computes them in float16 (the reference backend): every
// intermediate rounded to float16, sums accumulated in float32. The statistics are
// outputs in float32, so this rounding is part of the result.
void layer_norm_half_row(float* y, const float* x, const float* w, const float* b, int64_t n, double eps, double* mean,
                         double* rstd) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  const float mu = round_half(static_cast<float>(s) / static_cast<float>(n));
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float d = round_half(x[i] - mu);
    ss += round_half(d * d);
  }
  const float var = round_half(static_cast<float>(ss) / static_cast<float>(n));
  const float r = round_half(1.0f / round_half(std::sqrt(round_half(var + static_cast<float>(eps)))));
  for (int64_t i = 0; i < n; ++i) {
    float v = round_half(round_half(x[i] - mu) * r);
    if (w) v = round_half(v * w[i]);
    if (b) v = round_half(v + b[i]);
    y[i] = v;
  }
  *mean = mu;
  *rstd = r;
}

template <class T>
void layer_norm_typed(const View& out, const View& mean, const View& rstd, const View& x, const View* weight,
                      const View* bias, double eps) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int dim = x.ndim - 1;
  const int64_t n = x.shape[dim];
  const Lines lx = lines_of(x, dim), lo = lines_of(out, dim);
  const int64_t sx = x.strides[dim], so = out.strides[dim];
  const std::vector<C> w = param_vector<C>(weight, n), b = param_vector<C>(bias, n);
  const C* wp = w.empty() ? nullptr : w.data();
  const C* bp = b.empty() ? nullptr : b.data();
  const bool direct = std::is_same_v<T, C> && sx == 1 && so == 1;
  parallel_for(0, lx.count, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)), [&](int64_t b0, int64_t e0) {
    std::vector<C> xin, yout;
    if (!direct) {
      xin.resize(static_cast<size_t>(n));
      yout.resize(static_cast<size_t>(n));
    }
    for (int64_t line = b0; line < e0; ++line) {
      const T* xp = x.ptr<T>() + lx.offset(line);
      T* op = out.ptr<T>() + lo.offset(line);
      const C* xr = reinterpret_cast<const C*>(xp);
      C* yr = reinterpret_cast<C*>(op);
      if (!direct) {
        for (int64_t i = 0; i < n; ++i) xin[static_cast<size_t>(i)] = convert<C>(xp[i * sx]);
        xr = xin.data();
        yr = yout.data();
      }
      double mu = 0, r = 0;
      if constexpr (std::is_same_v<T, Half>) {
        layer_norm_half_row(yr, xr, wp, bp, n, eps, &mu, &r);
      } else if constexpr (std::is_same_v<C, float>) {
        float fm = 0, fr = 0;
        vec().layer_norm_f32(yr, xr, wp, bp, n, static_cast<float>(eps), &fm, &fr);
        mu = fm;
        r = fr;
      } else {
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += xr[i];
        mu = n ? s / static_cast<double>(n) : 0.0;
        double var = 0;
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mu) * (xr[i] - mu);
        var = n ? var / static_cast<double>(n) : 0.0;
        r = 1.0 / std::sqrt(var + eps);
        for (int64_t i = 0; i < n; ++i) {
          double y = (xr[i] - mu) * r;
          if (wp) y *= wp[i];
          if (bp) y += bp[i];
          yr[i] = y;
        }
      }
      if (!direct) {
        for (int64_t i = 0; i < n; ++i) op[i * so] = convert<T>(yout[static_cast<size_t>(i)]);
      }
      store_stat(mean, offset_of(mean, line), mu);
      store_stat(rstd, offset_of(rstd, line), r);
    }
  });
}

template <class T>
void layer_norm_backward_typed(const View& dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                               const View& mean, const View& rstd, const View* weight) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int dim = x.ndim - 1;
  const int64_t n = x.shape[dim];
  const Lines lx = lines_of(x, dim), lg = lines_of(grad, dim), ld = lines_of(dx, dim);
  const int64_t sx = x.strides[dim], sg = grad.strides[dim], sd = dx.strides[dim];
  const std::vector<C> w = param_vector<C>(weight, n);
  const int64_t rows = lx.count;
  const int64_t chunks =
      std::max<int64_t>(1, parallel_chunks(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n))));
  const bool need_dw = dweight != nullptr, need_db = dbias != nullptr;
  std::vector<double> part_w(need_dw ? static_cast<size_t>(chunks * n) : 0, 0.0);
  std::vector<double> part_b(need_db ? static_cast<size_t>(chunks * n) : 0, 0.0);
  parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<C> xh(static_cast<size_t>(n)), gw(static_cast<size_t>(n)), gr(static_cast<size_t>(n));
    for (int64_t c = c0; c < c1; ++c) {
      double* pw = need_dw ? part_w.data() + c * n : nullptr;
      double* pb = need_db ? part_b.data() + c * n : nullptr;
      for (int64_t line = rows * c / chunks; line < rows * (c + 1) / chunks; ++line) {
        const T* xp = x.ptr<T>() + lx.offset(line);
        const T* gp = grad.ptr<T>() + lg.offset(line);
        T* dp = dx.ptr<T>() + ld.offset(line);
        const auto mu = static_cast<C>(load_stat(mean, offset_of(mean, line)));
        const auto r = static_cast<C>(load_stat(rstd, offset_of(rstd, line)));
        double sum_gw = 0, sum_gwx = 0;
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          const C g = convert<C>(gp[i * sg]);
          const C xhat = (convert<C>(xp[i * sx]) - mu) * r;
          const C gwi = w.empty() ? g : g * w[k];
          xh[k] = xhat;
          gw[k] = gwi;
          gr[k] = g;
          sum_gw += gwi;
          sum_gwx += static_cast<double>(gwi) * xhat;
        }
        const auto a = static_cast<C>(sum_gw / static_cast<double>(n));
        const auto bterm = static_cast<C>(sum_gwx / static_cast<double>(n));
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          dp[i * sd] = convert<T>(r * (gw[k] - a - xh[k] * bterm));
          if (pw) pw[i] += static_cast<double>(gr[k]) * xh[k];
          if (pb) pb[i] += gr[k];
        }
      }
    }
  });
  auto finish = [&](const View* target, const std::vector<double>& parts) {
    if (target == nullptr) return;
    std::vector<double> total(static_cast<size_t>(n), 0.0);
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t i = 0; i < n; ++i) total[static_cast<size_t>(i)] += parts[static_cast<size_t>(c * n + i)];
    }
    Temp t = make_temp(DType::Float64, &n, 1);
    std::copy(total.begin(), total.end(), t.view.ptr<double>());
    copy(*target, t.view);
  };
  finish(dweight, part_w);
  finish(dbias, part_b);
}

}  // namespace

void layer_norm(const View& out, const View& mean, const View& rstd, const View& x, const View* weight,
                const View* bias, double eps) {
  check_same(out, x, "layer_norm");
  check_float(x, "layer_norm");
  KAEL_CHECK(x.ndim >= 1, Shape, "layer_norm: expected at least one dimension");
  const int64_t n = x.shape[x.ndim - 1];
  int64_t rows = 1;  // not x.numel() / n: with n == 0 there are still rows (of nothing)
  for (int d = 0; d + 1 < x.ndim; ++d) rows *= x.shape[d];
  KAEL_CHECK(mean.numel() == rows && rstd.numel() == rows, Shape,
             "layer_norm: mean and rstd must have the input's shape without the last dim");
  KAEL_CHECK((mean.dtype == DType::Float32 || mean.dtype == DType::Float64) && rstd.dtype == mean.dtype, DType,
             "layer_norm: mean and rstd must be float32 or float64");
  for (const View* p : {weight, bias}) {
    KAEL_CHECK(p == nullptr || (p->ndim == 1 && p->shape[0] == n), Shape, "layer_norm: weight/bias must be [", n, "]");
  }
  if (x.numel() == 0) {
    // Rows of no elements: mean and variance are 0/0 (NaN), as in NumPy and the reference.
    Scalar nan;
    nan.kind = Scalar::Float;
    nan.f = std::numeric_limits<double>::quiet_NaN();
    fill(mean, nan);
    fill(rstd, nan);
    return;
  }
  KAEL_DISPATCH_FLOATS(x.dtype, "layer_norm", (layer_norm_typed<T>(out, mean, rstd, x, weight, bias, eps)));
}

void layer_norm_backward(const View& dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                         const View& mean, const View& rstd, const View* weight) {
  check_same(dx, x, "layer_norm_backward");
  check_same(grad, x, "layer_norm_backward");
  check_float(x, "layer_norm_backward");
  const int64_t n = x.shape[x.ndim - 1];
  for (const View* p : {dweight, dbias, weight}) {
    KAEL_CHECK(p == nullptr || (p->ndim == 1 && p->shape[0] == n), Shape, "layer_norm_backward: weight-shaped ",
               "tensors must be [", n, "]");
  }
  if (grad.dtype != x.dtype) {
    Temp g = to_contiguous(grad, x.dtype);
    layer_norm_backward(dx, dweight, dbias, g.view, x, mean, rstd, weight);
    return;
  }
  if (x.numel() == 0) {
    Scalar zero;
    if (dweight) fill(*dweight, zero);
    if (dbias) fill(*dbias, zero);
    return;
  }
  KAEL_DISPATCH_FLOATS(x.dtype, "layer_norm_backward",
                       (layer_norm_backward_typed<T>(dx, dweight, dbias, grad, x, mean, rstd, weight)));
}

}  // namespace kael
