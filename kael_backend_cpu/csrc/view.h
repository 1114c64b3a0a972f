// The strided view every kernel takes: a data pointer (storage offset already
// applied), a dtype, a shape and strides in elements (non-negative; 0 for a
// broadcast dimension). Views never own memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "check.h"
#include "half.h"

namespace kael {

// Codes match kael._dtype.ALL_DTYPES order.
enum class DType : uint8_t { Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64 };
constexpr int kNumDTypes = 10;
constexpr int kMaxDims = 16;

int64_t itemsize(DType d);
const char* dtype_name(DType d);
inline bool is_floating(DType d) {
  return d >= DType::Float16;
}
inline bool is_half(DType d) {
  return d == DType::Float16 || d == DType::BFloat16;
}
inline bool is_integral(DType d) {
  return d >= DType::UInt8 && d <= DType::Int64;
}

template <class T>
constexpr bool is_half_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The type a value of storage type T is computed in (float for the 16-bit floats).
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, bool>)
    return DType::Bool;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::UInt8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::Int8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::Int16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::Int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::Int64;
  else if constexpr (std::is_same_v<T, Half>)
    return DType::Float16;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return DType::BFloat16;
  else if constexpr (std::is_same_v<T, float>)
    return DType::Float32;
  else
    return DType::Float64;
}

// Value conversion between any two element types, NumPy's casting semantics:
// to bool is "!= 0", 16-bit floats go through float (double -> float16 directly).
template <class D, class S>
inline D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (is_half_v<S>) {
    return convert<D>(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, bool>) {
    return s != S(0);
  } else if constexpr (is_half_v<D>) {
    if constexpr (std::is_same_v<S, double>) {
      return D(s);
    } else {
      return D(static_cast<float>(s));
    }
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    // A float out of D's range (negative to unsigned, NaN) is undefined behaviour in C++: go
    // through int64, exact for every value in range; NaN and values beyond int64 give INT64_MIN
    // (what x86 and so NumPy give); narrower integers then wrap, as NumPy's casts do.
    if (!(s >= S(-9223372036854775808.0) && s < S(9223372036854775808.0))) {
      return static_cast<D>(INT64_MIN);
    }
    return static_cast<D>(static_cast<int64_t>(s));
  } else {
    return static_cast<D>(s);
  }
}

struct View {
  char* data = nullptr;  // address of element [0, ..., 0]
  DType dtype = DType::Float32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  [[nodiscard]] int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  [[nodiscard]] int64_t elsize() const { return itemsize(dtype); }
  [[nodiscard]] bool is_contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
  template <class T>
  [[nodiscard]] T* ptr() const {
    return reinterpret_cast<T*>(data);
  }
  // Pointer to the element at a multi-index (ndim entries).
  [[nodiscard]] char* at(const int64_t* idx) const {
    int64_t off = 0;
    for (int i = 0; i < ndim; ++i) off += idx[i] * strides[i];
    return data + off * elsize();
  }
};

// A contiguous view over data.
View contiguous_view(void* data, DType dtype, const int64_t* shape, int ndim);
View contiguous_view(void* data, DType dtype, std::initializer_list<int64_t> shape);
// v with dimension dim fixed at index i (one dimension fewer).
View select(const View& v, int dim, int64_t i);
// v restricted to [start, start + len) along dim.
View narrow(const View& v, int dim, int64_t start, int64_t len);
// v with dims d0 and d1 swapped.
View transpose(const View& v, int d0, int d1);

}  // namespace kael

// KAEL_DISPATCH(dtype, T, body): run body with `T` the C++ type of dtype.
#define KAEL_DISPATCH_CASE(code, type, ...) \
  case ::kael::DType::code: {               \
    using T = type;                         \
    __VA_ARGS__;                            \
    break;                                  \
  }

#define KAEL_DISPATCH(dtype, op, ...)                                                  \
  switch (dtype) {                                                                     \
    KAEL_DISPATCH_CASE(Bool, bool, __VA_ARGS__)                                        \
    KAEL_DISPATCH_CASE(UInt8, uint8_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int8, int8_t, __VA_ARGS__)                                      \
    KAEL_DISPATCH_CASE(Int16, int16_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int32, int32_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int64, int64_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Float16, ::kael::Half, __VA_ARGS__)                             \
    KAEL_DISPATCH_CASE(BFloat16, ::kael::BFloat16, __VA_ARGS__)                        \
    KAEL_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                   \
    default:                                                                           \
      KAEL_CHECK(false, DType, op, ": unsupported dtype ", ::kael::dtype_name(dtype)); \
  }

// The native (non 16-bit float) types only.
#define KAEL_DISPATCH_NATIVE(dtype, op, ...)                                           \
  switch (dtype) {                                                                     \
    KAEL_DISPATCH_CASE(Bool, bool, __VA_ARGS__)                                        \
    KAEL_DISPATCH_CASE(UInt8, uint8_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int8, int8_t, __VA_ARGS__)                                      \
    KAEL_DISPATCH_CASE(Int16, int16_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int32, int32_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Int64, int64_t, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                    \
    KAEL_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                   \
    default:                                                                           \
      KAEL_CHECK(false, DType, op, ": unsupported dtype ", ::kael::dtype_name(dtype)); \
  }

// float32 and float64.
#define KAEL_DISPATCH_FLOAT(dtype, op, ...)                                                           \
  switch (dtype) {                                                                                    \
    KAEL_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                                   \
    KAEL_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                                  \
    default:                                                                                          \
      KAEL_CHECK(false, DType, op, ": expected float32 or float64, got ", ::kael::dtype_name(dtype)); \
  }

// The four floating-point types.
#define KAEL_DISPATCH_FLOATS(dtype, op, ...)                                                               \
  switch (dtype) {                                                                                         \
    KAEL_DISPATCH_CASE(Float16, ::kael::Half, __VA_ARGS__)                                                 \
    KAEL_DISPATCH_CASE(BFloat16, ::kael::BFloat16, __VA_ARGS__)                                            \
    KAEL_DISPATCH_CASE(Float32, float, __VA_ARGS__)                                                        \
    KAEL_DISPATCH_CASE(Float64, double, __VA_ARGS__)                                                       \
    default:                                                                                               \
      KAEL_CHECK(false, DType, op, ": expected a floating-point tensor, got ", ::kael::dtype_name(dtype)); \
  }
