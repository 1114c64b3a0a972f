// The packed GEMM path (NOTE [gemm paths] in gemm.h): the MR x NR register-tile micro-kernel
// and the packing of A into MR-row panels and of B into NR-column panels.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"

// C[m x n] (+)= sum_k Ap[k, 0:MR] (x) Bp[k, 0:NR]
template <class T, int MR, int NV>
void ukernel(int64_t kc, const T* __restrict ap, const T* __restrict bp, T* c, int64_t rsc, int64_t csc, int m, int n,
             bool accumulate) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  constexpr int NR = NV * L;
  vt acc[MR][NV];
  for (auto& row : acc) {
    for (auto& v : row) v = vt{};
  }
  for (int i = 0; i < MR; ++i) {  // C's rows are far apart: start fetching them now
    __builtin_prefetch(c + i * rsc, 1);
    __builtin_prefetch(c + i * rsc + NR - 1, 1);
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    vt bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = load(bp + j * L);
    for (int i = 0; i < MR; ++i) {
      const vt av = splat(ap[i]);
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
    ap += MR;
    bp += NR;
  }
  if (m == MR && n == NR && csc == 1) {
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NV; ++j) {
        T* cp = c + i * rsc + j * L;
        store(cp, accumulate ? load(cp) + acc[i][j] : acc[i][j]);
      }
    }
    return;
  }
  T tile[MR * NR];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NV; ++j) store(tile + i * NR + j * L, acc[i][j]);
  }
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      T& dst = c[i * rsc + j * csc];
      dst = accumulate ? dst + tile[i * NR + j] : tile[i * NR + j];
    }
  }
}

template <class T, int MR>
void pack_a(int64_t mc, int64_t kc, const T* a, int64_t rsa, int64_t csa, T* ap) {
  for (int64_t p = 0; p < mc; p += MR) {
    const int64_t rows = mc - p < MR ? mc - p : MR;
    const T* ab = a + p * rsa;
    if (rsa == 1 && rows == MR) {  // columns of A contiguous: each k is one MR-run
      for (int64_t k = 0; k < kc; ++k) {
        for (int r = 0; r < MR; ++r) ap[k * MR + r] = ab[k * csa + r];
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        for (int r = 0; r < MR; ++r) ap[k * MR + r] = r < rows ? ab[r * rsa + k * csa] : T(0);
      }
    }
    ap += MR * kc;
  }
}

#if KAEL_VBYTES >= 32 && defined(__AVX__)  // 32-byte registers (also in the 64-byte table)
// dst[r * lds + c] = src[c * lss + r] for an 8x8 block of floats.
inline void transpose8x8(const float* src, int64_t lss, float* dst, int64_t lds) {
  __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lss), r2 = _mm256_loadu_ps(src + 2 * lss),
         r3 = _mm256_loadu_ps(src + 3 * lss), r4 = _mm256_loadu_ps(src + 4 * lss), r5 = _mm256_loadu_ps(src + 5 * lss),
         r6 = _mm256_loadu_ps(src + 6 * lss), r7 = _mm256_loadu_ps(src + 7 * lss);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r0 = _mm256_permute2f128_ps(u0, u4, 0x20);
  r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
  r2 = _mm256_permute2f128_ps(u2, u6, 0x20);
  r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
  r4 = _mm256_permute2f128_ps(u0, u4, 0x31);
  r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
  r6 = _mm256_permute2f128_ps(u2, u6, 0x31);
  r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
  _mm256_storeu_ps(dst, r0);
  _mm256_storeu_ps(dst + lds, r1);
  _mm256_storeu_ps(dst + 2 * lds, r2);
  _mm256_storeu_ps(dst + 3 * lds, r3);
  _mm256_storeu_ps(dst + 4 * lds, r4);
  _mm256_storeu_ps(dst + 5 * lds, r5);
  _mm256_storeu_ps(dst + 6 * lds, r6);
  _mm256_storeu_ps(dst + 7 * lds, r7);
}
#endif

template <class T, int NR>
void pack_b(int64_t kc, int64_t nc, const T* b, int64_t rsb, int64_t csb, T* bp0) {
  for (int64_t p = 0; p < nc; p += NR) {
    const int64_t cols = nc - p < NR ? nc - p : NR;
    const T* bb = b + p * csb;
    T* bp = bp0 + p * kc;
    if (csb == 1 && cols == NR) {
      continue;  // full panels of a row-major B: packed below, row by row
    }
    if (rsb == 1 && cols == NR) {  // B^T row-major: NR streams along k
      int64_t k0 = 0;
#if KAEL_VBYTES >= 32 && defined(__AVX__)
      if constexpr (std::is_same_v<T, float> && NR % 8 == 0) {  // 8x8 blocks through registers
        for (; k0 + 8 <= kc; k0 += 8) {
          for (int c0 = 0; c0 < NR; c0 += 8) transpose8x8(bb + c0 * csb + k0, csb, bp + k0 * NR + c0, NR);
        }
      }
#endif
      for (; k0 < kc; k0 += 8) {
        const int64_t k1 = k0 + 8 < kc ? k0 + 8 : kc;
        for (int c = 0; c < NR; ++c) {
          const T* col = bb + c * csb;
          for (int64_t k = k0; k < k1; ++k) bp[k * NR + c] = col[k];
        }
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        for (int c = 0; c < NR; ++c) bp[k * NR + c] = c < cols ? bb[k * rsb + c * csb] : T(0);
      }
    }
  }
  if (csb == 1) {  // row-major B: 16 rows at a time, panel by panel (16 forward streams
                   // in, one contiguous run out per panel; no page hopping on either side)
    const int64_t full = nc / NR;
    for (int64_t k0 = 0; k0 < kc; k0 += 16) {
      const int64_t k1 = k0 + 16 < kc ? k0 + 16 : kc;
      for (int64_t p = 0; p < full; ++p) {
        T* dst = bp0 + p * NR * kc;
        const T* src = b + p * NR;
        for (int64_t k = k0; k < k1; ++k) {
          for (int c = 0; c < NR; ++c) dst[k * NR + c] = src[k * rsb + c];
        }
      }
    }
  }
}
