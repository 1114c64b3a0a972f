// The batch normalisation kernels (batch_norm.cpp): the catalogue's fused batch_norm and batch_norm_backward.
#pragma once

#include "view.h"

namespace kael {

// Training-mode batch norm of x [N, C, *S]: mean, rstd [C] (float32; float64 for float64 x) over every
// dim but 1, rstd = 1/sqrt(biased var + eps); out = (x - mean) * rstd * weight[C] + bias[C] (either may be
// null). Float dtypes (16-bit in float32, statistics accumulated in float64); any strides.
void batch_norm(const View& out, const View& mean, const View& rstd, const View& x, const View* weight,
                const View* bias, double eps);

// Its gradients for grad [N, C, *S]: with xhat = (x - mean) * rstd and M = N * prod(S),
// dx = rstd * w * (grad - sum(grad)/M - xhat * sum(grad * xhat)/M), dweight = sum(grad * xhat),
// dbias = sum(grad) (sums per channel); dx, dweight, dbias may each be null.
void batch_norm_backward(const View* dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                         const View& mean, const View& rstd, const View* weight);

// Eval-mode batch norm with given statistics: out = (x - mean) / sqrt(var + eps) * weight + bias,
// mean and var [C] of any float dtype (computed in float32; float64 for float64 x).
void batch_norm_eval(const View& out, const View& x, const View& mean, const View& var, const View* weight,
                     const View* bias, double eps);

}  // namespace kael
