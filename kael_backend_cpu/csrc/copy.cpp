// copy (strided copy with cast), fill, arange and where.
#include <cstring>

#include "buffer.h"
#include "iter.h"
#include "kernels.h"

namespace kael {
namespace {

// Same-dtype copy: move elements of U (an unsigned type of the item size).
template <class U>
void copy_bits(const View& out, const View& a) {
  const View* ops[2] = {&out, &a};
  for_each(ops, kGrainCheap, [](char* const* p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(U) && s[1] == sizeof(U)) {
      std::memmove(p[0], p[1], static_cast<size_t>(n) * sizeof(U));
    } else if (s[1] == 0) {
      U v;
      std::memcpy(&v, p[1], sizeof(U));
      for (int64_t i = 0; i < n; ++i) std::memcpy(p[0] + i * s[0], &v, sizeof(U));
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(p[0] + i * s[0], p[1] + i * s[1], sizeof(U));
    }
  });
}

template <class D, class S>
void cast_loop(const View& out, const View& a) {
  const View* ops[2] = {&out, &a};
  for_each(ops, kGrainCheap, [](char* const* p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
      D* o = reinterpret_cast<D*>(p[0]);
      const S* x = reinterpret_cast<const S*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = convert<D>(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<D*>(p[0] + i * s[0]) = convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
      }
    }
  });
}

template <class D>
void cast_from(const View& out, const View& a) {
  KAEL_DISPATCH(a.dtype, "copy", (cast_loop<D, T>(out, a)));
}

template <class T>
void fill_loop(const View& out, T v) {
  const View* ops[1] = {&out};
  for_each(ops, kGrainCheap, [v](char* const* p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(T)) {
      T* o = reinterpret_cast<T*>(p[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    }
  });
}

template <class T>
T scalar_as(Scalar v) {
  if (v.kind == Scalar::Float) return convert<T>(v.f);
  if constexpr (std::is_same_v<T, bool>) {
    return v.i != 0;
  } else {
    return convert<T>(v.i);
  }
}

// c ? x : y on bits, by a mask: the compiler keeps it a select (a ternary here can become a branch per element).
template <class U>
U pick(uint8_t c, U x, U y) {
  const U m = U(0) - static_cast<U>(c != 0);
  return static_cast<U>((x & m) | (y & static_cast<U>(~m)));
}

template <class U>
void where_bits(const View& out, const View& cond, const View& a, const View& b) {
  const View* ops[4] = {&out, &cond, &a, &b};
  for_each(ops, kGrainCheap, [](char* const* p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(U) && s[1] == 1 && s[2] == sizeof(U) && s[3] == sizeof(U)) {
      U* o = reinterpret_cast<U*>(p[0]);
      const auto* c = reinterpret_cast<const uint8_t*>(p[1]);
      const U* x = reinterpret_cast<const U*>(p[2]);
      const U* y = reinterpret_cast<const U*>(p[3]);
      for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
    } else if (s[0] == sizeof(U) && s[1] == 1 && (s[2] == 0 || s[2] == sizeof(U)) && (s[3] == 0 || s[3] == sizeof(U))) {
      // x, y or both broadcast scalars (where(mask, g, 0), ReLU's backward): masked selects over contiguous runs, not
      // a memcpy per element
      U* o = reinterpret_cast<U*>(p[0]);
      const auto* c = reinterpret_cast<const uint8_t*>(p[1]);
      if (s[2] == 0 && s[3] == 0) {
        U xv, yv;
        std::memcpy(&xv, p[2], sizeof(U));
        std::memcpy(&yv, p[3], sizeof(U));
        for (int64_t i = 0; i < n; ++i) o[i] = pick(c[i], xv, yv);
      } else if (s[3] == 0) {
        const U* x = reinterpret_cast<const U*>(p[2]);
        U yv;
        std::memcpy(&yv, p[3], sizeof(U));
        for (int64_t i = 0; i < n; ++i) o[i] = pick(c[i], x[i], yv);
      } else {
        const U* y = reinterpret_cast<const U*>(p[3]);
        U xv;
        std::memcpy(&xv, p[2], sizeof(U));
        for (int64_t i = 0; i < n; ++i) o[i] = pick(c[i], xv, y[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const bool c = *reinterpret_cast<const uint8_t*>(p[1] + i * s[1]) != 0;
        std::memcpy(p[0] + i * s[0], c ? p[2] + i * s[2] : p[3] + i * s[3], sizeof(U));
      }
    }
  });
}

void check_same_shape(const char* op, const View& out, const View& a) {
  bool same = out.ndim == a.ndim;
  for (int d = 0; same && d < out.ndim; ++d) same = out.shape[d] == a.shape[d];
  KAEL_CHECK(same, Shape, op, ": operand of ", a.ndim, " dims does not match the output's shape");
}

}  // namespace

void copy(const View& out, const View& a) {
  check_same_shape("copy", out, a);
  if (out.dtype == a.dtype) {
    switch (out.elsize()) {
      case 1:
        copy_bits<uint8_t>(out, a);
        break;
      case 2:
        copy_bits<uint16_t>(out, a);
        break;
      case 4:
        copy_bits<uint32_t>(out, a);
        break;
      default:
        copy_bits<uint64_t>(out, a);
        break;
    }
    return;
  }
  KAEL_DISPATCH(out.dtype, "copy", (cast_from<T>(out, a)));
}

void fill(const View& out, Scalar value) {
  KAEL_DISPATCH(out.dtype, "fill", (fill_loop<T>(out, scalar_as<T>(value))));
}

void arange(const View& out, Scalar start, Scalar step) {
  KAEL_CHECK(out.ndim == 1, Shape, "arange: expected a 1-d output, got ", out.ndim, " dims");
  const int64_t n = out.shape[0];
  const bool in_float = is_floating(out.dtype) || start.kind == Scalar::Float || step.kind == Scalar::Float;
  KAEL_DISPATCH(out.dtype, "arange", {
    char* base = out.data;
    const int64_t st = out.strides[0] * static_cast<int64_t>(sizeof(T));
    if (in_float) {
      const double s0 = start.as_double(), ds = step.as_double();
      parallel_for(0, n, kGrainCheap, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          *reinterpret_cast<T*>(base + i * st) = convert<T>(s0 + static_cast<double>(i) * ds);
        }
      });
    } else {
      const auto s0 = static_cast<uint64_t>(start.i), ds = static_cast<uint64_t>(step.i);
      parallel_for(0, n, kGrainCheap, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {  // wrapping int64 arithmetic, like NumPy
          *reinterpret_cast<T*>(base + i * st) = convert<T>(static_cast<int64_t>(s0 + static_cast<uint64_t>(i) * ds));
        }
      });
    }
  });
}

void where(const View& out, const View& cond, const View& a, const View& b) {
  check_same_shape("where", out, cond);
  check_same_shape("where", out, a);
  check_same_shape("where", out, b);
  KAEL_CHECK(cond.dtype == DType::Bool, DType, "where: condition must be bool, got ", dtype_name(cond.dtype));
  if (a.dtype != out.dtype || b.dtype != out.dtype) {
    Temp ta = to_contiguous(a, out.dtype), tb = to_contiguous(b, out.dtype);
    where(out, cond, ta.view, tb.view);
    return;
  }
  switch (out.elsize()) {
    case 1:
      where_bits<uint8_t>(out, cond, a, b);
      break;
    case 2:
      where_bits<uint16_t>(out, cond, a, b);
      break;
    case 4:
      where_bits<uint32_t>(out, cond, a, b);
      break;
    default:
      where_bits<uint64_t>(out, cond, a, b);
      break;
  }
}

}  // namespace kael
