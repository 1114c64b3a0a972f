// The 2-d convolution kernels (conv.cpp): the catalogue's fused conv2d and conv2d_backward.
// Declared here rather than in kernels.h so the convolution family stays in its own pair of files.
#pragma once

#include <array>
#include <cstdint>

#include "view.h"

namespace kael {

// out [N, O, OH, OW] = cross-correlation of x [N, C, H, W] (zero-padded by padding on each side)
// with weight [O, C/groups, KH, KW], + bias [O] (may be null); OH = (H + 2*ph - dh*(KH-1) - 1)/sh + 1.
// Float dtypes (16-bit floats computed in float32); any strides.
void conv2d(const View& out, const View& x, const View& weight, const View* bias, std::array<int64_t, 2> stride,
            std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, int64_t groups);

// The gradients of conv2d given grad [N, O, OH, OW]: dx [N, C, H, W], dweight [O, C/groups, KH, KW],
// dbias [O]; each may be null (not wanted).
void conv2d_backward(const View* dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                     const View& weight, std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                     std::array<int64_t, 2> dilation, int64_t groups);

}  // namespace kael
