// Unary elementwise kernels, silu (a fused op of the catalogue) included. Contiguous
// float32 exp/tanh/sigmoid/silu use the vector table; float16/bfloat16 compute in float32;
// integers take float-only ops through float64 (like NumPy) and wrap on neg/abs.
#include <cmath>
#include <type_traits>

#include "buffer.h"
#include "elementwise.h"
#include "kernels.h"
#include "vec.h"

namespace kael {
namespace {

template <UnaryOp OP, class C>
inline C apply_float(C x) {
  if constexpr (OP == UnaryOp::Neg)
    return -x;
  else if constexpr (OP == UnaryOp::Exp)
    return std::exp(x);
  else if constexpr (OP == UnaryOp::Log)
    return std::log(x);
  else if constexpr (OP == UnaryOp::Sqrt)
    return std::sqrt(x);
  else if constexpr (OP == UnaryOp::Rsqrt)
    return C(1) / std::sqrt(x);
  else if constexpr (OP == UnaryOp::Tanh)
    return std::tanh(x);
  else if constexpr (OP == UnaryOp::Abs)
    return std::fabs(x);
  else if constexpr (OP == UnaryOp::Sin)
    return std::sin(x);
  else if constexpr (OP == UnaryOp::Cos)
    return std::cos(x);
  else if constexpr (OP == UnaryOp::Sigmoid)
    return C(1) / (C(1) + std::exp(-x));
  else if constexpr (OP == UnaryOp::Silu)
    return x / (C(1) + std::exp(-x));
  else if constexpr (OP == UnaryOp::Erf)
    return static_cast<C>(std::erf(static_cast<double>(x)));
  else if constexpr (OP == UnaryOp::Log1p)
    return std::log1p(x);
  else if constexpr (OP == UnaryOp::Expm1)
    return std::expm1(x);
  else if constexpr (OP == UnaryOp::Floor)
    return std::floor(x);
  else if constexpr (OP == UnaryOp::Ceil)
    return std::ceil(x);
  else if constexpr (OP == UnaryOp::Round)
    return std::nearbyint(x);  // half to even
  else if constexpr (OP == UnaryOp::Sign)
    return x > C(0) ? C(1) : (x < C(0) ? C(-1) : x);
  else
    return x;
}

template <UnaryOp OP, class T>
inline T apply_int(T x) {
  if constexpr (OP == UnaryOp::Neg) {
    return wrap_sub(T(0), x);
  } else if constexpr (OP == UnaryOp::Abs) {
    if constexpr (std::is_signed_v<T>)
      return x < T(0) ? wrap_sub(T(0), x) : x;
    else
      return x;
  } else if constexpr (OP == UnaryOp::Sign) {
    return x > T(0) ? T(1) : (x < T(0) ? static_cast<T>(-1) : T(0));
  } else if constexpr (OP == UnaryOp::Floor || OP == UnaryOp::Ceil || OP == UnaryOp::Round) {
    return x;
  } else {  // float-only ops: through float64, cast back
    return convert<T>(apply_float<OP, double>(static_cast<double>(x)));
  }
}

template <UnaryOp OP, class T>
inline auto apply(T x) {
  if constexpr (OP == UnaryOp::LogicalNot) {
    return !(convert<compute_t<T>>(x) != compute_t<T>(0));
  } else if constexpr (std::is_same_v<T, bool>) {
    return convert<bool>(apply_int<OP, uint8_t>(static_cast<uint8_t>(x)));
  } else if constexpr (std::is_floating_point_v<compute_t<T>>) {
    return convert<T>(apply_float<OP, compute_t<T>>(convert<compute_t<T>>(x)));
  } else {
    return apply_int<OP, T>(x);
  }
}

template <UnaryOp OP>
constexpr bool vectorised_f32() {
  return OP == UnaryOp::Exp || OP == UnaryOp::Tanh || OP == UnaryOp::Sigmoid || OP == UnaryOp::Silu;
}

template <UnaryOp OP>
auto vector_f32(const VecTable& v) {
  if constexpr (OP == UnaryOp::Exp)
    return v.exp_f32;
  else if constexpr (OP == UnaryOp::Tanh)
    return v.tanh_f32;
  else if constexpr (OP == UnaryOp::Sigmoid)
    return v.sigmoid_f32;
  else
    return v.silu_f32;
}

template <UnaryOp OP, class T>
void unary_loop(const View& out, const View& a) {
  using O = std::conditional_t<OP == UnaryOp::LogicalNot, bool, T>;
  constexpr bool cheap = OP == UnaryOp::Neg || OP == UnaryOp::Abs || OP == UnaryOp::LogicalNot ||
                         OP == UnaryOp::Floor || OP == UnaryOp::Ceil || OP == UnaryOp::Sign;
  const View* ops[2] = {&out, &a};
  for_each(ops, cheap ? kGrainCheap : kGrainCostly, [](char* const* p, const int64_t* s, int64_t n) {
    constexpr auto so = static_cast<int64_t>(sizeof(O)), st = static_cast<int64_t>(sizeof(T));
    if (s[0] == so && s[1] == st) {
      if constexpr (std::is_same_v<T, float> && vectorised_f32<OP>()) {
        vector_f32<OP>(vec())(reinterpret_cast<float*>(p[0]), reinterpret_cast<const float*>(p[1]), n);
        return;
      }
      O* o = reinterpret_cast<O*>(p[0]);
      const T* x = reinterpret_cast<const T*>(p[1]);
      for (int64_t i = 0; i < n; ++i) o[i] = apply<OP, T>(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<O*>(p[0] + i * s[0]) = apply<OP, T>(*reinterpret_cast<const T*>(p[1] + i * s[1]));
      }
    }
  });
}

template <class T>
void unary_typed(UnaryOp op, const View& out, const View& a) {
  switch (op) {
#define KAEL_UNARY_CASE(name)             \
  case UnaryOp::name:                     \
    unary_loop<UnaryOp::name, T>(out, a); \
    break;
    KAEL_UNARY_CASE(Neg)
    KAEL_UNARY_CASE(Exp)
    KAEL_UNARY_CASE(Log)
    KAEL_UNARY_CASE(Sqrt)
    KAEL_UNARY_CASE(Rsqrt)
    KAEL_UNARY_CASE(Tanh)
    KAEL_UNARY_CASE(Abs)
    KAEL_UNARY_CASE(Sin)
    KAEL_UNARY_CASE(Cos)
    KAEL_UNARY_CASE(Sigmoid)
    KAEL_UNARY_CASE(Silu)
    KAEL_UNARY_CASE(Erf)
    KAEL_UNARY_CASE(Log1p)
    KAEL_UNARY_CASE(Expm1)
    KAEL_UNARY_CASE(Floor)
    KAEL_UNARY_CASE(Ceil)
    KAEL_UNARY_CASE(Round)
    KAEL_UNARY_CASE(Sign)
    KAEL_UNARY_CASE(LogicalNot)
#undef KAEL_UNARY_CASE
  }
}

}  // namespace

void unary(UnaryOp op, const View& out, const View& a) {
  bool same = a.ndim == out.ndim;
  for (int d = 0; same && d < out.ndim; ++d) same = a.shape[d] == out.shape[d];
  KAEL_CHECK(same, Shape, "unary op: operand shape must equal the output's");
  const DType want = op == UnaryOp::LogicalNot ? DType::Bool : a.dtype;
  if (out.dtype != want) {
    Temp t = make_temp(want, out.shape, out.ndim);
    unary(op, t.view, a);
    copy(out, t.view);
    return;
  }
  if (out.numel() == 0) return;
  KAEL_DISPATCH(a.dtype, "unary op", (unary_typed<T>(op, out, a)));
}

}  // namespace kael
