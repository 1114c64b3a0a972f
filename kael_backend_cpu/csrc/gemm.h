// The strided matrix product every matmul-shaped kernel uses.
#pragma once

#include <cstdint>

namespace kael {

// C[m x n] = (accumulate ? C : 0) + A[m x k] @ B[k x n]; all strides in elements,
// any non-negative values (transposed operands are packed the right way round).
// Uses the thread pool unless called inside a parallel region. T: float or double.
//
// NOTE [gemm paths]: a product with few rows (m <= 16, decode and short prompts) or
// few columns reads its operands in place with register-blocked row kernels that
// stream the larger operand once; anything bigger is packed into mr x kc and
// kc x nr panels and run through the cache-blocked micro-kernel (BLIS loop order),
// with the threads splitting the larger of m and n. Every row kernel sums each
// element's products in the same order whatever m is, so up to 16 rows a row of C is
// bit-identical to the product of that row alone (batched decoding relies on it).
template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, int64_t csb,
          T* c, int64_t rsc, int64_t csc, bool accumulate);

extern template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                 int64_t, float*, int64_t, int64_t, bool);
extern template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t,
                                  int64_t, double*, int64_t, int64_t, bool);

}  // namespace kael
