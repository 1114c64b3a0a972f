// Shared pieces of the elementwise kernels: the unsigned "wide" type integer
// arithmetic wraps in (NumPy semantics, no signed-overflow UB) and a predicate scan.
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "iter.h"
#include "view.h"

namespace kael {

// Unsigned type of at least 32 bits for wrapping arithmetic on integer T.
template <class T, bool Small = (sizeof(T) < 4)>
struct wide {
  using type = uint32_t;
};
template <class T>
struct wide<T, false> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using wide_t = typename wide<T>::type;

template <class T>
inline T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<wide_t<T>>(static_cast<wide_t<T>>(a) + static_cast<wide_t<T>>(b)));
}
template <class T>
inline T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<wide_t<T>>(static_cast<wide_t<T>>(a) - static_cast<wide_t<T>>(b)));
}
template <class T>
inline T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<wide_t<T>>(static_cast<wide_t<T>>(a) * static_cast<wide_t<T>>(b)));
}

// True when pred(element) holds for some element of v (v's dtype is T).
template <class T, class Pred>
bool any_element(const View& v, Pred pred) {
  std::atomic<bool> found{false};
  const View* ops[1] = {&v};
  for_each(ops, kGrainCheap, [&](char* const* p, const int64_t* s, int64_t n) {
    bool hit = false;
    for (int64_t i = 0; i < n && !hit; ++i) hit = pred(*reinterpret_cast<const T*>(p[0] + i * s[0]));
    if (hit) found.store(true, std::memory_order_relaxed);
  });
  return found.load();
}

}  // namespace kael
