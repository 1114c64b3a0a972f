// rope: the rotary position embedding, rotate-half convention (Hugging Face Llama).
// x/out [B, H, T, D], cos/sin tables [P, D/2], positions int64 [B, T]; with h = D/2,
// c, s = cos/sin[positions[b, t]]: out[.., :h] = x1 c - x2 s, out[.., h:] = x2 c + x1 s.
//
// Computed in float32, or float64 when x or the tables are float64. Every position is
// checked against P before anything is written. Rows (b, head, t) run in parallel; a row
// reads both halves of x before writing, so out may be x itself (in place). Every
// float32-computed row goes through the vector table (strided and 16-bit rows gathered
// into stack chunks first), so a row's result does not depend on its layout.
#include <algorithm>
#include <type_traits>

#include "buffer.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kChunk = 128;  // pairs gathered at a time on the stack

template <class T, class TT>
void rope_typed(const View& out, const View& x, const View& cos, const View& sin, const View& pos) {
  using C = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<TT, double>, double, float>;
  const int64_t nh = x.shape[1], nt = x.shape[2], h = x.shape[3] / 2;
  const int64_t rows = x.shape[0] * nh * nt;
  const int64_t xs3 = x.strides[3], os3 = out.strides[3], cs1 = cos.strides[1], ss1 = sin.strides[1];
  const bool direct =
      std::is_same_v<T, float> && std::is_same_v<TT, float> && xs3 == 1 && os3 == 1 && cs1 == 1 && ss1 == 1;
  parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, 2 * h)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % nt, hd = (r / nt) % nh, b = r / (nt * nh);
      const int64_t p = pos.ptr<int64_t>()[b * pos.strides[0] + t * pos.strides[1]];
      const T* xp = x.ptr<T>() + b * x.strides[0] + hd * x.strides[1] + t * x.strides[2];
      T* op = out.ptr<T>() + b * out.strides[0] + hd * out.strides[1] + t * out.strides[2];
      const TT* cp = cos.ptr<TT>() + p * cos.strides[0];
      const TT* sp = sin.ptr<TT>() + p * sin.strides[0];
      if constexpr (std::is_same_v<C, double>) {
        for (int64_t i = 0; i < h; ++i) {
          const auto x1 = convert<C>(xp[i * xs3]), x2 = convert<C>(xp[(i + h) * xs3]);
          const auto c = convert<C>(cp[i * cs1]), s = convert<C>(sp[i * ss1]);
          const C o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s;
          op[i * os3] = convert<T>(o1);
          op[(i + h) * os3] = convert<T>(o2);
        }
      } else {
        if constexpr (std::is_same_v<T, float> && std::is_same_v<TT, float>) {
          if (direct) {
            vec().rope_f32(op, op + h, xp, xp + h, cp, sp, h);
            continue;
          }
        }
        // any other float32-computed row goes through the same vector code, in chunks, so
        // the result does not depend on the layout
        float x1[kChunk], x2[kChunk], c[kChunk], s[kChunk];
        for (int64_t i0 = 0; i0 < h; i0 += kChunk) {
          const int64_t m = std::min(kChunk, h - i0);
          for (int64_t j = 0; j < m; ++j) {
            const int64_t i = i0 + j;
            x1[j] = convert<float>(xp[i * xs3]);
            x2[j] = convert<float>(xp[(i + h) * xs3]);
            c[j] = convert<float>(cp[i * cs1]);
            s[j] = convert<float>(sp[i * ss1]);
          }
          vec().rope_f32(x1, x2, x1, x2, c, s, m);
          for (int64_t j = 0; j < m; ++j) {
            op[(i0 + j) * os3] = convert<T>(x1[j]);
            op[(i0 + j + h) * os3] = convert<T>(x2[j]);
          }
        }
      }
    }
  });
}

template <class T>
void rope_tables(const View& out, const View& x, const View& cos, const View& sin, const View& pos) {
  if (cos.dtype == DType::Float64) {
    rope_typed<T, double>(out, x, cos, sin, pos);
  } else {
    rope_typed<T, float>(out, x, cos, sin, pos);
  }
}

}  // namespace

void rope(const View& out, const View& x, const View& cos, const View& sin, const View& positions) {
  KAEL_CHECK(x.ndim == 4, Shape, "rope: x must be [B, H, T, D], got ", x.ndim, " dims");
  bool same = out.ndim == 4;
  for (int d = 0; same && d < 4; ++d) same = out.shape[d] == x.shape[d];
  KAEL_CHECK(same, Shape, "rope: out must have x's shape [", x.shape[0], ", ", x.shape[1], ", ", x.shape[2], ", ",
             x.shape[3], "]");
  KAEL_CHECK(is_floating(x.dtype), DType, "rope: expected a floating-point x, got ", dtype_name(x.dtype));
  KAEL_CHECK(out.dtype == x.dtype, DType, "rope: out (", dtype_name(out.dtype), ") must have x's dtype (",
             dtype_name(x.dtype), ")");
  const int64_t d = x.shape[3];
  KAEL_CHECK(d % 2 == 0, Shape, "rope: the head dim D must be even, got ", d);
  KAEL_CHECK(
      cos.ndim == 2 && sin.ndim == 2 && cos.shape[1] == d / 2 && sin.shape[0] == cos.shape[0] && sin.shape[1] == d / 2,
      Shape, "rope: cos and sin must both be [P, ", d / 2, "] (D/2 = ", d / 2, ")");
  KAEL_CHECK((cos.dtype == DType::Float32 || cos.dtype == DType::Float64) && sin.dtype == cos.dtype, DType,
             "rope: cos and sin must both be float32 or float64, got ", dtype_name(cos.dtype), " and ",
             dtype_name(sin.dtype));
  KAEL_CHECK(positions.ndim == 2 && positions.shape[0] == x.shape[0] && positions.shape[1] == x.shape[2], Shape,
             "rope: positions must be [B, T] = [", x.shape[0], ", ", x.shape[2], "]");
  KAEL_CHECK(positions.dtype == DType::Int64, DType, "rope: positions must be int64, got ",
             dtype_name(positions.dtype));
  const int64_t npos = cos.shape[0];
  for (int64_t b = 0; b < positions.shape[0]; ++b) {
    for (int64_t t = 0; t < positions.shape[1]; ++t) {
      const int64_t p = positions.ptr<int64_t>()[b * positions.strides[0] + t * positions.strides[1]];
      KAEL_CHECK(p >= 0 && p < npos, Index, "rope: positions[", b, ", ", t, "] = ", p,
                 " is out of range for tables of ", npos, " positions (expected 0 <= position < ", npos, ")");
    }
  }
  if (out.numel() == 0) return;
  KAEL_DISPATCH_FLOATS(x.dtype, "rope", (rope_tables<T>(out, x, cos, sin, positions)));
}

}  // namespace kael
