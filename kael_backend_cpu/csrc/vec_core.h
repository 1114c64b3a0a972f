// Vector types and lane helpers every vector kernel uses: vf/vd/vi/vl (KAEL_VBYTES wide),
// V<T> (lanes per vector), bitcast, load/store (whole and partial), splat, horizontal sums.
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
