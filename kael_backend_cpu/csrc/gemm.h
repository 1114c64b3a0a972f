// The strided matrix product every matmul-shaped kernel uses.
#pragma once

#include <cstdint>
#include <functional>

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

// Packs rows [k0, k0 + kc) x columns [n0, n0 + nc) of a B [k x n] that is not stored as
// floats into nr-column panels at bp, the layout GemmKernels::pack_b writes: panel p holds
// columns n0 + p*nr .. as kc rows of nr floats (columns past nc zero).
using PackBFn = std::function<void(int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* bp)>;

// C[m x n] = A[m x k] @ B (C row-major with row stride rsc) through the packed GEMM, B's panels
// written by pack_b (e.g. dequantized straight from quantized weight rows), with depth blocks
// that are multiples of k_align but the last; the threads split the larger of m and n.
void sgemm_packed_b(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa, int64_t k_align,
                    const PackBFn& pack_b, float* c, int64_t rsc);

// The float32 micro-tile's width: the column count of one packed B panel.
int sgemm_nr();

extern template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                                 int64_t, float*, int64_t, int64_t, bool);
extern template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t,
                                  int64_t, double*, int64_t, int64_t, bool);

}  // namespace kael
