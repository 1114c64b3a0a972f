// Vectorised inner kernels written once with GCC/Clang vector extensions and
// compiled per instruction set (NOTE [runtime dispatch] in vec.h). The including
// file defines KAEL_VBYTES (vector width in bytes), KAEL_MR_F/KAEL_NV_F and
// KAEL_MR_D/KAEL_NV_D (GEMM micro-tile rows and vectors per row) and opens a
// namespace of its own, after including <algorithm>, <cmath>, <cstdint>, <cstring>, <limits>, <vector>
// and vec.h (this file has no includes: it is pasted inside that namespace).

// clang-format off
typedef float vf __attribute__((vector_size(KAEL_VBYTES)));    // NOLINT(modernize-use-using)
typedef double vd __attribute__((vector_size(KAEL_VBYTES)));   // NOLINT(modernize-use-using)
typedef int32_t vi __attribute__((vector_size(KAEL_VBYTES)));  // NOLINT(modernize-use-using)
typedef int64_t vl __attribute__((vector_size(KAEL_VBYTES)));  // NOLINT(modernize-use-using)
// clang-format on

template <class T>
struct V;
template <>
struct V<float> {
  using type = vf;
  static constexpr int64_t L = KAEL_VBYTES / 4;
};
template <>
struct V<double> {
  using type = vd;
  static constexpr int64_t L = KAEL_VBYTES / 8;
};

template <class T>
using vec_t = typename V<T>::type;

template <class To, class From>
inline To bitcast(From f) {
  static_assert(sizeof(To) == sizeof(From), "bitcast between equal sizes only");
  To t;
  std::memcpy(&t, &f, sizeof(t));
  return t;
}

template <class T>
inline vec_t<T> load(const T* p) {
  vec_t<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class T>
inline void store(T* p, vec_t<T> v) {
  std::memcpy(p, &v, sizeof(v));
}
template <class T>
inline vec_t<T> splat(T x) {
  // x - 0 folds to a plain broadcast (0 + x could not: -0.0 + 0.0 is +0.0), and a
  // lane-by-lane fill can come out as a chain of inserts
  return x - vec_t<T>{};
}
// First `count` lanes from p, the rest `fill`.
template <class T>
inline vec_t<T> load_partial(const T* p, int64_t count, T fill) {
  T tmp[V<T>::L];
  for (int i = 0; i < V<T>::L; ++i) tmp[i] = i < count ? p[i] : fill;
  return load(tmp);
}
template <class T>
inline void store_partial(T* p, vec_t<T> v, int64_t count) {
  T tmp[V<T>::L];
  store(tmp, v);
  for (int64_t i = 0; i < count; ++i) p[i] = tmp[i];
}
template <class T>
inline T hsum(vec_t<T> v) {
  T s = 0;
  for (int i = 0; i < V<T>::L; ++i) s += v[i];
  return s;
}
inline double hsum_d(vf v) {
  double s = 0;
  for (int i = 0; i < V<float>::L; ++i) s += v[i];
  return s;
}

// ---- float32 transcendental functions (Cephes polynomials, ~1-2 ulp) ------------------

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

// ---- float32 rows -------------------------------------------------------------------

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

// Outputs of at least this many bytes bypass the cache (they would evict it anyway).
constexpr int64_t kStreamBytes = int64_t{16} << 20;

template <int OP>
inline vf arith(vf a, vf b) {
  if constexpr (OP == 0)
    return a + b;
  else if constexpr (OP == 1)
    return a - b;
  else if constexpr (OP == 2)
    return a * b;
  else
    return a / b;
}

inline void stream_store(float* p, vf v) {  // p is sizeof(vf)-aligned
#if KAEL_VBYTES == 32 && defined(__AVX__)
  _mm256_stream_ps(p, bitcast<__m256>(v));
#elif KAEL_VBYTES == 16 && defined(__SSE2__)
  _mm_stream_ps(p, bitcast<__m128>(v));
#else
  store(p, v);
#endif
}

template <int OP>
void arith_loop(float* out, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  const bool stream = n * 4 >= kStreamBytes;
  if (stream) {  // scalar head up to a vector-aligned output
    for (; i < n && (reinterpret_cast<uintptr_t>(out + i) % sizeof(vf)) != 0; ++i) {
      out[i] = arith<OP>(splat(a[i * sa]), splat(b[i * sb]))[0];
    }
  }
  const vf a0 = splat(a[0]), b0 = splat(b[0]);
  for (; i + L <= n; i += L) {
    const vf x = sa ? load(a + i) : a0;
    const vf y = sb ? load(b + i) : b0;
    if (stream) {
      stream_store(out + i, arith<OP>(x, y));
    } else {
      store(out + i, arith<OP>(x, y));
    }
  }
  for (; i < n; ++i) out[i] = arith<OP>(splat(a[i * sa]), splat(b[i * sb]))[0];
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
}

void arith_f32(int op, float* out, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) {
  switch (op) {
    case 0:
      arith_loop<0>(out, a, sa, b, sb, n);
      break;
    case 1:
      arith_loop<1>(out, a, sa, b, sb, n);
      break;
    case 2:
      arith_loop<2>(out, a, sa, b, sb, n);
      break;
    default:
      arith_loop<3>(out, a, sa, b, sb, n);
      break;
  }
}

// ---- matrix multiply -------------------------------------------------------------------

// C[m x n] (+)= sum_k Ap[k, 0:MR] (x) Bp[k, 0:NR]
template <class T, int MR, int NV>
void ukernel(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c, int64_t rsc, int64_t csc, int m, int n,
             bool accumulate) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  constexpr int NR = NV * L;
  vt acc[MR][NV];
  for (auto& row : acc) {
    for (auto& v : row) v = vt{};
  }
  for (int i = 0; i < MR; ++i) {  // C's rows are far apart: start fetching them now
    __builtin_prefetch(c + i * rsc, 1);
    __builtin_prefetch(c + i * rsc + NR - 1, 1);
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    vt bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = load(bp + j * L);
    for (int i = 0; i < MR; ++i) {
      const vt av = splat(ap[i]);
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
    ap += MR;
    bp += NR;
  }
  if (m == MR && n == NR && csc == 1) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NV; ++j) {
        T* cp = c + i * rsc + j * L;
        store(cp, accumulate ? load(cp) + acc[i][j] : acc[i][j]);
      }
    }
    return;
  }
  T tile[MR * NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NV; ++j) store(tile + i * NR + j * L, acc[i][j]);
  }
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      T& dst = c[i * rsc + j * csc];
      dst = accumulate ? dst + tile[i * NR + j] : tile[i * NR + j];
    }
  }
}

template <class T, int MR>
void pack_a(int64_t mc, int64_t kc, const T* a, int64_t rsa, int64_t csa, T* ap) {
  for (int64_t p = 0; p < mc; p += MR) {
    const int64_t rows = mc - p < MR ? mc - p : MR;
    const T* ab = a + p * rsa;
    if (rsa == 1 && rows == MR) {  // columns of A contiguous: each k is one MR-run
      for (int64_t k = 0; k < kc; ++k) {
        for (int r = 0; r < MR; ++r) ap[k * MR + r] = ab[k * csa + r];
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        for (int r = 0; r < MR; ++r) ap[k * MR + r] = r < rows ? ab[r * rsa + k * csa] : T(0);
      }
    }
    ap += MR * kc;
  }
}

#if KAEL_VBYTES == 32 && defined(__AVX__)
// dst[r * lds + c] = src[c * lss + r] for an 8x8 block of floats.
inline void transpose8x8(const float* src, int64_t lss, float* dst, int64_t lds) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lss), r2 = _mm256_loadu_ps(src + 2 * lss),
         r3 = _mm256_loadu_ps(src + 3 * lss), r4 = _mm256_loadu_ps(src + 4 * lss), r5 = _mm256_loadu_ps(src + 5 * lss),
         r6 = _mm256_loadu_ps(src + 6 * lss), r7 = _mm256_loadu_ps(src + 7 * lss);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
  _mm256_storeu_ps(dst, r0);
  _mm256_storeu_ps(dst + lds, r1);
  _mm256_storeu_ps(dst + 2 * lds, r2);
  _mm256_storeu_ps(dst + 3 * lds, r3);
  _mm256_storeu_ps(dst + 4 * lds, r4);
  _mm256_storeu_ps(dst + 5 * lds, r5);
  _mm256_storeu_ps(dst + 6 * lds, r6);
  _mm256_storeu_ps(dst + 7 * lds, r7);
}
#endif

template <class T, int NR>
void pack_b(int64_t kc, int64_t nc, const T* b, int64_t rsb, int64_t csb, T* bp0) {
  for (int64_t p = 0; p < nc; p += NR) {
    const int64_t cols = nc - p < NR ? nc - p : NR;
    const T* bb = b + p * csb;
    T* bp = bp0 + p * kc;
    if (csb == 1 && cols == NR) {
      continue;  // full panels of a row-major B: packed below, row by row
    }
    if (rsb == 1 && cols == NR) {  // B^T row-major: NR streams along k
      int64_t k0 = 0;
#if KAEL_VBYTES == 32 && defined(__AVX__)
      if constexpr (std::is_same_v<T, float> && NR % 8 == 0) {  // 8x8 blocks through registers
        for (; k0 + 8 <= kc; k0 += 8) {
          for (int c0 = 0; c0 < NR; c0 += 8) transpose8x8(bb + c0 * csb + k0, csb, bp + k0 * NR + c0, NR);
        }
      }
#endif
      for (; k0 < kc; k0 += 8) {
        const int64_t k1 = k0 + 8 < kc ? k0 + 8 : kc;
        for (int c = 0; c < NR; ++c) {
          const T* col = bb + c * csb;
          for (int64_t k = k0; k < k1; ++k) bp[k * NR + c] = col[k];
        }
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        for (int c = 0; c < NR; ++c) bp[k * NR + c] = c < cols ? bb[k * rsb + c * csb] : T(0);
      }
    }
  }
  if (csb == 1) {  // row-major B: 16 rows at a time, panel by panel (16 forward streams
                   // in, one contiguous run out per panel; no page hopping on either side)
    const int64_t full = nc / NR;
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
      const int64_t k1 = k0 + 16 < kc ? k0 + 16 : kc;
      for (int64_t p = 0; p < full; ++p) {
        T* dst = bp0 + p * NR * kc;
        const T* src = b + p * NR;
        for (int64_t k = k0; k < k1; ++k) {
          for (int c = 0; c < NR; ++c) dst[k * NR + c] = src[k * rsb + c];
        }
      }
    }
  }
}

// Few rows, B contiguous along n: B's rows stream front to back, KG rows at a time,
// into a chunk of C's columns kept in cache (C is read and written once per KG rows
// of B; B is read once in total, sequentially, which is what the memory system and
// the prefetchers like best for decode-sized products).
template <class T, int MB, int KG>
void stream_block(int64_t n, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c, int64_t rsc) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  vt av[MB][KG];
  for (int m = 0; m < MB; ++m) {
    for (int t = 0; t < KG; ++t) av[m][t] = splat(a[m * rsa + t * csa]);
  }
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    vt bv[KG];
    for (int t = 0; t < KG; ++t) bv[t] = load(b + t * rsb + j);
    for (int m = 0; m < MB; ++m) {
      vt cv = load(c + m * rsc + j);
      for (int t = 0; t < KG; ++t) cv += av[m][t] * bv[t];
      store(c + m * rsc + j, cv);
    }
  }
  for (; j < n; ++j) {
    for (int m = 0; m < MB; ++m) {
      T s = c[m * rsc + j];
      for (int t = 0; t < KG; ++t) s += a[m * rsa + t * csa] * b[t * rsb + j];
      c[m * rsc + j] = s;
    }
  }
}

template <class T, int MB, int KG>
void stream_rows(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                 int64_t rsc) {
  int64_t kk = 0;
  for (; kk + KG <= k; kk += KG) {
    int64_t i = 0;
    for (; i + MB <= m; i += MB) {
      stream_block<T, MB, KG>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
    }
    for (; i < m; ++i) stream_block<T, 1, KG>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
  }
  for (; kk < k; ++kk) {
    for (int64_t i = 0; i < m; ++i)
      stream_block<T, 1, 1>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
  }
}

// Few rows, B contiguous along n, a register tile of C: MB rows x NV vectors of C held
// in registers while kn rows of B go by (loaded from C first and stored back after).
// Every element of C still sums its products in order k = 0, 1, 2, ... with one fused
// multiply-add each, exactly like stream_block, so a row comes out bit-identical
// whatever m is (NOTE [batched = alone] in kael/models/_batched.py).
template <class T, int MB, int NV>
inline void tile_nmajor(int64_t kn, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c, int64_t rsc) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  vt acc[MB][NV];
  for (int i = 0; i < MB; ++i) {
    for (int v = 0; v < NV; ++v) acc[i][v] = load(c + i * rsc + v * L);
  }
#pragma GCC unroll 4
  for (int64_t t = 0; t < kn; ++t) {
    vt bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + t * rsb + v * L);
    for (int i = 0; i < MB; ++i) {
      const vt av = splat(a[i * rsa + t * csa]);
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int v = 0; v < NV; ++v) store(c + i * rsc + v * L, acc[i][v]);
  }
}

// All m rows of one column tile (NV vectors wide), four rows at a time: the tile's
// kn x NV*L block of B is read from memory by the first group and from L1 by the rest.
template <class T, int NV>
inline void tile_rows_nmajor(int64_t m, int64_t kn, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                             int64_t rsc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) tile_nmajor<T, 4, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
  switch (m - i) {
    case 3:
      tile_nmajor<T, 3, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    case 2:
      tile_nmajor<T, 2, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    case 1:
      tile_nmajor<T, 1, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    default:
      break;
  }
}

template <class T>
void rows_nmajor(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                 int64_t rsc, bool accumulate) {
  if (!accumulate) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * rsc, 0, static_cast<size_t>(n) * sizeof(T));
  }
  if (m == 1 || m > 4) {
    // Stream B's rows front to back (eight at a time for one row; four at a time for
    // pairs of rows) through a chunk of C that stays in cache (~256 KiB): B is read once,
    // sequentially, at memory bandwidth. For five rows and more this measured faster than
    // the register tiles below when B comes from memory (the long runs along B's rows
    // keep the prefetchers ahead).
    const int64_t chunk = std::max<int64_t>(256, (int64_t{256} << 10) / (m * static_cast<int64_t>(sizeof(T))));
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t w = n - j0 < chunk ? n - j0 : chunk;
      if (m == 1) {
        stream_rows<T, 1, 8>(1, w, k, a, rsa, csa, b + j0, rsb, c + j0, rsc);
      } else {
        stream_rows<T, 2, 4>(m, w, k, a, rsa, csa, b + j0, rsb, c + j0, rsc);
      }
    }
    return;
  }
  constexpr int64_t L = V<T>::L;
  // Two to four rows: blocks of KB rows of B, cut into register tiles of 4 rows x 3
  // vectors that hold C while the block goes by; C's chunk (m x W, 256 KiB) stays in L2
  // between blocks, so B's rows are read in long runs.
  constexpr int64_t KB = 4;
  const int64_t W = std::max<int64_t>(1, (int64_t{256} << 10) / (m * static_cast<int64_t>(sizeof(T)) * 3 * L)) * 3 * L;
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t j1 = n - j0 < W ? n : j0 + W;
    for (int64_t k0 = 0; k0 < k; k0 += KB) {
      const int64_t kn = k - k0 < KB ? k - k0 : KB;
      const T* ak = a + k0 * csa;
      const T* bk = b + k0 * rsb;
      int64_t j = j0;
      const int64_t ahead = k - k0 - KB < KB ? k - k0 - KB : KB;  // rows of the next block
      for (; j + 3 * L <= j1; j += 3 * L) {
        // the same columns of the next block: fetched now, used one sweep of W later
        for (int64_t t = 0; t < ahead; ++t) {
          __builtin_prefetch(bk + (KB + t) * rsb + j);
          __builtin_prefetch(bk + (KB + t) * rsb + j + 3 * L - 1);
        }
        tile_rows_nmajor<T, 3>(m, kn, ak, rsa, csa, bk + j, rsb, c + j, rsc);
      }
      for (; j + L <= j1; j += L) tile_rows_nmajor<T, 1>(m, kn, ak, rsa, csa, bk + j, rsb, c + j, rsc);
      for (; j < j1; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          T s = c[i * rsc + j];
          for (int64_t t = 0; t < kn; ++t) s += ak[i * rsa + t * csa] * bk[t * rsb + j];
          c[i * rsc + j] = s;
        }
      }
    }
  }
}

// Cache lines to prefetch, a line per step of a dot-product loop up to `stop`.
struct LineFetch {
  const char* next = nullptr;
  const char* stop = nullptr;
};

// Few rows, A rows and B columns contiguous along k: MB x NB dot products, each summed in
// L lanes. kmajor_accumulate adds the products over [k0, k1) (whole vectors) to acc; with
// `fetch`, each step along k also prefetches one line of it (spread this way, the requests
// overlap the arithmetic instead of queueing up in a burst). kmajor_store sums the lanes,
// adds the last k % L products and writes C. Split at any multiple of L, the sums are the
// same operations in the same order.
template <class T, int MB, int NB>
inline void kmajor_accumulate(vec_t<T> (&acc)[MB][NB], int64_t k0, int64_t k1, const T* a, int64_t rsa, const T* b,
                              int64_t csb, LineFetch* fetch) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  for (int64_t kk = k0; kk + L <= k1; kk += L) {
    if (fetch != nullptr && fetch->next < fetch->stop) {
      __builtin_prefetch(fetch->next, 0, 2);
      fetch->next += 64;
    }
    vt bv[NB];
    for (int j = 0; j < NB; ++j) bv[j] = load(b + j * csb + kk);
    for (int i = 0; i < MB; ++i) {
      const vt av = load(a + i * rsa + kk);
      for (int j = 0; j < NB; ++j) acc[i][j] += av * bv[j];
    }
  }
}

template <class T, int MB, int NB>
inline void kmajor_store(const vec_t<T> (&acc)[MB][NB], int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb,
                         T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const int64_t kv = k - k % V<T>::L;
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      T s = hsum<T>(acc[i][j]);
      for (int64_t t = kv; t < k; ++t) s += a[i * rsa + t] * b[j * csb + t];
      T& dst = c[i * rsc + j * csc];
      dst = accumulate ? dst + s : s;
    }
  }
}

template <class T, int MB, int NB>
void rows_kmajor_block(int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb, T* c, int64_t rsc, int64_t csc,
                       bool accumulate) {
  vec_t<T> acc[MB][NB];
  for (auto& row : acc) {
    for (auto& v : row) v = vec_t<T>{};
  }
  kmajor_accumulate<T, MB, NB>(acc, 0, k, a, rsa, b, csb, nullptr);
  kmajor_store<T, MB, NB>(acc, k, a, rsa, b, csb, c, rsc, csc, accumulate);
}

// One group of MB rows over the column tiles [j0, j1) of rows_kmajor (3 columns a tile),
// the products over [k0, k1) only; each tile prefetches its share (`per_tile` lines) of
// the stream `fetch`. Between depth blocks a tile's accumulators wait in `saved` (MB x 3
// vectors a tile; null when [k0, k1) is the whole depth); after the last block (k1 == k)
// the tile's results go to C.
template <class T, int MB>
void kmajor_pass(int64_t j0, int64_t j1, int64_t k0, int64_t k1, int64_t k, const T* a, int64_t rsa, const T* b,
                 int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate, vec_t<T>* saved, LineFetch& fetch,
                 int64_t per_tile, const char* end) {
  for (int64_t jj = j0; jj < j1; jj += 3) {
    vec_t<T>* tile = saved == nullptr ? nullptr : saved + (jj - j0) * MB;
    vec_t<T> acc[MB][3];
    for (int i = 0; i < MB; ++i) {
      for (int j = 0; j < 3; ++j) acc[i][j] = k0 == 0 ? vec_t<T>{} : tile[i * 3 + j];
    }
    LineFetch share{fetch.next, std::min(end, fetch.next + per_tile * 64)};
    kmajor_accumulate<T, MB, 3>(acc, k0, k1, a, rsa, b + jj * csb, csb, &share);
    fetch.next = share.next;
    if (k1 == k) {
      kmajor_store<T, MB, 3>(acc, k, a, rsa, b + jj * csb, csb, c + jj * csc, rsc, csc, accumulate);
    } else {
      for (int i = 0; i < MB; ++i) {
        for (int j = 0; j < 3; ++j) tile[i * 3 + j] = acc[i][j];
      }
    }
  }
}

// Long dot products (MLP down-projection, k = 3072): four rows of A no longer fit in L1
// beside a tile of B, so every step would read both from L2. The chunk's products then go
// in depth blocks of kDepth: a group's rows and a tile over one block stay in L1.
constexpr int64_t kDepthMin = 1024;
constexpr int64_t kDepth = 512;

template <class T>
void rows_kmajor(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb, T* c, int64_t rsc,
                 int64_t csc, bool accumulate) {
  // Blocks of 1 x 8 or 4 x 3 dot products (twelve independent accumulators keep both FMA
  // pipes busy). Columns go in chunks of about 128 KiB of B: every group of four rows of
  // A (in L1) runs over the chunk, which the first group reads from memory and the others
  // from L2, so B is read from memory once. Each dot product sums its lanes in the same
  // order in every block shape, so a row's result does not depend on m.
  int64_t j = 0;
  if (m == 1) {
    for (; j + 8 <= n; j += 8)
      rows_kmajor_block<T, 1, 8>(k, a, rsa, b + j * csb, csb, c + j * csc, rsc, csc, accumulate);
  }
  const int64_t chunk = std::max<int64_t>(1, (int64_t{128} << 10) / (3 * k * static_cast<int64_t>(sizeof(T)))) * 3;
  const int64_t n3 = j + (n - j) / 3 * 3;
  const int64_t groups = m / 4 + (m % 4) / 2 + m % 2;
  std::vector<vec_t<T>> saved;  // a depth-blocked chunk's accumulators: m x (j1 - j0) vectors
  for (int64_t j0 = j; j0 < n3; j0 += chunk) {
    const int64_t j1 = std::min<int64_t>(n3, j0 + chunk);
    // The next chunk of B is fetched into cache while this one is computed: each block
    // takes an equal share and asks for one line per step along k (a burst of requests
    // at the start of each block would stall it: the 8-row MLP projection, k = 3072,
    // went from 5.9 to 4.1 ms over GPT-2 small's 12 layers), so memory and arithmetic overlap.
    const char* next = reinterpret_cast<const char*>(b + j1 * csb);
    const int64_t next_bytes = (std::min<int64_t>(n, j1 + chunk) - j1) * csb * static_cast<int64_t>(sizeof(T));
    const int64_t tiles = (j1 - j0) / 3;
    const int64_t per_tile = (next_bytes / 64 + groups * tiles - 1) / (groups * tiles);  // lines
    const char* end = next + std::max<int64_t>(0, next_bytes);
    LineFetch fetch{next, end};
    const int64_t depth = k > kDepthMin && m > 1 ? kDepth : std::max<int64_t>(k, 1);
    const int64_t depths = std::max<int64_t>(1, (k + depth - 1) / depth);
    const int64_t per_block = (per_tile + depths - 1) / depths;
    if (depths > 1) saved.resize(static_cast<size_t>(m * (j1 - j0)));
    const auto group_saved = [&](int64_t i) { return depths > 1 ? saved.data() + i * (j1 - j0) : nullptr; };
    for (int64_t k0 = 0; k0 == 0 || k0 < k; k0 += depth) {
      const int64_t k1 = std::min(k, k0 + depth);
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        kmajor_pass<T, 4>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
      for (; i + 2 <= m; i += 2)
        kmajor_pass<T, 2>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
      for (; i < m; ++i)
        kmajor_pass<T, 1>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
    }
  }
  for (j = n3; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      rows_kmajor_block<T, 1, 1>(k, a + i * rsa, rsa, b + j * csb, csb, c + i * rsc + j * csc, rsc, csc, accumulate);
    }
  }
}

template <class T, int MR, int NV>
GemmKernels<T> gemm_kernels(int64_t mc, int64_t kc, int64_t nc) {
  GemmKernels<T> g;
  g.mr = MR;
  g.nr = NV * V<T>::L;
  g.mc = mc;
  g.kc = kc;
  g.nc = nc;
  g.kernel = ukernel<T, MR, NV>;
  g.pack_a = pack_a<T, MR>;
  g.pack_b = pack_b<T, NV * V<T>::L>;
  g.rows_nmajor = rows_nmajor<T>;
  g.rows_kmajor = rows_kmajor<T>;
  return g;
}

VecTable make_table(const char* name) {
  VecTable t;
  t.name = name;
  t.sgemm = gemm_kernels<float, KAEL_MR_F, KAEL_NV_F>(KAEL_MC_F, 256, 4080);
  t.dgemm = gemm_kernels<double, KAEL_MR_D, KAEL_NV_D>(KAEL_MC_D, 256, 4080);
  t.exp_f32 = exp_f32;
  t.tanh_f32 = tanh_f32;
  t.sigmoid_f32 = sigmoid_f32;
  t.gelu_tanh_f32 = gelu_tanh_f32;
  t.gelu_tanh_bwd_f32 = gelu_tanh_bwd_f32;
  t.sum_f32 = sum_f32;
  t.max_f32 = max_f32;
  t.sum_exp_f32 = sum_exp_f32;
  t.softmax_f32 = softmax_f32;
  t.log_softmax_f32 = log_softmax_f32;
  t.layer_norm_f32 = layer_norm_f32;
  t.axpy_f32 = axpy_f32;
  t.arith_f32 = arith_f32;
  return t;
}
