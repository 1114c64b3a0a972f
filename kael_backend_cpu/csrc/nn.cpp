// Fused neural-network kernels: gelu (+ backward), softmax, log_softmax, cross_entropy and
// adamw_step (layer_norm and its backward: layer_norm.cpp). Rows are processed in one pass each
// (softmax: max, exp-and-sum, scale), float32 through the vector table; other
// dtypes compute in float64 (float64 input) or float32 (16-bit floats).
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

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluC = 0.044715;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <class C>
inline C gelu_value(C x, bool tanh_approx) {
  if (tanh_approx) {
    const C u = C(kSqrt2OverPi) * (x + C(kGeluC) * x * x * x);
    return x / (C(1) + std::exp(C(-2) * u));
  }
  const auto e = static_cast<C>(std::erf(static_cast<double>(x) * kInvSqrt2));
  return C(0.5) * x * (C(1) + e);
}

inline double gelu_grad(double x, bool tanh_approx) {
  if (tanh_approx) {
    const double u = kSqrt2OverPi * (x + kGeluC * x * x * x);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
    return s + 2.0 * x * s * (1.0 - s) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * x * x);
  }
  const double cdf = 0.5 * (1.0 + std::erf(x * kInvSqrt2));
  return cdf + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
}

template <class T>
void gelu_typed(const View& out, const View& x, bool tanh_approx) {
  using C = compute_t<T>;
  const View* ops[2] = {&out, &x};
  for_each(ops, kGrainCostly, [tanh_approx](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      if (tanh_approx && s[0] == 4 && s[1] == 4) {
        vec().gelu_tanh_f32(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]), n);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const C v = convert<C>(*reinterpret_cast<const T*>(p[1] + i * s[1]));
      *reinterpret_cast<T*>(p[0] + i * s[0]) = convert<T>(gelu_value<C>(v, tanh_approx));
    }
  });
}

template <class T>
void gelu_backward_typed(const View& gi, const View& go, const View& x, bool tanh_approx) {
  const View* ops[3] = {&gi, &go, &x};
  for_each(ops, kGrainCostly, [tanh_approx](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      if (tanh_approx && s[0] == 4 && s[1] == 4 && s[2] == 4) {
        vec().gelu_tanh_bwd_f32(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]),
                                reinterpret_cast<const float*>(p[2]), n);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const auto g = convert<double>(*reinterpret_cast<const T*>(p[1] + i * s[1]));
      const auto v = convert<double>(*reinterpret_cast<const T*>(p[2] + i * s[2]));
      *reinterpret_cast<T*>(p[0] + i * s[0]) = convert<T>(g * gelu_grad(v, tanh_approx));
    }
  });
}

template <class T>
void softmax_typed(const View& out, const View& x, int dim, bool log) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t n = x.shape[dim];
  const Lines lx = lines_of(x, dim), lo = lines_of(out, dim);
  const int64_t sx = x.strides[dim], so = out.strides[dim];
  const bool direct = std::is_same_v<T, C> && sx == 1 && so == 1;
  parallel_for(0, lx.count, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n)), [&](int64_t b, int64_t e) {
    std::vector<C> xin, yout;
    if (!direct) {
      xin.resize(static_cast<size_t>(n));
      yout.resize(static_cast<size_t>(n));
    }
    for (int64_t line = b; line < e; ++line) {
      const T* xp = x.ptr<T>() + lx.offset(line);
      T* op = out.ptr<T>() + lo.offset(line);
      const C* xr = reinterpret_cast<const C*>(xp);
      C* yr = reinterpret_cast<C*>(op);
      if (!direct) {
        for (int64_t i = 0; i < n; ++i) xin[static_cast<size_t>(i)] = convert<C>(xp[i * sx]);
        xr = xin.data();
        yr = yout.data();
      }
      if constexpr (std::is_same_v<C, float>) {
        (log ? vec().log_softmax_f32 : vec().softmax_f32)(yr, xr, n);
      } else {
        softmax_row_f64(yr, xr, n, log);
      }
      if (!direct) {
        for (int64_t i = 0; i < n; ++i) op[i * so] = convert<T>(yout[static_cast<size_t>(i)]);
      }
    }
  });
}

template <class T>
void cross_entropy_typed(const View& losses, const View& logits, const View& target, int64_t ignore_index,
                         double smoothing) {
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  const int64_t sr = logits.strides[0], sc = logits.strides[1];
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, classes)), [&](int64_t b, int64_t e) {
    std::vector<float> fbuf;
    std::vector<double> dbuf;
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = target.ptr<int64_t>()[r * target.strides[0]];
      double loss = 0;
      if (t != ignore_index) {
        KAEL_CHECK(t >= 0 && t < classes, Index, "cross_entropy: target ", t, " is out of range for ", classes,
                   " classes");
        const T* row = logits.ptr<T>() + r * sr;
        double m = 0, s = 0, sum = 0, xt = 0;
        if constexpr (std::is_same_v<T, double>) {
          dbuf.resize(static_cast<size_t>(classes));
          for (int64_t i = 0; i < classes; ++i) dbuf[static_cast<size_t>(i)] = row[i * sc];
          m = -std::numeric_limits<double>::infinity();
          for (double v : dbuf) m = v > m ? v : m;
          for (double v : dbuf) {
            s += std::exp(v - m);
            sum += v;
          }
          xt = dbuf[static_cast<size_t>(t)];
        } else {
          const float* fr = nullptr;
          if (std::is_same_v<T, float> && sc == 1) {
            fr = reinterpret_cast<const float*>(row);
          } else {
            fbuf.resize(static_cast<size_t>(classes));
            for (int64_t i = 0; i < classes; ++i) fbuf[static_cast<size_t>(i)] = convert<float>(row[i * sc]);
            fr = fbuf.data();
          }
          const float fm = vec().max_f32(fr, classes);
          m = fm;
          s = vec().sum_exp_f32(fr, fm, classes);
          if (smoothing != 0.0) sum = vec().sum_f32(fr, classes);
          xt = fr[t];
        }
        const double lse = m + std::log(s);
        loss = lse - xt;
        if (smoothing != 0.0) {
          const double mean_logp = sum / static_cast<double>(classes) - lse;
          loss = (1.0 - smoothing) * loss - smoothing * mean_logp;
        }
      }
      losses.ptr<T>()[r * losses.strides[0]] = convert<T>(loss);
    }
  });
}

template <class T>
void adamw_typed(const View& param, const View& grad, const View& m1, const View& m2, double lr, double beta1,
                 double beta2, double eps, double weight_decay, int64_t step) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const auto b1 = static_cast<C>(beta1), b2 = static_cast<C>(beta2);
  const auto c1 = static_cast<C>(1.0 - beta1), c2 = static_cast<C>(1.0 - beta2);
  const auto decay = static_cast<C>(1.0 - lr * weight_decay);
  const auto inv_bc1 = static_cast<C>(1.0 / (1.0 - std::pow(beta1, static_cast<double>(step))));
  const auto inv_bc2 = static_cast<C>(1.0 / (1.0 - std::pow(beta2, static_cast<double>(step))));
  const auto lrc = static_cast<C>(lr), epsc = static_cast<C>(eps);
  const View* ops[4] = {&param, &grad, &m1, &m2};
  for_each(ops, kGrainCheap, [=](char* const* p, const int64_t* s, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      T* pp = reinterpret_cast<T*>(p[0] + i * s[0]);
      T* mp = reinterpret_cast<T*>(p[2] + i * s[2]);
      T* vp = reinterpret_cast<T*>(p[3] + i * s[3]);
      const C g = convert<C>(*reinterpret_cast<const T*>(p[1] + i * s[1]));
      const T mt = convert<T>(b1 * convert<C>(*mp) + c1 * g);
      const T vt = convert<T>(b2 * convert<C>(*vp) + c2 * g * g);
      *mp = mt;
      *vp = vt;
      const C upd = lrc * (convert<C>(mt) * inv_bc1) / (std::sqrt(convert<C>(vt) * inv_bc2) + epsc);
      *pp = convert<T>(convert<C>(*pp) * decay - upd);
    }
  });
}

}  // namespace

void gelu(const View& out, const View& x, bool tanh_approx) {
  check_same(out, x, "gelu");
  check_float(x, "gelu");
  KAEL_CHECK(out.dtype == x.dtype, DType, "gelu: output dtype must equal the input's");
  KAEL_DISPATCH_FLOATS(x.dtype, "gelu", (gelu_typed<T>(out, x, tanh_approx)));
}

void gelu_backward(const View& grad_in, const View& grad_out, const View& x, bool tanh_approx) {
  check_same(grad_in, x, "gelu_backward");
  check_same(grad_out, x, "gelu_backward");
  check_float(x, "gelu_backward");
  if (grad_out.dtype != x.dtype || grad_in.dtype != x.dtype) {
    Temp g = to_contiguous(grad_out, x.dtype);
    Temp o = make_temp(x.dtype, x.shape, x.ndim);
    gelu_backward(o.view, g.view, x, tanh_approx);
    copy(grad_in, o.view);
    return;
  }
  KAEL_DISPATCH_FLOATS(x.dtype, "gelu_backward", (gelu_backward_typed<T>(grad_in, grad_out, x, tanh_approx)));
}

void softmax(const View& out, const View& x, int dim) {
  check_same(out, x, "softmax");
  check_float(x, "softmax");
  KAEL_CHECK(out.dtype == x.dtype, DType, "softmax: output dtype must equal the input's");
  if (x.numel() == 0) return;
  if (x.ndim == 0) {
    Scalar one;
    one.i = 1;
    fill(out, one);
    return;
  }
  KAEL_DISPATCH_FLOATS(x.dtype, "softmax", (softmax_typed<T>(out, x, dim, false)));
}

void log_softmax(const View& out, const View& x, int dim) {
  check_same(out, x, "log_softmax");
  check_float(x, "log_softmax");
  KAEL_CHECK(out.dtype == x.dtype, DType, "log_softmax: output dtype must equal the input's");
  if (x.numel() == 0) return;
  if (x.ndim == 0) {
    fill(out, Scalar());
    return;
  }
  KAEL_DISPATCH_FLOATS(x.dtype, "log_softmax", (softmax_typed<T>(out, x, dim, true)));
}

void cross_entropy(const View& losses, const View& logits, const View& target, int64_t ignore_index,
                   double label_smoothing) {
  KAEL_CHECK(logits.ndim == 2 && target.ndim == 1 && losses.ndim == 1 && target.shape[0] == logits.shape[0] &&
                 losses.shape[0] == logits.shape[0],
             Shape, "cross_entropy: expected logits [N, C], target [N], losses [N]");
  check_float(logits, "cross_entropy");
  KAEL_CHECK(losses.dtype == logits.dtype, DType, "cross_entropy: losses must have the logits' dtype");
  if (logits.shape[0] == 0) return;
  Temp tt;
  const View* tv = &target;
  if (target.dtype != DType::Int64) {
    tt = to_contiguous(target, DType::Int64);
    tv = &tt.view;
  }
  KAEL_CHECK(logits.shape[1] > 0, Shape, "cross_entropy: no classes");
  KAEL_DISPATCH_FLOATS(logits.dtype, "cross_entropy",
                       (cross_entropy_typed<T>(losses, logits, *tv, ignore_index, label_smoothing)));
}

void adamw_step(const View& param, const View& grad, const View& exp_avg, const View& exp_avg_sq, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  check_same(param, grad, "adamw_step");
  check_same(param, exp_avg, "adamw_step");
  check_same(param, exp_avg_sq, "adamw_step");
  check_float(param, "adamw_step");
  KAEL_CHECK(step >= 1, Shape, "adamw_step: step must be >= 1, got ", step);
  KAEL_CHECK(exp_avg.dtype == param.dtype && exp_avg_sq.dtype == param.dtype, DType,
             "adamw_step: moments must have the parameter's dtype");
  if (grad.dtype != param.dtype) {
    Temp g = to_contiguous(grad, param.dtype);
    adamw_step(param, g.view, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step);
    return;
  }
  KAEL_DISPATCH_FLOATS(param.dtype, "adamw_step",
                       (adamw_typed<T>(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step)));
}

}  // namespace kael
