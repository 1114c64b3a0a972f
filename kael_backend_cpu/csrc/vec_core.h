// Vector types and lane helpers every vector kernel uses: vf/vd/vi/vl (KAEL_VBYTES wide),
// V<T> (lanes per vector), bitcast, load/store (whole and partial: lane masks at 64 bytes),
// splat, horizontal sums.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

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
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// 64-byte vectors: tails through AVX-512 lane masks (a masked-off lane is never read or
// written, so no fault past the end of an array).
template <class T>
inline uint32_t lane_mask(int64_t count) {
  return count >= V<T>::L ? (uint32_t{1} << V<T>::L) - 1 : (uint32_t{1} << count) - 1;
}
// First `count` lanes from p, the rest `fill`.
template <class T>
inline vec_t<T> load_partial(const T* p, int64_t count, T fill) {
  if constexpr (std::is_same_v<T, float>) {
    return bitcast<vf>(_mm512_mask_loadu_ps(_mm512_set1_ps(fill), static_cast<__mmask16>(lane_mask<T>(count)), p));
  } else {
    return bitcast<vd>(_mm512_mask_loadu_pd(_mm512_set1_pd(fill), static_cast<__mmask8>(lane_mask<T>(count)), p));
  }
}
template <class T>
inline void store_partial(T* p, vec_t<T> v, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>(lane_mask<T>(count)), bitcast<__m512>(v));
  } else {
    _mm512_mask_storeu_pd(p, static_cast<__mmask8>(lane_mask<T>(count)), bitcast<__m512d>(v));
  }
}
#else
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
#endif
// The sum of v's lanes. Up to 32 bytes, lane by lane in order; at 64 bytes the two
// 32-byte halves are added first (one vector add, then 8 or 4 lanes in order).
template <class T>
inline T hsum(vec_t<T> v) {
#if KAEL_VBYTES == 64
  typedef T half_t __attribute__((vector_size(32)));  // NOLINT(modernize-use-using)
  // halves by shuffles, not memcpy: a memcpy from &v gives v a stack home, and an accumulator
  // summed this way after a loop was then stored and reloaded on every iteration
  half_t lo, hi;
  if constexpr (sizeof(T) == 4) {
    lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  } else {
    lo = __builtin_shufflevector(v, v, 0, 1, 2, 3);
    hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  }
  const half_t h = lo + hi;
  T s = 0;
  for (int i = 0; i < V<T>::L / 2; ++i) s += h[i];
  return s;
#else
  T s = 0;
  for (int i = 0; i < V<T>::L; ++i) s += v[i];
  return s;
#endif
}
// The sum of a float vector's lanes in double, lane by lane in order.
inline double hsum_d(vf v) {
  double s = 0;
  for (int i = 0; i < V<float>::L; ++i) s += v[i];
  return s;
}
