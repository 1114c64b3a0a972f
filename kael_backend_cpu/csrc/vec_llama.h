// float32 rows for the Llama-family fused ops: the sum of squares and the scaling of
// rms_norm, silu(gate) * up (SwiGLU) and the rotate-half rotary embedding.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"
#include "vec_math.h"

// Half a float vector: as many floats as a vd holds doubles.
typedef float vfh __attribute__((vector_size(KAEL_VBYTES / 2)));  // NOLINT(modernize-use-using)

// Sum of x[i]^2: each square rounded to float32, the squares summed in double, as ggml's CPU
// rms_norm sums them (so a row's mean, rounded to float32, is llama.cpp's bit for bit nearly
// always: its double sum differs from this one only in rounding far below a float32 ulp).
double sumsq_f32(const float* x, int64_t n) {
  constexpr int64_t L = V<double>::L;
  vd a0{}, a1{};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    vfh h0, h1;
    std::memcpy(&h0, x + i, sizeof(h0));
    std::memcpy(&h1, x + i + L, sizeof(h1));
    a0 += __builtin_convertvector(h0 * h0, vd);
    a1 += __builtin_convertvector(h1 * h1, vd);
  }
  double total = hsum<double>(a0 + a1);
  for (; i < n; ++i) total += static_cast<double>(x[i] * x[i]);
  return total;
}

// out[i] = (x[i] * r) * w[i] (w may be null: out = x * r); two roundings, as Hugging Face's
// RMSNorm computes it. out may be x.
void scale_mul_f32(float* out, const float* x, float r, const float* w, int64_t n) {
  constexpr int64_t L = V<float>::L;
  const vf vr = splat(r);
  int64_t i = 0;
  if (w != nullptr) {
    for (; i + L <= n; i += L) {
      const vf y = load(x + i) * vr;
      store(out + i, y * load(w + i));
    }
    for (; i < n; ++i) {
      const float y = x[i] * r;
      out[i] = y * w[i];
    }
  } else {
    for (; i + L <= n; i += L) store(out + i, load(x + i) * vr);
    for (; i < n; ++i) out[i] = x[i] * r;
  }
}

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may be gate or up.
void silu_mul_f32(float* out, const float* gate, const float* up, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const vf a = vsilu(load(gate + i)) * load(up + i);
    const vf b = vsilu(load(gate + i + L)) * load(up + i + L);
    store(out + i, a);
    store(out + i + L, b);
  }
  for (; i + L <= n; i += L) store(out + i, vsilu(load(gate + i)) * load(up + i));
  if (i < n) {
    const vf g = load_partial(gate + i, n - i, 0.0f), u = load_partial(up + i, n - i, 0.0f);
    store_partial(out + i, vsilu(g) * u, n - i);
  }
}

// Rotate-half over n pairs: o1 = x1 c - x2 s, o2 = x2 c + x1 s. The outputs may be the
// inputs (each pair is read before it is written).
void rope_f32(float* o1, float* o2, const float* x1, const float* x2, const float* c, const float* s, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const vf a = load(x1 + i), b = load(x2 + i), vc = load(c + i), vs = load(s + i);
    store(o1 + i, a * vc - b * vs);
    store(o2 + i, b * vc + a * vs);
  }
  if (i < n) {
    const int64_t m = n - i;
    const vf a = load_partial(x1 + i, m, 0.0f), b = load_partial(x2 + i, m, 0.0f);
    const vf vc = load_partial(c + i, m, 0.0f), vs = load_partial(s + i, m, 0.0f);
    store_partial(o1 + i, a * vc - b * vs, m);
    store_partial(o2 + i, b * vc + a * vs, m);
  }
}
