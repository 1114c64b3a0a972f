// float32 transcendental functions on vectors (exp, tanh, sigmoid, silu, gelu and its
// derivative; Cephes polynomials, ~1-2 ulp) and the contiguous elementwise loops over them
// (exp_f32, tanh_f32, sigmoid_f32, silu_f32, gelu_tanh_f32, gelu_tanh_bwd_f32).
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"

inline vf vexp(vf x) {
  const vf hi = splat(88.72283935546875f), lo = splat(-103.97207708f);
  vf xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf t = xc * 1.44269504088896341f + magic;
  const vf n = t - magic;
  const vi ni = bitcast<vi>(t) - 0x4B400000;
  vf r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const vf y = p * r * r + r + 1.0f;
  const vi n1 = ni >> 1, n2 = ni - n1;  // 2^n in two factors: no overflow at the range ends
  const vi b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  vf res = y * bitcast<vf>(b1) * bitcast<vf>(b2);
  res = x > hi ? splat(std::numeric_limits<float>::infinity()) : res;
  res = x < lo ? vf{} : res;
  return x != x ? x : res;  // NOLINT(misc-redundant-expression): nan passes through
}

inline vf vabs(vf x) {
  return bitcast<vf>(bitcast<vi>(x) & 0x7FFFFFFF);
}

inline vf vtanh(vf x) {
  const vf ax = vabs(x);
  const vf z = x * x;
  vf p = splat(-5.70498872745E-3f);
  p = p * z + 2.06390887954E-2f;
  p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f;
  p = p * z - 3.33332819422E-1f;
  const vf small = x + x * z * p;
  const vf e = vexp(ax + ax);
  const vf big_abs = 1.0f - 2.0f / (e + 1.0f);
  const vi sign = bitcast<vi>(x) & static_cast<int32_t>(0x80000000u);
  const vf big = bitcast<vf>(bitcast<vi>(big_abs) | sign);
  return ax < 0.625f ? small : big;
}

inline vf vsigmoid(vf x) {
  return 1.0f / (1.0f + vexp(-x));
}

// silu(x) = x sigmoid(x), as x / (1 + exp(-x)) (one rounding less than x * sigmoid(x)). Like
// PyTorch: -inf gives nan (-inf / inf), x < -88.7 gives -0 (exp(-x) overflows to inf).
inline vf vsilu(vf x) {
  return x / (1.0f + vexp(-x));
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;

// gelu (tanh form) as x * sigmoid(2u), u = k (x + c x^3): no cancellation for x << 0.
inline vf vgelu(vf x) {
  const vf u = kGeluK * (x + kGeluC * x * x * x);
  return x / (1.0f + vexp(-2.0f * u));
}

// d gelu / dx with s = sigmoid(2u): s + 2 x s (1 - s) k (1 + 3 c x^2)
inline vf vgelu_grad(vf x) {
  const vf x2 = x * x;
  const vf u = kGeluK * (x + kGeluC * x2 * x);
  const vf s = 1.0f / (1.0f + vexp(-2.0f * u));
  return s + 2.0f * x * s * (1.0f - s) * kGeluK * (1.0f + 3.0f * kGeluC * x2);
}

template <vf (*F)(vf)>
void map_f32(float* out, const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const vf a = F(load(x + i)), b = F(load(x + i + L));
    store(out + i, a);
    store(out + i + L, b);
  }
  for (; i + L <= n; i += L) store(out + i, F(load(x + i)));
  if (i < n) store_partial(out + i, F(load_partial(x + i, n - i, 0.0f)), n - i);
}

void exp_f32(float* out, const float* x, int64_t n) {
  map_f32<vexp>(out, x, n);
}
void tanh_f32(float* out, const float* x, int64_t n) {
  map_f32<vtanh>(out, x, n);
}
void sigmoid_f32(float* out, const float* x, int64_t n) {
  map_f32<vsigmoid>(out, x, n);
}
void silu_f32(float* out, const float* x, int64_t n) {
  map_f32<vsilu>(out, x, n);
}
void gelu_tanh_f32(float* out, const float* x, int64_t n) {
  map_f32<vgelu>(out, x, n);
}

void gelu_tanh_bwd_f32(float* gi, const float* go, const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) store(gi + i, load(go + i) * vgelu_grad(load(x + i)));
  if (i < n)
    store_partial(gi + i, load_partial(go + i, n - i, 0.0f) * vgelu_grad(load_partial(x + i, n - i, 0.0f)), n - i);
}
