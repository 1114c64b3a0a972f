// The 2-d max pooling kernels (pool.cpp): the catalogue's fused max_pool2d and max_pool2d_backward.
#pragma once

#include <array>
#include <cstdint>

#include "view.h"

namespace kael {

// out, indices [N, C, OH, OW] from x [N, C, H, W]: the maximum of each window (positions
// o*stride - padding + k*dilation; positions outside x count as -inf) and the flat index
// (h * W + w) of its first occurrence within the input plane; a NaN in a window wins (the first
// one); a window with no position inside x gives -inf and index -1. Float dtypes; any strides.
void max_pool2d(const View& out, const View& indices, const View& x, std::array<int64_t, 2> kernel,
                std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation);

// dx [N, C, H, W] = 0, then grad [N, C, OH, OW] added at each plane's indices (negative ones skipped).
void max_pool2d_backward(const View& dx, const View& grad, const View& indices);

// out [N, C, OH, OW] = the sum of each window's positions inside x [N, C, H, W] (zero padding) divided by
// divisors [OH, OW] (float64; PyTorch's count_include_pad / divisor_override rules, computed by the frontend).
void avg_pool2d(const View& out, const View& x, const View& divisors, std::array<int64_t, 2> kernel,
                std::array<int64_t, 2> stride, std::array<int64_t, 2> padding);

// dx [N, C, H, W] = for each element, the sum of grad / divisors over the windows that contain it.
void avg_pool2d_backward(const View& dx, const View& grad, const View& divisors, std::array<int64_t, 2> kernel,
                         std::array<int64_t, 2> stride, std::array<int64_t, 2> padding);

}  // namespace kael
