// silu_mul: SwiGLU's out = silu(gate) * up, elementwise over any strides.
//
// float32 runs through the vector table (a vector exp); strided float32 and the 16-bit
// floats are gathered into float32 chunks on the stack first. 16-bit floats round
// silu(gate) to their dtype before the product, as silu then mul (and Hugging Face's
// act_fn(gate) * up) do. float64 computes in double.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "iter.h"
#include "kernels.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kChunk = 256;

template <class T>
void silu_mul_typed(const View& out, const View& gate, const View& up) {
  const View* ops[3] = {&out, &gate, &up};
  for_each(ops, kGrainCostly, [](char* const* p, const int64_t* s, int64_t n) {
    constexpr auto sz = static_cast<int64_t>(sizeof(T));
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) {
        const double g = *reinterpret_cast<const double*>(p[1] + i * s[1]);
        const double u = *reinterpret_cast<const double*>(p[2] + i * s[2]);
        *reinterpret_cast<double*>(p[0] + i * s[0]) = g / (1.0 + std::exp(-g)) * u;
      }
    } else {
      if constexpr (std::is_same_v<T, float>) {
        if (s[0] == sz && s[1] == sz && s[2] == sz) {
          vec().silu_mul_f32(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]),
                             reinterpret_cast<const float*>(p[2]), n);
          return;
        }
      }
      float g[kChunk], u[kChunk];
      for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t m = std::min(kChunk, n - i0);
        for (int64_t j = 0; j < m; ++j) {
          g[j] = convert<float>(*reinterpret_cast<const T*>(p[1] + (i0 + j) * s[1]));
          u[j] = convert<float>(*reinterpret_cast<const T*>(p[2] + (i0 + j) * s[2]));
        }
        if constexpr (std::is_same_v<T, float>) {
          vec().silu_mul_f32(g, g, u, m);
          for (int64_t j = 0; j < m; ++j) *reinterpret_cast<float*>(p[0] + (i0 + j) * s[0]) = g[j];
        } else {
          vec().silu_f32(g, g, m);
          for (int64_t j = 0; j < m; ++j) {
            const float a = convert<float>(convert<T>(g[j]));  // silu(gate) in gate's dtype
            *reinterpret_cast<T*>(p[0] + (i0 + j) * s[0]) = convert<T>(a * u[j]);
          }
        }
      }
    }
  });
}

}  // namespace

void silu_mul(const View& out, const View& gate, const View& up) {
  const View* in[2] = {&gate, &up};
  for (const View* v : in) {
    bool same = v->ndim == out.ndim;
    for (int d = 0; same && d < out.ndim; ++d) same = v->shape[d] == out.shape[d];
    KAEL_CHECK(same, Shape, "silu_mul: gate, up and out must share a shape");
  }
  KAEL_CHECK(is_floating(out.dtype), DType, "silu_mul: expected floating-point tensors, got ", dtype_name(out.dtype));
  KAEL_CHECK(gate.dtype == out.dtype && up.dtype == out.dtype, DType, "silu_mul: gate (", dtype_name(gate.dtype),
             "), up (", dtype_name(up.dtype), ") and out (", dtype_name(out.dtype), ") must share a dtype");
  KAEL_DISPATCH_FLOATS(out.dtype, "silu_mul", (silu_mul_typed<T>(out, gate, up)));
}

}  // namespace kael
