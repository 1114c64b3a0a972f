// max_pool2d and max_pool2d_backward: one task per (n, c) plane on the thread pool.
//
// The frontend sizes the output (PyTorch's rules for ceil_mode) and checks the window
// arguments; the kernel walks each window, skipping positions outside the input (the
// -inf padding of PyTorch), and keeps the first maximum, or the first NaN, with its flat
// index in the plane. The backward scatters each gradient to its index; as one task owns a
// plane, overlapping windows add into the same element without races. 16-bit floats are
// compared in float32 (exact) and the gradient accumulated in float32.
#include "pool.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

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

// One window with bounds tests (padding, or a window reaching past the plane): -inf outside.
template <class T>
void window_general(const T* src, int64_t h, int64_t w, int64_t y0, int64_t x0, std::array<int64_t, 2> k,
                    std::array<int64_t, 2> d, T* out, int64_t* idx) {
  T best = -std::numeric_limits<T>::infinity();
  int64_t at = -1;
  bool nan = false;
  for (int64_t i = 0; i < k[0] && !nan; ++i) {
    const int64_t iy = y0 + i * d[0];
    if (iy < 0 || iy >= h) continue;
    for (int64_t j = 0; j < k[1]; ++j) {
      const int64_t jx = x0 + j * d[1];
      if (jx < 0 || jx >= w) continue;
      const T v = src[iy * w + jx];
      if (std::isnan(v)) {
        best = v;
        at = iy * w + jx;
        nan = true;
        break;
      }
      if (v > best || at < 0) {
        best = v;
        at = iy * w + jx;
      }
    }
  }
  *out = best;
  *idx = at;
}

// The windows of output columns [lo, hi) of one output row, all wholly inside the plane (no bounds tests), by
// the same first-maximum / first-NaN rule as window_general. The windows go side by side in lanes of kLanes:
// each kernel offset is one pass over the lanes, whose iterations are independent, so the compiler turns the
// selects into vector blends (one window at a time is a chain of dependent selects, or a mispredicted branch
// per element). Lanes keep 32-bit indices, as wide as float lanes (the caller checks that a plane's indices
// fit); SX > 0 is the column stride as a constant (strides 1 and 2 vectorize), 0 reads it from sx.
template <int64_t SX, class T>
void windows_inside_row(const T* src, int64_t w, int64_t y0, int64_t lo, int64_t hi, std::array<int64_t, 2> k,
                        int64_t sx, int64_t px, std::array<int64_t, 2> d, T* out, int64_t* idx) {
  using I = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  constexpr int64_t kLanes = 64;
  const int64_t step = SX > 0 ? SX : sx;
  T best[kLanes];
  I at[kLanes];
  for (int64_t o0 = lo; o0 < hi; o0 += kLanes) {
    const int64_t nl = std::min(kLanes, hi - o0), first = y0 * w + o0 * step - px;
    for (int64_t l = 0; l < nl; ++l) {
      best[l] = src[first + l * step];
      at[l] = static_cast<I>(first + l * step);
    }
    for (int64_t i = 0; i < k[0]; ++i) {
      for (int64_t j = i == 0 ? 1 : 0; j < k[1]; ++j) {
        const int64_t off = first + i * d[0] * w + j * d[1];
        const T* row = src + off;
        const I ioff = static_cast<I>(off);
        for (int64_t l = 0; l < nl; ++l) {
          const T v = row[l * step];
          const T bl = best[l];
          // v > best, or v NaN while best is not: once best is NaN it stays (the first NaN)
          const bool take = !(v <= bl) & (bl == bl);
          best[l] = take ? v : bl;
          at[l] = take ? static_cast<I>(ioff + static_cast<I>(l * step)) : at[l];
        }
      }
    }
    std::copy(best, best + nl, out + o0);
    std::copy(at, at + nl, idx + o0);
  }
}

template <class T>
void forward_typed(const View& x, T* out, int64_t* idx, int64_t oh, int64_t ow, std::array<int64_t, 2> k,
                   std::array<int64_t, 2> s, std::array<int64_t, 2> p, std::array<int64_t, 2> d) {
  const int64_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3], po = oh * ow;
  const T* base = x.ptr<T>();
  // Output columns [lo, hi) have windows inside the plane's width (x0 >= 0 and x0 + span < w).
  const int64_t span_x = (k[1] - 1) * d[1], span_y = (k[0] - 1) * d[0];
  const int64_t lo = std::min(ow, (p[1] + s[1] - 1) / s[1]);
  const int64_t hi = std::max(lo, std::min(ow, w - span_x + p[1] > 0 ? (w - span_x + p[1] - 1) / s[1] + 1 : 0));
  // windows_inside_row's float lanes keep 32-bit indices: larger planes take window_general throughout
  const bool lanes_fit = sizeof(T) == 8 || h * w <= std::numeric_limits<int32_t>::max();
  parallel_for(0, planes, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, po * k[0] * k[1])),
               [&](int64_t b, int64_t e) {
                 for (int64_t pl = b; pl < e; ++pl) {
                   const T* src = base + pl * h * w;
                   T* o = out + pl * po;
                   int64_t* ix = idx + pl * po;
                   for (int64_t oy = 0; oy < oh; ++oy) {
                     const int64_t y0 = oy * s[0] - p[0];
                     const bool rows_inside = y0 >= 0 && y0 + span_y < h;
                     const bool lanes = rows_inside && lanes_fit;
                     const int64_t q = oy * ow, in_lo = lanes ? lo : ow, in_hi = lanes ? hi : ow;
                     for (int64_t ox = 0; ox < ow; ++ox) {
                       if (ox == in_lo && in_lo < in_hi) {
                         if (s[1] == 1) {
                           windows_inside_row<1>(src, w, y0, in_lo, in_hi, k, 1, p[1], d, o + q, ix + q);
                         } else if (s[1] == 2) {
                           windows_inside_row<2>(src, w, y0, in_lo, in_hi, k, 2, p[1], d, o + q, ix + q);
                         } else {
                           windows_inside_row<0>(src, w, y0, in_lo, in_hi, k, s[1], p[1], d, o + q, ix + q);
                         }
                         ox = in_hi - 1;
                         continue;
                       }
                       window_general(src, h, w, y0, ox * s[1] - p[1], k, d, o + q + ox, ix + q + ox);
                     }
                   }
                 }
               });
}

template <class T>
void backward_typed(T* dx, const T* g, const int64_t* idx, int64_t planes, int64_t hw, int64_t po) {
  parallel_for(0, planes, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, po + hw)), [&](int64_t b, int64_t e) {
    for (int64_t pl = b; pl < e; ++pl) {
      T* dp = dx + pl * hw;
      std::memset(dp, 0, static_cast<size_t>(hw) * sizeof(T));
      const T* gp = g + pl * po;
      const int64_t* ip = idx + pl * po;
      for (int64_t q = 0; q < po; ++q) {
        if (ip[q] >= 0) dp[ip[q]] += gp[q];
      }
    }
  });
}

}  // namespace

void max_pool2d(const View& out, const View& indices, const View& x, std::array<int64_t, 2> kernel,
                std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation) {
  KAEL_CHECK(x.ndim == 4 && out.ndim == 4 && indices.ndim == 4, Shape,
             "max_pool2d: expected 4-d x [N,C,H,W], out and indices [N,C,OH,OW]");
  KAEL_CHECK(is_floating(x.dtype) && out.dtype == x.dtype && indices.dtype == DType::Int64, DType,
             "max_pool2d: x and out must share a float dtype and indices be int64, got ", dtype_name(x.dtype), ", ",
             dtype_name(out.dtype), ", ", dtype_name(indices.dtype));
  KAEL_CHECK(kernel[0] >= 1 && kernel[1] >= 1 && stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 &&
                 dilation[1] >= 1 && padding[0] >= 0 && padding[1] >= 0,
             Shape, "max_pool2d: kernel (", kernel[0], ", ", kernel[1], "), stride (", stride[0], ", ", stride[1],
             ") and dilation (", dilation[0], ", ", dilation[1], ") must be >= 1 and padding (", padding[0], ", ",
             padding[1], ") >= 0");
  for (int i = 0; i < 4; ++i) {
    KAEL_CHECK(indices.shape[i] == out.shape[i] && (i >= 2 || out.shape[i] == x.shape[i]), Shape,
               "max_pool2d: out and indices must be [N, C, OH, OW] for x [", x.shape[0], ", ", x.shape[1], ", ",
               x.shape[2], ", ", x.shape[3], "]");
  }
  if (out.numel() == 0) return;
  const DType wd = work_dtype(x.dtype);
  Temp xk = (x.dtype == wd && x.is_contiguous()) ? Temp{} : to_contiguous(x, wd);
  const View xv = xk.view.data != nullptr ? xk.view : x;
  // Contiguous outputs of the work dtype are written in place, others through scratch copied out.
  const bool out_direct = out.dtype == wd && out.is_contiguous(), idx_direct = indices.is_contiguous();
  Temp ot = out_direct ? Temp{} : make_temp(wd, out.shape, 4);
  Temp it = idx_direct ? Temp{} : make_temp(DType::Int64, out.shape, 4);
  void* op = out_direct ? out.data : ot.view.data;
  auto* ip = (idx_direct ? indices : it.view).ptr<int64_t>();
  if (wd == DType::Float64) {
    forward_typed<double>(xv, static_cast<double*>(op), ip, out.shape[2], out.shape[3], kernel, stride, padding,
                          dilation);
  } else {
    forward_typed<float>(xv, static_cast<float*>(op), ip, out.shape[2], out.shape[3], kernel, stride, padding,
                         dilation);
  }
  if (!out_direct) copy(out, ot.view);
  if (!idx_direct) copy(indices, it.view);
}

void max_pool2d_backward(const View& dx, const View& grad, const View& indices) {
  KAEL_CHECK(dx.ndim == 4 && grad.ndim == 4 && indices.ndim == 4, Shape,
             "max_pool2d_backward: expected 4-d dx [N,C,H,W], grad and indices [N,C,OH,OW]");
  KAEL_CHECK(is_floating(dx.dtype) && grad.dtype == dx.dtype && indices.dtype == DType::Int64, DType,
             "max_pool2d_backward: dx and grad must share a float dtype and indices be int64");
  for (int i = 0; i < 4; ++i) {
    KAEL_CHECK(grad.shape[i] == indices.shape[i] && (i >= 2 || grad.shape[i] == dx.shape[i]), Shape,
               "max_pool2d_backward: grad and indices must be [N, C, OH, OW] for dx's N, C");
  }
  if (dx.numel() == 0) return;
  const DType wd = work_dtype(dx.dtype);
  const int64_t planes = dx.shape[0] * dx.shape[1], hw = dx.shape[2] * dx.shape[3];
  const int64_t po = grad.shape[2] * grad.shape[3];
  // Operands already contiguous of the work dtype are read in place, a contiguous dx of it (not overlapping
  // them) written in place.
  Temp gk = (grad.dtype == wd && grad.is_contiguous()) ? Temp{} : to_contiguous(grad, wd);
  Temp ik = indices.is_contiguous() ? Temp{} : to_contiguous(indices, DType::Int64);
  const View gv = gk.view.data != nullptr ? gk.view : grad;
  const int64_t* ip = (ik.view.data != nullptr ? ik.view : indices).ptr<int64_t>();
  for (int64_t q = 0, n = planes * po; q < n; ++q) {
    KAEL_CHECK(ip[q] < hw, Index, "max_pool2d_backward: index ", ip[q], " is outside a plane of ", hw, " elements");
  }
  const bool dx_direct = dx.dtype == wd && dx.is_contiguous() && !overlaps(dx, grad) && !overlaps(dx, indices);
  Temp dt = dx_direct ? Temp{} : make_temp(wd, dx.shape, 4);
  const View dv = dx_direct ? dx : dt.view;
  if (wd == DType::Float64) {
    backward_typed<double>(dv.ptr<double>(), gv.ptr<double>(), ip, planes, hw, po);
  } else {
    backward_typed<float>(dv.ptr<float>(), gv.ptr<float>(), ip, planes, hw, po);
  }
  if (!dx_direct) copy(dx, dt.view);
}

namespace {

void check_avg(const char* op, const View& big, const View& small, const View& div, std::array<int64_t, 2> k,
               std::array<int64_t, 2> s, std::array<int64_t, 2> p) {
  KAEL_CHECK(big.ndim == 4 && small.ndim == 4 && div.ndim == 2, Shape, op,
             ": expected 4-d x/dx [N,C,H,W], 4-d out/grad [N,C,OH,OW] and divisors [OH,OW]");
  KAEL_CHECK(is_floating(big.dtype) && small.dtype == big.dtype && is_floating(div.dtype), DType, op,
             ": x/dx and out/grad must share a float dtype, divisors be float");
  KAEL_CHECK(k[0] >= 1 && k[1] >= 1 && s[0] >= 1 && s[1] >= 1 && p[0] >= 0 && p[1] >= 0, Shape, op,
             ": kernel and stride must be >= 1, padding >= 0");
  KAEL_CHECK(big.shape[0] == small.shape[0] && big.shape[1] == small.shape[1] && div.shape[0] == small.shape[2] &&
                 div.shape[1] == small.shape[3],
             Shape, op, ": out/grad must be [N, C, OH, OW] with divisors [OH, OW]");
}

}  // namespace

void avg_pool2d(const View& out, const View& x, const View& divisors, std::array<int64_t, 2> kernel,
                std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  check_avg("avg_pool2d", x, out, divisors, kernel, stride, padding);
  if (out.numel() == 0) return;
  const DType wd = work_dtype(x.dtype);
  Temp xk = to_contiguous(x, wd), dk = to_contiguous(divisors, DType::Float64), ot = make_temp(wd, out.shape, 4);
  const int64_t planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  const int64_t oh = out.shape[2], ow = out.shape[3];
  const double* dv = dk.view.ptr<double>();
  auto run = [&](auto* op, const auto* xp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(xp)>>;
    parallel_for(0, planes, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, oh * ow * kernel[0] * kernel[1])),
                 [&](int64_t b, int64_t e) {
                   for (int64_t pl = b; pl < e; ++pl) {
                     const T* src = xp + pl * h * w;
                     for (int64_t oy = 0; oy < oh; ++oy) {
                       for (int64_t ox = 0; ox < ow; ++ox) {
                         double acc = 0;
                         for (int64_t i = 0; i < kernel[0]; ++i) {
                           const int64_t iy = oy * stride[0] - padding[0] + i;
                           if (iy < 0 || iy >= h) continue;
                           for (int64_t j = 0; j < kernel[1]; ++j) {
                             const int64_t jx = ox * stride[1] - padding[1] + j;
                             if (jx >= 0 && jx < w) acc += static_cast<double>(src[iy * w + jx]);
                           }
                         }
                         op[(pl * oh + oy) * ow + ox] = static_cast<T>(acc / dv[oy * ow + ox]);
                       }
                     }
                   }
                 });
  };
  if (wd == DType::Float64) {
    run(ot.view.ptr<double>(), xk.view.ptr<const double>());
  } else {
    run(ot.view.ptr<float>(), xk.view.ptr<const float>());
  }
  copy(out, ot.view);
}

void avg_pool2d_backward(const View& dx, const View& grad, const View& divisors, std::array<int64_t, 2> kernel,
                         std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
  check_avg("avg_pool2d_backward", dx, grad, divisors, kernel, stride, padding);
  if (dx.numel() == 0) return;
  const DType wd = work_dtype(dx.dtype);
  Temp gk = to_contiguous(grad, wd), dk = to_contiguous(divisors, DType::Float64), dt = make_temp(wd, dx.shape, 4);
  const int64_t planes = dx.shape[0] * dx.shape[1], h = dx.shape[2], w = dx.shape[3];
  const int64_t oh = grad.shape[2], ow = grad.shape[3];
  const double* dv = dk.view.ptr<double>();
  auto run = [&](auto* dp, const auto* gp) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(gp)>>;
    parallel_for(0, planes, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, oh * ow * kernel[0] * kernel[1])),
                 [&](int64_t b, int64_t e) {
                   for (int64_t pl = b; pl < e; ++pl) {
                     T* d = dp + pl * h * w;
                     std::memset(d, 0, static_cast<size_t>(h * w) * sizeof(T));
                     const T* g = gp + pl * oh * ow;
                     for (int64_t oy = 0; oy < oh; ++oy) {
                       for (int64_t ox = 0; ox < ow; ++ox) {
                         const T v = static_cast<T>(static_cast<double>(g[oy * ow + ox]) / dv[oy * ow + ox]);
                         for (int64_t i = 0; i < kernel[0]; ++i) {
                           const int64_t iy = oy * stride[0] - padding[0] + i;
                           if (iy < 0 || iy >= h) continue;
                           for (int64_t j = 0; j < kernel[1]; ++j) {
                             const int64_t jx = ox * stride[1] - padding[1] + j;
                             if (jx >= 0 && jx < w) d[iy * w + jx] += v;
                           }
                         }
                       }
                     }
                   }
                 });
  };
  if (wd == DType::Float64) {
    run(dt.view.ptr<double>(), gk.view.ptr<const double>());
  } else {
    run(dt.view.ptr<float>(), gk.view.ptr<const float>());
  }
  copy(dx, dt.view);
}

}  // namespace kael
