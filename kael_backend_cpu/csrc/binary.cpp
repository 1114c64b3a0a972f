// Binary elementwise kernels: arithmetic, comparisons and logical ops, NumPy semantics
// (integers wrap, Python-style floor division and remainder, nan-propagating max/min).
#include <cmath>
#include <type_traits>

#include "buffer.h"
#include "elementwise.h"
#include "kernels.h"
#include "vec.h"

namespace kael {
namespace {

bool is_compare(BinaryOp op) {
  return op >= BinaryOp::Eq;
}

// NumPy's npy_divmod for floats: (floor quotient, remainder with the divisor's sign).
template <class C>
inline void float_divmod(C a, C b, C* floordiv, C* mod) {
  C m = std::fmod(a, b);
  if (b == 0) {
    *mod = m;
    *floordiv = a / b;
    return;
  }
  C div = (a - m) / b;
  if (m != 0) {
    if ((b < 0) != (m < 0)) {
      m += b;
      div -= C(1);
    }
  } else {
    m = std::copysign(C(0), b);
  }
  C fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > C(0.5)) fd += C(1);
  } else {
    fd = std::copysign(C(0), a / b);
  }
  *floordiv = fd;
  *mod = m;
}

template <class C>
inline C int_pow(C base, C exp) {
  using W = wide_t<C>;
  // sign extension into the wide unsigned type is the point (modular arithmetic)
  W result = 1, b = static_cast<W>(base);  // NOLINT(bugprone-signed-char-misuse)
  auto e = static_cast<W>(exp);            // NOLINT(bugprone-signed-char-misuse)
  while (e) {
    if (e & 1u) result = static_cast<W>(result * b);
    b = static_cast<W>(b * b);
    e >>= 1u;
  }
  return static_cast<C>(result);
}

// op(a, b) computed in C (float for 16-bit floats, uint8 for bool).
template <BinaryOp OP, class C>
inline auto apply(C a, C b) {
  constexpr bool fp = std::is_floating_point_v<C>;
  if constexpr (OP == BinaryOp::Add) {
    if constexpr (fp)
      return a + b;
    else
      return wrap_add(a, b);
  } else if constexpr (OP == BinaryOp::Sub) {
    if constexpr (fp)
      return a - b;
    else
      return wrap_sub(a, b);
  } else if constexpr (OP == BinaryOp::Mul) {
    if constexpr (fp)
      return a * b;
    else
      return wrap_mul(a, b);
  } else if constexpr (OP == BinaryOp::Div) {
    if constexpr (fp)
      return a / b;
    else
      return static_cast<double>(a) / static_cast<double>(b);
  } else if constexpr (OP == BinaryOp::Pow) {
    if constexpr (fp)
      return static_cast<C>(std::pow(a, b));
    else
      return int_pow(a, b);
  } else if constexpr (OP == BinaryOp::Maximum) {
    if constexpr (fp)
      return (a >= b || a != a) ? a : b;
    else
      return a > b ? a : b;  // NOLINT(misc-redundant-expression)
  } else if constexpr (OP == BinaryOp::Minimum) {
    if constexpr (fp)
      return (a <= b || a != a) ? a : b;
    else
      return a < b ? a : b;  // NOLINT(misc-redundant-expression)
  } else if constexpr (OP == BinaryOp::Remainder || OP == BinaryOp::FloorDivide) {
    if constexpr (fp) {
      C q, r;
      float_divmod(a, b, &q, &r);
      return OP == BinaryOp::Remainder ? r : q;
    } else if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return OP == BinaryOp::Remainder ? C(0) : wrap_sub(C(0), a);  // no INT_MIN / -1 trap
      C q = static_cast<C>(a / b), r = static_cast<C>(a % b);
      if (r != 0 && ((r < 0) != (b < 0))) {
        r = static_cast<C>(r + b);
        q = static_cast<C>(q - 1);
      }
      return OP == BinaryOp::Remainder ? r : q;
    } else {
      return OP == BinaryOp::Remainder ? static_cast<C>(a % b) : static_cast<C>(a / b);
    }
  } else if constexpr (OP == BinaryOp::Eq) {
    return a == b;
  } else if constexpr (OP == BinaryOp::Ne) {
    return a != b;
  } else if constexpr (OP == BinaryOp::Lt) {
    return a < b;
  } else if constexpr (OP == BinaryOp::Le) {
    return a <= b;
  } else if constexpr (OP == BinaryOp::Gt) {
    return a > b;
  } else if constexpr (OP == BinaryOp::Ge) {
    return a >= b;
  } else if constexpr (OP == BinaryOp::LogicalAnd) {
    return a != C(0) && b != C(0);
  } else {
    return a != C(0) || b != C(0);
  }
}

template <class T>
using arith_t = std::conditional_t<std::is_same_v<T, bool>, uint8_t, compute_t<T>>;

template <BinaryOp OP, class T>
void binary_loop(const View& out, const View& a, const View& b) {
  using C = arith_t<T>;
  using O = std::conditional_t<(OP >= BinaryOp::Eq), bool, T>;
  const View* ops[3] = {&out, &a, &b};
  const int64_t grain = OP == BinaryOp::Pow || OP == BinaryOp::Remainder ? kGrainCostly : kGrainCheap;
  for_each(ops, grain, [](char* const* p, const int64_t* s, int64_t n) {
    auto f = [](T x, T y) { return convert<O>(apply<OP, C>(convert<C>(x), convert<C>(y))); };
    O* o = reinterpret_cast<O*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    constexpr auto so = static_cast<int64_t>(sizeof(O)), st = static_cast<int64_t>(sizeof(T));
    if constexpr (std::is_same_v<T, float> && OP <= BinaryOp::Div) {
      const bool vx = s[1] == st || s[1] == 0, vy = s[2] == st || s[2] == 0;
      if (s[0] == so && vx && vy) {
        vec().arith_f32(static_cast<int>(OP), o, x, s[1] ? 1 : 0, y, s[2] ? 1 : 0, n);
        return;
      }
    }
    if (s[0] == so && s[1] == st && s[2] == st) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == so && s[1] == st && s[2] == 0) {
      const T yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (s[0] == so && s[1] == 0 && s[2] == st) {
      const T xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<O*>(p[0] + i * s[0]) =
            f(*reinterpret_cast<const T*>(p[1] + i * s[1]), *reinterpret_cast<const T*>(p[2] + i * s[2]));
      }
    }
  });
}

template <class T>
void check_int_operands(BinaryOp op, const View& b) {
  if constexpr (!std::is_floating_point_v<compute_t<T>>) {
    if (op == BinaryOp::Pow && std::is_signed_v<T>) {
      KAEL_CHECK(!any_element<T>(b, [](T v) { return v < T(0); }), DType,
                 "pow: integers to negative integer powers are not allowed");
    }
    if (op == BinaryOp::Remainder || op == BinaryOp::FloorDivide) {
      KAEL_CHECK(!any_element<T>(b, [](T v) { return v == T(0); }), ZeroDivision,
                 op == BinaryOp::Remainder ? "remainder" : "floor_divide", ": integer division by zero");
    }
  }
}

template <class T>
void binary_typed(BinaryOp op, const View& out, const View& a, const View& b) {
  check_int_operands<T>(op, b);
  switch (op) {
#define KAEL_BINARY_CASE(name)                 \
  case BinaryOp::name:                         \
    binary_loop<BinaryOp::name, T>(out, a, b); \
    break;
    KAEL_BINARY_CASE(Add)
    KAEL_BINARY_CASE(Sub)
    KAEL_BINARY_CASE(Mul)
    KAEL_BINARY_CASE(Div)
    KAEL_BINARY_CASE(Pow)
    KAEL_BINARY_CASE(Maximum)
    KAEL_BINARY_CASE(Minimum)
    KAEL_BINARY_CASE(Remainder)
    KAEL_BINARY_CASE(FloorDivide)
    KAEL_BINARY_CASE(Eq)
    KAEL_BINARY_CASE(Ne)
    KAEL_BINARY_CASE(Lt)
    KAEL_BINARY_CASE(Le)
    KAEL_BINARY_CASE(Gt)
    KAEL_BINARY_CASE(Ge)
    KAEL_BINARY_CASE(LogicalAnd)
    KAEL_BINARY_CASE(LogicalOr)
#undef KAEL_BINARY_CASE
  }
}

}  // namespace

void binary(BinaryOp op, const View& out, const View& a, const View& b) {
  const bool shapes_ok = a.ndim == out.ndim && b.ndim == out.ndim;
  KAEL_CHECK(shapes_ok, Shape, "binary op: operands must already be broadcast to the output's ", out.ndim, " dims");
  for (int d = 0; d < out.ndim; ++d) {
    KAEL_CHECK(a.shape[d] == out.shape[d] && b.shape[d] == out.shape[d], Shape,
               "binary op: operand shape differs from the output's at dim ", d, " (", a.shape[d], ", ", b.shape[d],
               " vs ", out.shape[d], ")");
  }
  if (a.dtype != b.dtype) {  // the frontend promotes; be forgiving for direct callers
    Temp tb = to_contiguous(b, a.dtype);
    binary(op, out, a, tb.view);
    return;
  }
  const DType want = is_compare(op) ? DType::Bool : a.dtype;
  if (out.dtype != want) {  // compute in the operands' type, then cast into out
    Temp t = make_temp(want, out.shape, out.ndim);
    binary(op, t.view, a, b);
    copy(out, t.view);
    return;
  }
  if (out.numel() == 0) return;
  KAEL_DISPATCH(a.dtype, "binary op", (binary_typed<T>(op, out, a, b)));
}

}  // namespace kael
