// Walking a view line by line along one dim (rows for softmax, sort, layer_norm, ...).
#pragma once

#include <cstdint>

#include "view.h"

namespace kael {

// Offset (in elements) of the element at row-major linear index i of v.
inline int64_t offset_of(const View& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.ndim - 1; d >= 0; --d) {
    off += (i % v.shape[d]) * v.strides[d];
    i /= v.shape[d];
  }
  return off;
}

// The lines of a view along dim: how many, and where line i starts.
struct Lines {
  View rest;  // the view without dim
  int64_t count = 1;
  [[nodiscard]] int64_t offset(int64_t i) const { return offset_of(rest, i); }
};

inline Lines lines_of(const View& v, int dim) {
  Lines l;
  l.rest = select(v, dim, 0);
  l.count = l.rest.numel();
  return l;
}

}  // namespace kael
