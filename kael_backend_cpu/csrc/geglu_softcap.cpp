// gelu_tanh_mul (GeGLU's out = gelu_tanh(gate) * up) and softcap (out = cap * tanh(x / cap)),
// Gemma's fused ops, elementwise over any strides.
//
// float32 and the 16-bit floats run through the vector table: gelu_tanh_f32 and tanh_f32
// (vec_math.h) over float32 chunks on the stack (gathered first when strided or 16-bit).
// float64 computes in double with std::tanh.
//
// NOTE [16-bit rounding of the Gemma ops]: the 16-bit floats round where PyTorch's eager
// ops do, so a float16/bfloat16 model gives the bits of its Hugging Face twin (up to the
// rare case where the tanh approximations differ at a 16-bit rounding boundary).
// gelu_tanh_mul rounds gelu(gate) to the dtype before the product, as Hugging Face's
// act_fn(gate) * up does; softcap rounds after each of its three ops, as
// (x / cap).tanh() * cap does: t = round(x / cap), t = round(tanh(t)), out = round(t * cap),
// each computed in float32 with cap as a float32 (PyTorch's opmath value of the scalar).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "iter.h"
#include "kernels.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kChunk = 256;
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluC = 0.044715;

template <class T>
const T& at(const char* p, int64_t i, int64_t s) {
  return *reinterpret_cast<const T*>(p + i * s);
}

template <class T>
T& at_out(char* p, int64_t i, int64_t s) {
  return *reinterpret_cast<T*>(p + i * s);
}

// The float32 values of elements [i0, i0 + m) of a strided operand: a pointer into it when it is
// contiguous float32, else gathered (and widened) into buf.
template <class T>
const float* chunk(const char* p, int64_t s, int64_t i0, int64_t m, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    if (s == static_cast<int64_t>(sizeof(float))) return reinterpret_cast<const float*>(p) + i0;
  }
  for (int64_t j = 0; j < m; ++j) buf[j] = convert<float>(at<T>(p, i0 + j, s));
  return buf;
}

template <class T>
void gelu_tanh_mul_typed(const View& out, const View& gate, const View& up) {
  const View* ops[3] = {&out, &gate, &up};
  for_each(ops, kGrainCostly, [](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) {
        const double g = at<double>(p[1], i, s[1]);
        const double act = 0.5 * g * (1.0 + std::tanh(kGeluK * (g + kGeluC * g * g * g)));
        at_out<double>(p[0], i, s[0]) = act * at<double>(p[2], i, s[2]);
      }
    } else {
      float a[kChunk], gb[kChunk], ub[kChunk];
      for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t m = std::min(kChunk, n - i0);
        vec().gelu_tanh_f32(a, chunk<T>(p[1], s[1], i0, m, gb), m);  // a private buffer: out may be gate or up
        const float* u = chunk<T>(p[2], s[2], i0, m, ub);
        for (int64_t j = 0; j < m; ++j) {
          if constexpr (std::is_same_v<T, float>) {
            at_out<float>(p[0], i0 + j, s[0]) = a[j] * u[j];
          } else {  // gelu(gate) in gate's dtype, then the product (NOTE [16-bit rounding of the Gemma ops])
            at_out<T>(p[0], i0 + j, s[0]) = convert<T>(convert<float>(convert<T>(a[j])) * u[j]);
          }
        }
      }
    }
  });
}

template <class T>
void softcap_typed(const View& out, const View& x, double cap) {
  const View* ops[2] = {&out, &x};
  for_each(ops, kGrainCostly, [cap](char* const* p, const int64_t* s, int64_t n) {
    if constexpr (std::is_same_v<T, double>) {
      for (int64_t i = 0; i < n; ++i) at_out<double>(p[0], i, s[0]) = cap * std::tanh(at<double>(p[1], i, s[1]) / cap);
    } else {
      const auto c = static_cast<float>(cap);
      float t[kChunk];
      for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
        const int64_t m = std::min(kChunk, n - i0);
        for (int64_t j = 0; j < m; ++j) {
          const float q = convert<float>(at<T>(p[1], i0 + j, s[1])) / c;
          if constexpr (std::is_same_v<T, float>) {
            t[j] = q;
          } else {
            t[j] = convert<float>(convert<T>(q));  // x / cap rounded to the dtype
          }
        }
        vec().tanh_f32(t, t, m);
        for (int64_t j = 0; j < m; ++j) {
          if constexpr (std::is_same_v<T, float>) {
            at_out<float>(p[0], i0 + j, s[0]) = t[j] * c;
          } else {  // tanh rounded to the dtype, then the product rounded again by the store
            at_out<T>(p[0], i0 + j, s[0]) = convert<T>(convert<float>(convert<T>(t[j])) * c);
          }
        }
      }
    }
  });
}

void check_same(const char* op, const char* names, const View& out, std::initializer_list<const View*> in) {
  for (const View* v : in) {
    bool same = v->ndim == out.ndim;
    for (int d = 0; same && d < out.ndim; ++d) same = v->shape[d] == out.shape[d];
    KAEL_CHECK(same, Shape, op, ": ", names, " must share a shape");
    KAEL_CHECK(v->dtype == out.dtype, DType, op, ": ", names, " must share a dtype, got ", dtype_name(v->dtype),
               " and ", dtype_name(out.dtype));
  }
  KAEL_CHECK(is_floating(out.dtype), DType, op, ": expected floating-point tensors, got ", dtype_name(out.dtype));
}

}  // namespace

void gelu_tanh_mul(const View& out, const View& gate, const View& up) {
  check_same("gelu_tanh_mul", "gate, up and out", out, {&gate, &up});
  KAEL_DISPATCH_FLOATS(out.dtype, "gelu_tanh_mul", (gelu_tanh_mul_typed<T>(out, gate, up)));
}

void softcap(const View& out, const View& x, double cap) {
  KAEL_CHECK(std::isfinite(cap) && cap > 0, Kael, "softcap: cap must be a positive finite number, got ", cap);
  check_same("softcap", "x and out", out, {&x});
  KAEL_DISPATCH_FLOATS(out.dtype, "softcap", (softcap_typed<T>(out, x, cap)));
}

}  // namespace kael
