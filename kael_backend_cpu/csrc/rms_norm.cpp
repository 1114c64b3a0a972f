// rms_norm: Hugging Face's LlamaRMSNorm over the last dim. Computed in float32 (float64
// for float64 x): rstd = 1 / sqrt(mean(x^2) + eps), out = (x * rstd rounded to x.dtype)
// * weight, one rounding to out's dtype after the product. For float32 x the squares are
// rounded to float32 and summed in double, the mean rounded to float32 (ggml's CPU rms_norm:
// llama.cpp's normalised values, bit for bit nearly always, which its 8-bit activation
// rounding then sees the same; vec_llama.h: sumsq_f32).
//
// Rows run in parallel over the thread pool. A contiguous float32 row (the decode case)
// goes straight through the vector table; every other row (strided, 16-bit floats) is
// converted in fixed-size chunks on the stack, so no call allocates unless its weight
// needs converting.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "buffer.h"
#include "kernels.h"
#include "lines.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kChunk = 256;  // elements converted at a time on the stack

inline void store_rstd(const View& v, int64_t off, double value) {
  if (v.dtype == DType::Float64) {
    v.ptr<double>()[off] = value;
  } else {
    v.ptr<float>()[off] = static_cast<float>(value);
  }
}

// Sum of squares of one row of n elements (stride sx) in C.
template <class T, class C>
double row_sumsq(const T* xp, int64_t sx, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    if (sx == 1) return vec().sumsq_f32(xp, n);
  }
  if constexpr (std::is_same_v<C, double>) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = convert<double>(xp[i * sx]);
      s += v * v;
    }
    return s;
  } else {
    float buf[kChunk];
    double s = 0;
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      for (int64_t j = 0; j < m; ++j) buf[j] = convert<float>(xp[(i0 + j) * sx]);
      s += vec().sumsq_f32(buf, m);
    }
    return s;
  }
}

// out row = (x * r rounded to T) * w, rounded to O; w (stride sw) may be null.
template <class T, class O, class C, class W>
void row_scale(O* op, int64_t so, const T* xp, int64_t sx, C r, const W* wp, int64_t sw, int64_t n) {
  if constexpr (std::is_same_v<C, double>) {
    for (int64_t i = 0; i < n; ++i) {
      double y = convert<double>(convert<T>(convert<double>(xp[i * sx]) * r));
      if (wp != nullptr) y *= convert<double>(wp[i * sw]);
      op[i * so] = convert<O>(y);
    }
  } else {
    constexpr bool f32 = std::is_same_v<T, float> && std::is_same_v<W, float>;
    if constexpr (f32 && std::is_same_v<O, float>) {
      if (sx == 1 && so == 1 && (wp == nullptr || sw == 1)) {
        vec().scale_mul_f32(op, xp, r, wp, n);
        return;
      }
    }
    float buf[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      for (int64_t j = 0; j < m; ++j) buf[j] = convert<float>(xp[(i0 + j) * sx]);
      if constexpr (f32) {
        if (wp == nullptr || sw == 1) {
          vec().scale_mul_f32(buf, buf, r, wp != nullptr ? wp + i0 : nullptr, m);
          for (int64_t j = 0; j < m; ++j) op[(i0 + j) * so] = convert<O>(buf[j]);
          continue;
        }
      }
      vec().scale_mul_f32(buf, buf, r, nullptr, m);
      for (int64_t j = 0; j < m; ++j) {
        float y = convert<float>(convert<T>(buf[j]));  // rounded to x's dtype before the weight
        if (wp != nullptr) y *= convert<float>(wp[(i0 + j) * sw]);
        op[(i0 + j) * so] = convert<O>(y);
      }
    }
  }
}

template <class T, class O, class W>
void rms_norm_rows(const View& out, const View& rstd, const View& x, const W* wp, int64_t sw, double eps) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int dim = x.ndim - 1;
  const int64_t n = x.shape[dim];
  const Lines lx = lines_of(x, dim), lo = lines_of(out, dim);
  const int64_t sx = x.strides[dim], so = out.strides[dim];
  const auto ceps = static_cast<C>(eps);
  parallel_for(0, lx.count, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    for (int64_t line = b; line < e; ++line) {
      const T* xp = x.ptr<T>() + lx.offset(line);
      O* op = out.ptr<O>() + lo.offset(line);
      const double ss = row_sumsq<T, C>(xp, sx, n);
      // mean(x^2) rounded to C, then 1 / sqrt(mean + eps) in C (torch.rsqrt's formula)
      const auto mean = static_cast<C>(ss / static_cast<double>(n));
      const C r = C(1) / std::sqrt(mean + ceps);
      row_scale<T, O, C, W>(op, so, xp, sx, r, wp, sw, n);
      store_rstd(rstd, offset_of(rstd, line), static_cast<double>(r));
    }
  });
}

// The weight is read in place when it has C's or x's dtype (a decode step allocates
// nothing), else converted to C once.
template <class T, class O>
void rms_norm_typed(const View& out, const View& rstd, const View& x, const View* weight, double eps) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (weight == nullptr) {
    rms_norm_rows<T, O, C>(out, rstd, x, nullptr, 0, eps);
  } else if (weight->dtype == dtype_of<C>()) {
    rms_norm_rows<T, O, C>(out, rstd, x, weight->ptr<C>(), weight->strides[0], eps);
  } else if (weight->dtype == dtype_of<T>()) {
    rms_norm_rows<T, O, T>(out, rstd, x, weight->ptr<T>(), weight->strides[0], eps);
  } else {
    Temp wt = to_contiguous(*weight, dtype_of<C>());
    rms_norm_rows<T, O, C>(out, rstd, x, wt.view.ptr<C>(), 1, eps);
  }
}

}  // namespace

void rms_norm(const View& out, const View& rstd, const View& x, const View* weight, double eps) {
  KAEL_CHECK(is_floating(x.dtype), DType, "rms_norm: expected a floating-point x, got ", dtype_name(x.dtype));
  KAEL_CHECK(x.ndim >= 1, Shape, "rms_norm: x must have at least one dimension, got a 0-d tensor");
  bool same = out.ndim == x.ndim;
  for (int d = 0; same && d < x.ndim; ++d) same = out.shape[d] == x.shape[d];
  KAEL_CHECK(same, Shape, "rms_norm: out must have x's shape");
  KAEL_CHECK(is_floating(out.dtype), DType, "rms_norm: expected a floating-point out, got ", dtype_name(out.dtype));
  const int64_t n = x.shape[x.ndim - 1];
  int64_t rows = 1;  // not numel / n: with n == 0 there are still rows (of nothing)
  for (int d = 0; d + 1 < x.ndim; ++d) rows *= x.shape[d];
  KAEL_CHECK(rstd.numel() == rows, Shape, "rms_norm: rstd must have x's shape without the last dim (", rows,
             " elements), got ", rstd.numel(), " elements");
  KAEL_CHECK(rstd.dtype == DType::Float32 || rstd.dtype == DType::Float64, DType,
             "rms_norm: rstd must be float32 or float64, got ", dtype_name(rstd.dtype));
  if (weight != nullptr) {
    KAEL_CHECK(weight->ndim == 1 && weight->shape[0] == n, Shape, "rms_norm: weight must be [", n, "], got ",
               weight->ndim, " dims", weight->ndim == 1 ? detail::cat(" of size ", weight->shape[0]) : "");
    KAEL_CHECK(is_floating(weight->dtype), DType, "rms_norm: expected a floating-point weight, got ",
               dtype_name(weight->dtype));
  }
  if (rows == 0) return;
  if (n == 0) {  // mean of no elements is 0/0
    Scalar nan;
    nan.kind = Scalar::Float;
    nan.f = std::numeric_limits<double>::quiet_NaN();
    fill(rstd, nan);
    return;
  }
  if (out.dtype == x.dtype) {
    KAEL_DISPATCH_FLOATS(x.dtype, "rms_norm", (rms_norm_typed<T, T>(out, rstd, x, weight, eps)));
    return;
  }
  // A wider output (a float32 weight with a 16-bit x): the product in the compute type
  const DType ct = x.dtype == DType::Float64 ? DType::Float64 : DType::Float32;
  Temp o = make_temp(ct, x.shape, x.ndim);
  if (ct == DType::Float64) {
    rms_norm_typed<double, double>(o.view, rstd, x, weight, eps);
  } else {
    KAEL_DISPATCH_FLOATS(x.dtype, "rms_norm",
                         (rms_norm_typed<T, std::conditional_t<std::is_same_v<T, double>, double, float>>(
                             o.view, rstd, x, weight, eps)));
  }
  copy(out, o.view);
}

}  // namespace kael
