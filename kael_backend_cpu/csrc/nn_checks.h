// Argument checks the fused nn kernels share (nn.cpp, layer_norm.cpp).
#pragma once

#include "check.h"
#include "view.h"

namespace kael {

inline void check_same(const View& a, const View& b, const char* op) {
  bool same = a.ndim == b.ndim;
  for (int d = 0; same && d < a.ndim; ++d) same = a.shape[d] == b.shape[d];
  KAEL_CHECK(same, Shape, op, ": operands must share the output's shape");
}

inline void check_float(const View& v, const char* op) {
  KAEL_CHECK(is_floating(v.dtype), DType, op, ": expected a floating-point tensor, got ", dtype_name(v.dtype));
}

}  // namespace kael
