// Row kernels in float64 shared by nn.cpp and attention.cpp (float32 rows live in the vector table).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace kael {

// softmax / log_softmax of a contiguous row in double (the float64 path).
inline void softmax_row_f64(double* y, const double* x, int64_t n, bool log) {
  double m = -std::numeric_limits<double>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = x[i] > m ? x[i] : m;
  }
  if (nan || std::isinf(m)) m = std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::exp(x[i] - m);
    if (!log) y[i] = e;
    s += e;
  }
  if (log) {
    const double shift = m + std::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - shift;
  } else {
    const double inv = 1.0 / s;
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

}  // namespace kael
