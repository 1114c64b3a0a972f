// conv2d and conv2d_backward: im2col one block of samples at a time into a cache-sized
// scratch buffer, then one GEMM per group.
//
// NOTE [conv2d columns]: a block of B samples (about kBlockColumns / P of them, P = OH*OW, fewer
// when C*KH*KW is large; the block size depends on the geometry only) is unfolded into columns [C*KH*KW, B*P]:
// row (c*KH + i)*KW + j holds x[n, c, oy*sh - ph + i*dh, ox*sw - pw + j*dw] at column
// s*P + oy*OW + ox for the block's sample s, 0 in the padding. Group g's rows are the
// contiguous block [g*Kg, (g+1)*Kg) with Kg = C/groups*KH*KW, and yT_g [O/g, B*P] =
// w_g [O/g, Kg] @ cols_g is copied out to each sample's [O, P] block of y with the bias
// added. The frontend's decomposition (kael/ops/_conv_fused.py) unfolds the whole batch at
// once and computes the same products, so the results agree to rounding; the GEMM sums each
// element's products in an order that does not depend on the column count, so a sample's
// output is bit-identical to that sample alone. The backward takes the block's grad as
// gT [O, B*P]: dweight_g (one partial per block) = gT_g @ cols_g^T, dcols_g = w_g^T @ gT_g
// folded back into each sample's dx planes (col2im); dbias = the sums of grad over n and p.
// Blocks run on the thread pool (the GEMMs then inline in each task) and the dweight partials
// are added in block order, so every result is the same whatever the thread count. 16-bit
// floats are computed in float32 and rounded once when copied out.
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

// The output columns [lo, hi) of kernel column offset x0 (= j*dw - pw) whose input column
// x0 + ox*sw lies inside [0, w); the others read the zero padding.
struct ColRange {
  int64_t lo, hi;
};

ColRange inside_columns(const Geom& g, int64_t x0) {
  const int64_t lo = x0 >= 0 ? 0 : std::min(g.ow, (-x0 + g.sw - 1) / g.sw);
  const int64_t hi = g.w - x0 <= 0 ? 0 : std::min(g.ow, (g.w - x0 + g.sw - 1) / g.sw);
  return {lo, std::max(lo, hi)};
}

// d[0, n) = s[0, n) for the short runs of im2col (an output row, often 10-30 values): fixed-size chunks
// the compiler inlines as vector moves (the last one overlapping), where std::copy calls memmove, whose
// call and size dispatch cost more than such a copy.
template <class T>
void copy_run(const T* s, int64_t n, T* d) {
  constexpr int64_t kChunk = 32 / static_cast<int64_t>(sizeof(T));  // values in 32 bytes
  if (n >= kChunk) {
    int64_t i = 0;
    for (; i + kChunk <= n; i += kChunk) std::memcpy(d + i, s + i, 32);
    if (i < n) std::memcpy(d + n - kChunk, s + n - kChunk, 32);
    return;
  }
  for (int64_t i = 0; i < n; ++i) d[i] = s[i];
}

// Row r = (c*KH + i)*KW + j of one sample's columns (NOTE [conv2d columns]): P values into d, from the
// sample's channel plane [H, W]; cr is inside_columns(g, j*dw - pw).
template <class T>
void im2col_row(const Geom& g, const T* plane, int64_t i, int64_t j, ColRange cr, T* d) {
  const int64_t x0 = j * g.dw - g.pw;
  for (int64_t oy = 0; oy < g.oh; ++oy, d += g.ow) {
    const int64_t iy = oy * g.sh - g.ph + i * g.dh;
    if (iy < 0 || iy >= g.h) {
      std::fill(d, d + g.ow, T(0));
      continue;
    }
    const T* row = plane + iy * g.w;  // ox in [lo, hi) reads row[x0 + ox*sw], inside the row
    std::fill(d, d + cr.lo, T(0));
    if (g.sw == 1) {
      copy_run(row + x0 + cr.lo, cr.hi - cr.lo, d + cr.lo);
    } else {
      for (int64_t ox = cr.lo; ox < cr.hi; ++ox) d[ox] = row[x0 + ox * g.sw];
    }
    std::fill(d + cr.hi, d + g.ow, T(0));
  }
}

// A block of samples is unfolded side by side: columns [C*KH*KW, B*P], sample s of the block at
// columns [s*P, (s+1)*P). Blocks hold enough samples for about kBlockColumns columns, so the
// GEMMs are wide enough to run at speed, but no more than about kBlockValues values of columns,
// so the columns written by im2col are still in a core's L2 cache when the GEMMs read them.
constexpr int64_t kBlockColumns = 2048;
constexpr int64_t kBlockValues = int64_t{64} * 1024;

int64_t samples_per_block(const Geom& g) {
  const int64_t p = std::max<int64_t>(1, g.p()), rows = std::max<int64_t>(1, g.c * g.kh * g.kw);
  const int64_t by_columns = (kBlockColumns + p - 1) / p, by_values = kBlockValues / (rows * p);
  return std::clamp<int64_t>(std::min(by_columns, by_values), 1, std::max<int64_t>(1, g.n));
}

// Samples n0 .. n0 + nb - 1 unfolded into cols [C*KH*KW, nb*P].
template <class T>
void im2col_block(const Geom& g, const T* x, int64_t n0, int64_t nb, T* cols) {
  const int64_t p = g.p(), ld = nb * p, hw = g.h * g.w;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const ColRange cr = inside_columns(g, j * g.dw - g.pw);
        T* row = cols + ((c * g.kh + i) * g.kw + j) * ld;
        for (int64_t s = 0; s < nb; ++s) im2col_row(g, x + ((n0 + s) * g.c + c) * hw, i, j, cr, row + s * p);
      }
    }
  }
}

// dplane [C, H, W] (zeroed) += one sample's columns (row stride ld) folded back: the adjoint of im2col_row.
template <class T>
void col2im_sample(const Geom& g, const T* dcols, int64_t ld, T* dplane) {
  for (int64_t c = 0; c < g.c; ++c) {
    T* plane = dplane + c * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* src = dcols + ((c * g.kh + i) * g.kw + j) * ld;
        const int64_t x0 = j * g.dw - g.pw;
        const ColRange cr = inside_columns(g, x0);
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const int64_t iy = oy * g.sh - g.ph + i * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          T* row = plane + iy * g.w;
          const T* sp = src + oy * g.ow;
          if (g.sw == 1) {  // unit stride: a loop the compiler vectorizes
            T* dst = row + x0;
            for (int64_t ox = cr.lo; ox < cr.hi; ++ox) dst[ox] += sp[ox];
          } else {
            for (int64_t ox = cr.lo; ox < cr.hi; ++ox) row[x0 + ox * g.sw] += sp[ox];
          }
        }
      }
    }
  }
}

// y [N, O, P] contiguous: per block of samples, its columns times each group's weight into a [O, B*P]
// scratch, then each sample's [O, P] block copied out with the bias added.
template <class T>
void forward_samples(const Geom& g, T* y, const T* x, const T* w, const T* bias) {
  const int64_t og = g.og(), kg = g.kg(), p = g.p(), rows = g.c * g.kh * g.kw;
  const int64_t spb = samples_per_block(g), blocks = (g.n + spb - 1) / spb;
  parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
    const Buffer cbuf(static_cast<size_t>(rows * spb * p) * sizeof(T));
    const Buffer ybuf(static_cast<size_t>(g.o * spb * p) * sizeof(T));
    T* cols = cbuf.get<T>();
    T* yb = ybuf.get<T>();
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t n0 = blk * spb, nb = std::min(spb, g.n - n0), ld = nb * p;
      im2col_block(g, x, n0, nb, cols);
      for (int64_t gi = 0; gi < g.groups; ++gi) {
        gemm<T>(og, ld, kg, w + gi * og * kg, kg, 1, cols + gi * kg * ld, ld, 1, yb + gi * og * ld, ld, 1, false);
      }
      for (int64_t s = 0; s < nb; ++s) {
        for (int64_t o = 0; o < g.o; ++o) {
          T* dst = y + ((n0 + s) * g.o + o) * p;
          const T* src = yb + o * ld + s * p;
          const T v = bias != nullptr ? bias[o] : T(0);
          if (bias == nullptr) {
            std::copy(src, src + p, dst);
          } else {
            for (int64_t i = 0; i < p; ++i) dst[i] = src[i] + v;
          }
        }
      }
    }
  });
}

template <class T>
void forward_typed(const Geom& g, const View& out, const T* x, const T* w, const T* bias) {
  if (g.kg() == 0) {  // no input channels: bias (or 0) everywhere
    Temp yt = zeros(dtype_of<T>(), {g.n, g.o, g.oh, g.ow});
    T* y = yt.view.ptr<T>();
    for (int64_t n = 0; bias != nullptr && n < g.n; ++n) {
      for (int64_t o = 0; o < g.o; ++o) std::fill(y + (n * g.o + o) * g.p(), y + (n * g.o + o + 1) * g.p(), bias[o]);
    }
    copy(out, yt.view);
    return;
  }
  if (out.dtype == dtype_of<T>() && out.is_contiguous()) {
    forward_samples(g, out.ptr<T>(), x, w, bias);
    return;
  }
  Temp yt = make_temp(dtype_of<T>(), std::array<int64_t, 4>{g.n, g.o, g.oh, g.ow}.data(), 4);
  forward_samples(g, yt.view.ptr<T>(), x, w, bias);
  copy(out, yt.view);
}

template <class T>
void backward_typed(const Geom& g, const View* dx, const View* dweight, const View* dbias, const View& grad,
                    const View& x, const View& weight) {
  const DType d = dtype_of<T>();
  const int64_t p = g.p(), og = g.og(), kg = g.kg(), rows = g.c * g.kh * g.kw;
  Temp gkeep;
  const T* gp = static_cast<const T*>(contiguous_data(grad, d, &gkeep));  // [N, O, P]
  if (dbias != nullptr) {
    Temp db = make_temp(d, std::array<int64_t, 1>{g.o}.data(), 1);
    T* dbp = db.view.ptr<T>();
    parallel_for(0, g.o, std::max<int64_t>(1, kGrainCheap / std::max<int64_t>(1, g.np())), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        double s[4] = {0, 0, 0, 0};  // float64 accumulation in four chains
        for (int64_t n = 0; n < g.n; ++n) {
          const T* row = gp + (n * g.o + o) * p;
          int64_t i = 0;
          for (; i + 4 <= p; i += 4) {
            for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(row[i + k]);
          }
          for (; i < p; ++i) s[0] += static_cast<double>(row[i]);
        }
        dbp[o] = static_cast<T>((s[0] + s[1]) + (s[2] + s[3]));
      }
    });
    copy(*dbias, db.view);
  }
  if (dweight == nullptr && dx == nullptr) return;
  Temp wkeep, xkeep;
  const T* w = static_cast<const T*>(contiguous_data(weight, d, &wkeep));
  const T* xp = static_cast<const T*>(contiguous_data(x, d, &xkeep));
  const bool work = p > 0 && kg > 0;
  const int64_t spb = samples_per_block(g), blocks = (g.n + spb - 1) / spb, wn = g.o * kg;
  Temp dwparts = zeros(d, {dweight != nullptr && work ? blocks : 0, wn});
  Temp dxt = zeros(d, {dx != nullptr ? g.n : 0, g.c, g.h, g.w});
  if (work && (dweight != nullptr || (dx != nullptr && og > 0))) {
    parallel_for(0, blocks, 1, [&](int64_t b, int64_t e) {
      const Buffer cbuf(static_cast<size_t>(rows * spb * p) * sizeof(T));
      const Buffer gbuf(static_cast<size_t>(g.o * spb * p) * sizeof(T));
      T* cols = cbuf.get<T>();
      T* gt = gbuf.get<T>();
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t n0 = blk * spb, nb = std::min(spb, g.n - n0), ld = nb * p;
        for (int64_t s = 0; s < nb; ++s) {  // the block's grad as gT [O, nb*P]
          for (int64_t o = 0; o < g.o; ++o) {
            const T* src = gp + ((n0 + s) * g.o + o) * p;
            std::copy(src, src + p, gt + o * ld + s * p);
          }
        }
        if (dweight != nullptr) {
          T* dwb = dwparts.view.ptr<T>() + blk * wn;
          im2col_block(g, xp, n0, nb, cols);
          for (int64_t gi = 0; gi < g.groups; ++gi) {
            // dweight_g [og, kg] (this block's part) = gT_g [og, nb*P] @ cols_g^T [nb*P, kg]
            gemm<T>(og, kg, ld, gt + gi * og * ld, ld, 1, cols + gi * kg * ld, 1, ld, dwb + gi * og * kg, kg, 1, false);
          }
        }
        if (dx != nullptr && og > 0) {
          for (int64_t gi = 0; gi < g.groups; ++gi) {
            // dcols_g [kg, nb*P] = w_g^T [kg, og] @ gT_g [og, nb*P]
            gemm<T>(kg, ld, og, w + gi * og * kg, 1, kg, gt + gi * og * ld, ld, 1, cols + gi * kg * ld, ld, 1, false);
          }
          for (int64_t s = 0; s < nb; ++s) {
            col2im_sample(g, cols + s * p, ld, dxt.view.ptr<T>() + (n0 + s) * g.c * g.h * g.w);
          }
        }
      }
    });
  }
  if (dweight != nullptr) {
    Temp dw = zeros(d, {g.o, weight.shape[1], g.kh, g.kw});
    T* dwp = dw.view.ptr<T>();
    for (int64_t blk = 0; work && blk < blocks; ++blk) {
      const T* part = dwparts.view.ptr<T>() + blk * wn;
      for (int64_t i = 0; i < wn; ++i) dwp[i] += part[i];
    }
    copy(*dweight, dw.view);
  }
  if (dx != nullptr) copy(*dx, dxt.view);
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
