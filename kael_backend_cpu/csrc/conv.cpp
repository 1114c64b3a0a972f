// conv2d and conv2d_backward: im2col into a scratch buffer, then one packed GEMM per group.
//
// NOTE [conv2d columns]: the whole batch is unfolded at once into columns
// cols [C*KH*KW, N*P] (P = OH*OW; row (c*KH + i)*KW + j holds x[n, c, oy*sh - ph + i*dh,
// ox*sw - pw + j*dw] at column n*P + oy*OW + ox, 0 in the padding), so group g's rows are the
// contiguous block [g*Kg, (g+1)*Kg) with Kg = C/groups*KH*KW and each group is one GEMM of
// the batch: yT[O/g rows of g, N*P] = w_g [O/g, Kg] @ cols_g. The frontend's decomposition
// (kael/ops/_conv_fused.py) computes the same products, so the results agree to rounding.
// The backward reuses the layout: dweight_g = gT_g @ cols_g^T, dcols_g = w_g^T @ gT_g folded
// back (col2im, one task per (n, c) plane, so no two threads add into the same element),
// dbias = the row sums of gT. Unfolding and folding run on the thread pool; the GEMMs run
// outside any parallel region, so they use the pool themselves. 16-bit floats are computed
// in float32 and rounded once when copied out.
#include "conv.h"

#include <algorithm>
#include <cstring>

#include "buffer.h"
#include "check.h"
#include "gemm.h"
#include "iter.h"
#include "kernels.h"
#include "thread_pool.h"

namespace kael {
namespace {

struct Geom {
  int64_t n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups;
  [[nodiscard]] int64_t p() const { return oh * ow; }
  [[nodiscard]] int64_t np() const { return n * oh * ow; }
  [[nodiscard]] int64_t og() const { return o / groups; }
  [[nodiscard]] int64_t kg() const { return c / groups * kh * kw; }  // rows of one group's columns
};

Geom geometry(const char* op, const View& x, const View& weight, const View& y, std::array<int64_t, 2> stride,
              std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  KAEL_CHECK(x.ndim == 4 && weight.ndim == 4 && y.ndim == 4, Shape, op,
             ": expected 4-d x [N,C,H,W], weight [O,C/groups,KH,KW] and output, got ", x.ndim, "-d, ", weight.ndim,
             "-d and ", y.ndim, "-d");
  KAEL_CHECK(is_floating(x.dtype) && weight.dtype == x.dtype, DType, op,
             ": x and weight must share a float dtype, got ", dtype_name(x.dtype), " and ", dtype_name(weight.dtype));
  KAEL_CHECK(stride[0] >= 1 && stride[1] >= 1 && dilation[0] >= 1 && dilation[1] >= 1 && padding[0] >= 0 &&
                 padding[1] >= 0 && groups >= 1,
             Shape, op, ": stride (", stride[0], ", ", stride[1], ") and dilation (", dilation[0], ", ", dilation[1],
             ") must be >= 1, padding (", padding[0], ", ", padding[1], ") >= 0, groups ", groups, " >= 1");
  Geom g{x.shape[0], x.shape[1], x.shape[2], x.shape[3], weight.shape[0], weight.shape[2], weight.shape[3], 0,
         0,          stride[0],  stride[1],  padding[0], padding[1],      dilation[0],     dilation[1],     groups};
  KAEL_CHECK(g.c % groups == 0 && g.o % groups == 0 && weight.shape[1] * groups == g.c, Shape, op, ": groups ", groups,
             " must divide in_channels ", g.c, " and out_channels ", g.o, ", and weight's dim 1 (", weight.shape[1],
             ") be in_channels / groups");
  const int64_t eh = g.h + 2 * g.ph - g.dh * (g.kh - 1), ew = g.w + 2 * g.pw - g.dw * (g.kw - 1);
  KAEL_CHECK(eh >= 1 && ew >= 1, Shape, op, ": the dilated kernel (", g.kh, ", ", g.kw,
             ") is larger than the padded input (", g.h + 2 * g.ph, ", ", g.w + 2 * g.pw, ")");
  g.oh = (eh - 1) / g.sh + 1;
  g.ow = (ew - 1) / g.sw + 1;
  KAEL_CHECK(y.shape[0] == g.n && y.shape[1] == g.o && y.shape[2] == g.oh && y.shape[3] == g.ow, Shape, op,
             ": output/grad must be [", g.n, ", ", g.o, ", ", g.oh, ", ", g.ow, "], got [", y.shape[0], ", ",
             y.shape[1], ", ", y.shape[2], ", ", y.shape[3], "]");
  return g;
}

DType work_dtype(DType d) {
  return d == DType::Float64 ? DType::Float64 : DType::Float32;
}

// v itself when it is contiguous and of dtype d, else a contiguous copy (kept alive in keep).
const void* contiguous_data(const View& v, DType d, Temp* keep) {
  if (v.dtype == d && v.is_contiguous()) return v.data;
  *keep = to_contiguous(v, d);
  return keep->view.data;
}

Temp zeros(DType d, std::initializer_list<int64_t> shape) {
  int64_t s[kMaxDims];
  int nd = 0;
  int64_t numel = 1;
  for (int64_t v : shape) {
    s[nd++] = v;
    numel *= v;
  }
  Temp t = make_temp(d, s, nd);
  if (numel) std::memset(t.view.data, 0, static_cast<size_t>(numel * itemsize(d)));
  return t;
}

// The [N, O, OH, OW] view of a [O, N*P] buffer (NOTE [conv2d columns]).
View as_nchw(const Temp& t, const Geom& g) {
  View v = t.view;
  v.ndim = 4;
  const int64_t shape[4] = {g.n, g.o, g.oh, g.ow}, strides[4] = {g.p(), g.np(), g.ow, 1};
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  return v;
}

template <class T>
void im2col(const Geom& g, const T* x, T* cols) {
  const int64_t rows = g.c * g.kh * g.kw, np = g.np(), p = g.p();
  parallel_for(0, rows * g.n, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, p)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = t / g.n, n = t % g.n;
      const int64_t j = r % g.kw, i = (r / g.kw) % g.kh, c = r / (g.kw * g.kh);
      const T* plane = x + (n * g.c + c) * g.h * g.w;
      T* dst = cols + r * np + n * p;
      const int64_t x0 = j * g.dw - g.pw;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t iy = oy * g.sh - g.ph + i * g.dh;
        T* d = dst + oy * g.ow;
        if (iy < 0 || iy >= g.h) {
          std::fill(d, d + g.ow, T(0));
          continue;
        }
        const T* row = plane + iy * g.w;
        if (g.sw == 1 && x0 >= 0 && x0 + g.ow <= g.w) {
          std::copy(row + x0, row + x0 + g.ow, d);
          continue;
        }
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t ix = x0 + ox * g.sw;
          d[ox] = (ix >= 0 && ix < g.w) ? row[ix] : T(0);
        }
      }
    }
  });
}

// dx [N, C, H, W] (zeroed) += the columns folded back: the adjoint of im2col.
template <class T>
void col2im(const Geom& g, const T* cols, T* dx) {
  const int64_t np = g.np(), p = g.p();
  const int64_t work = g.kh * g.kw * p;
  parallel_for(0, g.n * g.c, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, work)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n = t / g.c, c = t % g.c;
      T* plane = dx + t * g.h * g.w;
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* src = cols + ((c * g.kh + i) * g.kw + j) * np + n * p;
          const int64_t x0 = j * g.dw - g.pw;
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t iy = oy * g.sh - g.ph + i * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            T* row = plane + iy * g.w;
            const T* s = src + oy * g.ow;
            for (int64_t ox = 0; ox < g.ow; ++ox) {
              const int64_t ix = x0 + ox * g.sw;
              if (ix >= 0 && ix < g.w) row[ix] += s[ox];
            }
          }
        }
      }
    }
  });
}

template <class T>
void forward_typed(const Geom& g, const View& out, const T* x, const T* w, const T* bias) {
  const int64_t np = g.np(), og = g.og(), kg = g.kg();
  Temp yt = zeros(dtype_of<T>(), {g.o, np});
  T* y = yt.view.ptr<T>();
  if (np && kg) {
    Temp cols = make_temp(dtype_of<T>(), std::array<int64_t, 2>{g.c * g.kh * g.kw, np}.data(), 2);
    im2col(g, x, cols.view.ptr<T>());
    for (int64_t gi = 0; gi < g.groups; ++gi) {
      gemm<T>(og, np, kg, w + gi * og * kg, kg, 1, cols.view.ptr<T>() + gi * kg * np, np, 1, y + gi * og * np, np, 1,
              false);
    }
  }
  if (bias != nullptr) {
    parallel_for(0, g.o, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, np)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        T* row = y + o * np;
        const T v = bias[o];
        for (int64_t i = 0; i < np; ++i) row[i] += v;
      }
    });
  }
  copy(out, as_nchw(yt, g));
}

template <class T>
void backward_typed(const Geom& g, const View* dx, const View* dweight, const View* dbias, const View& grad,
                    const View& x, const View& weight) {
  const DType d = dtype_of<T>();
  const int64_t np = g.np(), og = g.og(), kg = g.kg(), rows = g.c * g.kh * g.kw;
  Temp gt = make_temp(d, std::array<int64_t, 2>{g.o, np}.data(), 2);
  copy(as_nchw(gt, g), grad);  // gT [O, N*P]
  const T* gp = gt.view.ptr<T>();
  if (dbias != nullptr) {
    Temp db = make_temp(d, std::array<int64_t, 1>{g.o}.data(), 1);
    T* dbp = db.view.ptr<T>();
    parallel_for(0, g.o, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, np)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        double s[4] = {0, 0, 0, 0};  // float64 accumulation in four chains
        const T* row = gp + o * np;
        int64_t i = 0;
        for (; i + 4 <= np; i += 4) {
          for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(row[i + k]);
        }
        for (; i < np; ++i) s[0] += static_cast<double>(row[i]);
        dbp[o] = static_cast<T>((s[0] + s[1]) + (s[2] + s[3]));
      }
    });
    copy(*dbias, db.view);
  }
  if (dweight == nullptr && dx == nullptr) return;
  Temp wkeep;
  const T* w = static_cast<const T*>(contiguous_data(weight, d, &wkeep));
  if (dweight != nullptr) {
    Temp dw = zeros(d, {g.o, weight.shape[1], g.kh, g.kw});
    if (np && kg) {
      Temp xkeep;
      const T* xp = static_cast<const T*>(contiguous_data(x, d, &xkeep));
      Temp cols = make_temp(d, std::array<int64_t, 2>{rows, np}.data(), 2);
      im2col(g, xp, cols.view.ptr<T>());
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        // dweight_g [og, kg] = gT_g [og, np] @ cols_g^T [np, kg]
        gemm<T>(og, kg, np, gp + gi * og * np, np, 1, cols.view.ptr<T>() + gi * kg * np, 1, np,
                dw.view.ptr<T>() + gi * og * kg, kg, 1, false);
      }
    }
    copy(*dweight, dw.view);
  }
  if (dx != nullptr) {
    Temp dxt = zeros(d, {g.n, g.c, g.h, g.w});
    if (np && kg && og) {
      Temp dcols = make_temp(d, std::array<int64_t, 2>{rows, np}.data(), 2);
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        // dcols_g [kg, np] = w_g^T [kg, og] @ gT_g [og, np]
        gemm<T>(kg, np, og, w + gi * og * kg, 1, kg, gp + gi * og * np, np, 1, dcols.view.ptr<T>() + gi * kg * np, np,
                1, false);
      }
      col2im(g, dcols.view.ptr<T>(), dxt.view.ptr<T>());
    }
    copy(*dx, dxt.view);
  }
}

}  // namespace

void conv2d(const View& out, const View& x, const View& weight, const View* bias, std::array<int64_t, 2> stride,
            std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups) {
  const Geom g = geometry("conv2d", x, weight, out, stride, padding, dilation, groups);
  KAEL_CHECK(bias == nullptr || (bias->ndim == 1 && bias->shape[0] == g.o && bias->dtype == x.dtype), Shape,
             "conv2d: bias must be [", g.o, "] of x's dtype");
  KAEL_CHECK(out.dtype == x.dtype, DType, "conv2d: out must have x's dtype ", dtype_name(x.dtype));
  if (out.numel() == 0) return;
  const DType d = work_dtype(x.dtype);
  Temp xk, wk, bk;
  const void* xp = contiguous_data(x, d, &xk);
  const void* wp = contiguous_data(weight, d, &wk);
  const void* bp = bias != nullptr ? contiguous_data(*bias, d, &bk) : nullptr;
  if (d == DType::Float64) {
    forward_typed<double>(g, out, static_cast<const double*>(xp), static_cast<const double*>(wp),
                          static_cast<const double*>(bp));
  } else {
    forward_typed<float>(g, out, static_cast<const float*>(xp), static_cast<const float*>(wp),
                         static_cast<const float*>(bp));
  }
}

void conv2d_backward(const View* dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                     const View& weight, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                     std::array<int64_t, 2> dilation, int64_t groups) {
  const Geom g = geometry("conv2d_backward", x, weight, grad, stride, padding, dilation, groups);
  KAEL_CHECK(grad.dtype == x.dtype, DType, "conv2d_backward: grad must have x's dtype ", dtype_name(x.dtype));
  KAEL_CHECK(dx == nullptr || (dx->ndim == 4 && dx->shape[0] == g.n && dx->shape[1] == g.c && dx->shape[2] == g.h &&
                               dx->shape[3] == g.w),
             Shape, "conv2d_backward: dx must have x's shape");
  KAEL_CHECK(
      dweight == nullptr || (dweight->ndim == 4 && dweight->shape[0] == g.o && dweight->shape[1] == weight.shape[1] &&
                             dweight->shape[2] == g.kh && dweight->shape[3] == g.kw),
      Shape, "conv2d_backward: dweight must have weight's shape");
  KAEL_CHECK(dbias == nullptr || (dbias->ndim == 1 && dbias->shape[0] == g.o), Shape,
             "conv2d_backward: dbias must be [", g.o, "]");
  if (work_dtype(x.dtype) == DType::Float64) {
    backward_typed<double>(g, dx, dweight, dbias, grad, x, weight);
  } else {
    backward_typed<float>(g, dx, dweight, dbias, grad, x, weight);
  }
}

}  // namespace kael
