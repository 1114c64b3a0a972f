// float32 row kernels: sum, max, sum of exp, softmax, log_softmax and layer_norm over one
// contiguous row, and axpy.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"
#include "vec_math.h"

// Sum in blocks of 2048 with 4 vector accumulators; block sums in double.
double sum_f32(const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  double total = 0;
  for (int64_t b0 = 0; b0 < n; b0 += 2048) {
    const int64_t b1 = b0 + 2048 < n ? b0 + 2048 : n;
    vf a0{}, a1{}, a2{}, a3{};
    int64_t i = b0;
    for (; i + 4 * L <= b1; i += 4 * L) {
      a0 += load(x + i);
      a1 += load(x + i + L);
      a2 += load(x + i + 2 * L);
      a3 += load(x + i + 3 * L);
    }
    for (; i + L <= b1; i += L) a0 += load(x + i);
    if (i < b1) a1 += load_partial(x + i, b1 - i, 0.0f);
    total += hsum_d((a0 + a1) + (a2 + a3));
  }
  return total;
}

float max_f32(const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  const float ninf = -std::numeric_limits<float>::infinity();
  vf m0 = splat(ninf), m1 = m0;
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const vf a = load(x + i), b = load(x + i + L);
    m0 = a > m0 ? a : m0;
    m1 = b > m1 ? b : m1;
  }
  for (; i + L <= n; i += L) {
    const vf a = load(x + i);
    m0 = a > m0 ? a : m0;
  }
  if (i < n) {
    const vf a = load_partial(x + i, n - i, ninf);
    m1 = a > m1 ? a : m1;
  }
  m0 = m1 > m0 ? m1 : m0;
  float m = ninf;
  for (int j = 0; j < L; ++j) m = m0[j] > m ? m0[j] : m;
  return m;
}

double sum_exp_f32(const float* x, float shift, int64_t n) {
  constexpr int64_t L = V<float>::L;
  vf a0{}, a1{};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 += vexp(load(x + i) - shift);
    a1 += vexp(load(x + i + L) - shift);
  }
  for (; i + L <= n; i += L) a0 += vexp(load(x + i) - shift);
  if (i < n) a1 += vexp(load_partial(x + i, n - i, -std::numeric_limits<float>::infinity()) - shift);
  return hsum_d(a0 + a1);
}

void softmax_f32(float* out, const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  if (n == 0) return;
  const float m = max_f32(x, n);
  vf acc{};
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const vf e = vexp(load(x + i) - m);
    store(out + i, e);
    acc += e;
  }
  double s = hsum_d(acc);
  for (; i < n; ++i) {
    const float e = std::exp(x[i] - m);
    out[i] = e;
    s += e;
  }
  // nan anywhere (or an all -inf row, or +inf) makes every output nan, like the reference
  const bool bad = !(m > -std::numeric_limits<float>::infinity()) || std::isinf(m) || std::isnan(s);
  const float inv = bad ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(1.0 / s);
  const vf vinv = splat(inv);
  for (i = 0; i + L <= n; i += L) store(out + i, load(out + i) * vinv);
  for (; i < n; ++i) out[i] *= inv;
}

void log_softmax_f32(float* out, const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  if (n == 0) return;
  const float m = max_f32(x, n);
  const double s = sum_exp_f32(x, m, n);
  const bool bad = !(m > -std::numeric_limits<float>::infinity()) || std::isinf(m) || std::isnan(s);
  const float shift = bad ? std::numeric_limits<float>::quiet_NaN() : m + static_cast<float>(std::log(s));
  int64_t i = 0;
  for (; i + L <= n; i += L) store(out + i, load(x + i) - shift);
  for (; i < n; ++i) out[i] = x[i] - shift;
}

void layer_norm_f32(float* out, const float* x, const float* w, const float* b, int64_t n, float eps, float* mean,
                    float* rstd) {
  constexpr int64_t L = V<float>::L;
  const double mu_d = n ? sum_f32(x, n) / static_cast<double>(n) : 0.0;
  const auto mu = static_cast<float>(mu_d);
  vf v0{}, v1{};
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    const vf d0 = load(x + i) - mu, d1 = load(x + i + L) - mu;
    v0 += d0 * d0;
    v1 += d1 * d1;
  }
  double var = hsum_d(v0 + v1);
  for (; i < n; ++i) {
    const float d = x[i] - mu;
    var += static_cast<double>(d) * d;
  }
  var = n ? var / static_cast<double>(n) : 0.0;
  const auto r = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
  *mean = mu;
  *rstd = r;
  for (i = 0; i + L <= n; i += L) {
    vf y = (load(x + i) - mu) * r;
    if (w) y = y * load(w + i);
    if (b) y = y + load(b + i);
    store(out + i, y);
  }
  for (; i < n; ++i) {
    float y = (x[i] - mu) * r;
    if (w) y *= w[i];
    if (b) y += b[i];
    out[i] = y;
  }
}

void axpy_f32(float* y, float a, const float* x, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  for (; i + L <= n; i += L) store(y + i, load(y + i) + a * load(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}
