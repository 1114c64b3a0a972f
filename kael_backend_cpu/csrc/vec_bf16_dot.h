// The bfloat16 path of quantized_linear for bf16 weights (NOTE [bfloat16 activations] in quant.cpp):
// activation rows rounded to bfloat16 times bfloat16 weight rows with AVX512_BF16's vdpbf16ps, as
// llama.cpp's CPU backend computes a BF16 weight's products on CPUs that have it.
//
// NOTE [bfloat16 dot order]: a row of K values is read in chunks of 32 (the last one zero-padded: the
// activation rows are padded with +0 to a multiple of 32 and the weight's missing values load as +0).
// Each chunk c goes into accumulator c % 2, two vectors of 16 float32 lanes starting at +0; vdpbf16ps
// adds lane l's two products of the chunk, value 2l + 1's first, then value 2l's:
//   a[l] = a[l] + w[32c + 2l + 1] * x[32c + 2l + 1];  a[l] = a[l] + w[32c + 2l] * x[32c + 2l]
// (Intel's definition of the instruction; each product is exact in float32, each addition rounded to
// nearest even, bfloat16 inputs with a zero exponent taken as zero and float32 results below the
// normal range flushed to zero). Then s = a0 + a1 lane by lane, and the 16 lanes are summed as a
// tree: s[l] + s[l + 8] (l < 8), then l + 4, l + 2, l + 1; then the bias. A row's result is the same
// whatever the number of rows or threads.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

#include "vec_quant.h"  // kQPrefetch

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// The 16 lanes of v summed as NOTE [bfloat16 dot order]'s tree.
inline float bd_lane_tree(__m512 v) {
  // (maskz: GCC 12 warns of its undefined source in the plain extracts)
  const __m256 v8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xFF, v, 0), _mm512_maskz_extractf32x8_ps(0xFF, v, 1));
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  return _mm_cvtss_f32(_mm_add_ss(v2, _mm_movehdup_ps(v2)));
}

// MR activation rows (xb: bfloat16 bits, kp = k rounded up to 32 values apart, zero-padded) against
// one bfloat16 weight row w of k values: out[r * rso] = the dot products (no bias).
template <int MR>
__attribute__((target("avx512bf16"))) inline void bd_tile(int64_t k, int64_t kp, const uint16_t* xb, const uint16_t* w,
                                                          float* out, int64_t rso) {
  __m512 a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  const auto xat = [&](int r, int64_t t) {
    return (__m512bh)_mm512_loadu_si512(static_cast<const void*>(xb + r * kp + t));
  };
  int64_t t = 0;
  for (; t + 64 <= k; t += 64) {
    __builtin_prefetch(w + t + kQPrefetch / 2, 0, 0);
    const auto w0 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(w + t));
    const auto w1 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(w + t + 32));
    for (int r = 0; r < MR; ++r) {
      a0[r] = _mm512_dpbf16_ps(a0[r], w0, xat(r, t));
      a1[r] = _mm512_dpbf16_ps(a1[r], w1, xat(r, t + 32));
    }
  }
  // the last one or two chunks (chunk t / 32 is even here: it goes into a0), the weight's missing values as +0
  for (int u = 0; t < k; t += 32, ++u) {
    const int64_t left = k - t;
    const __mmask32 mask = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << left) - 1);
    const auto wc = (__m512bh)_mm512_maskz_loadu_epi16(mask, static_cast<const void*>(w + t));
    for (int r = 0; r < MR; ++r) {
      if (u == 0) {
        a0[r] = _mm512_dpbf16_ps(a0[r], wc, xat(r, t));
      } else {
        a1[r] = _mm512_dpbf16_ps(a1[r], wc, xat(r, t));
      }
    }
  }
  for (int r = 0; r < MR; ++r) out[r * rso] = bd_lane_tree(_mm512_add_ps(a0[r], a1[r]));
}

// c[i * rsc + j] = bfloat16 activation row i (xb + i * kp, kp = k rounded up to 32, zero-padded) . bfloat16 weight
// row j (w + j * rsw bytes, k values) (+ bias[j]) for i < m <= 16, j < n; rows in tiles of up to four share each
// weight row's loads.
__attribute__((target("avx512bf16"), flatten)) inline void bf16dot_rows(int64_t m, int64_t n, int64_t k,
                                                                        const uint16_t* xb, const uint8_t* w,
                                                                        int64_t rsw, const float* bias, float* c,
                                                                        int64_t rsc) {
  const int64_t kp = (k + 31) / 32 * 32;
  for (int64_t j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const uint16_t*>(w + j * rsw);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) bd_tile<4>(k, kp, xb + i * kp, row, c + i * rsc + j, rsc);
    switch (m - i) {
      case 3:
        bd_tile<3>(k, kp, xb + i * kp, row, c + i * rsc + j, rsc);
        break;
      case 2:
        bd_tile<2>(k, kp, xb + i * kp, row, c + i * rsc + j, rsc);
        break;
      case 1:
        bd_tile<1>(k, kp, xb + i * kp, row, c + i * rsc + j, rsc);
        break;
      default:
        break;
    }
    if (bias != nullptr) {
      for (int64_t r = 0; r < m; ++r) c[r * rsc + j] += bias[j];
    }
  }
}
#endif

// The table's bfloat16 kernel: vdpbf16ps where this table is AVX-512 and the CPU has AVX512_BF16, else
// none (bf16 weights then take the float32-activation path).
inline auto bf16dot_kernel()
    -> void (*)(int64_t, int64_t, int64_t, const uint16_t*, const uint8_t*, int64_t, const float*, float*, int64_t) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_bf16) return bf16dot_rows;
#endif
  return nullptr;
}
