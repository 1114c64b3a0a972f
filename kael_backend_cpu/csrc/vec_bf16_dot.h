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

#include "vec_tiles.h"  // tile_rows, PanelEdge

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
// one bfloat16 weight row w of k values: out[r * rso] = the dot products (no bias). The weight rows
// are read front to back, each line also prefetched kBf16Ahead bytes ahead into L2 (locality 1),
// below `stop` (the end of the weight rows). On session 14's host, one line per 128 bytes 4 KiB
// ahead with the non-temporal hint lost to no prefetch (GPT-2 small's bfloat16 linears, one row:
// 1 thread 20 -> 25 GB/s, 2 threads 25 -> 30 GB/s without it); every line 16 KiB ahead into L2 wins
// (NOTE [one-row prefetch] in vec_gemm_rows.h found the same for float32): decode tok/s on this
// 300 MiB-L3 AVX-512 host, median of 3 interleaved runs, without -> with, bfloat16 GGUF files:
// GPT-2 small 69 -> 80 (1 thread), 135 -> 150 (2); SmolLM2-135M-shaped 41 -> 56, 80 -> 100.
constexpr int64_t kBf16Ahead = 16384;

template <int MR>
__attribute__((target("avx512bf16"))) inline void bd_tile(int64_t k, int64_t kp, const uint16_t* xb, const uint16_t* w,
                                                          float* out, int64_t rso, const char* stop) {
  __m512 a0[MR], a1[MR];
  for (int64_t r = 0; r < MR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
  const auto xat = [&](int r, int64_t t) {
    return (__m512bh)_mm512_loadu_si512(static_cast<const void*>(xb + r * kp + t));
  };
  int64_t t = 0;
  for (; t + 64 <= k; t += 64) {
    const char* ahead = reinterpret_cast<const char*>(w + t) + kBf16Ahead;
    if (ahead < stop) {
      __builtin_prefetch(ahead, 0, 1);
      __builtin_prefetch(ahead + 64, 0, 1);
    }
    const auto w0 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(w + t));
    const auto w1 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(w + t + 32));
    for (int64_t r = 0; r < MR; ++r) {
      a0[r] = _mm512_dpbf16_ps(a0[r], w0, xat(r, t));
      a1[r] = _mm512_dpbf16_ps(a1[r], w1, xat(r, t + 32));
    }
  }
  // the last one or two chunks (chunk t / 32 is even here: it goes into a0), the weight's missing values as +0
  for (int64_t u = 0; t < k; t += 32, ++u) {
    const int64_t left = k - t;
    const __mmask32 mask = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << left) - 1);
    const auto wc = (__m512bh)_mm512_maskz_loadu_epi16(mask, static_cast<const void*>(w + t));
    for (int64_t r = 0; r < MR; ++r) {
      if (u == 0) {
        a0[r] = _mm512_dpbf16_ps(a0[r], wc, xat(r, t));
      } else {
        a1[r] = _mm512_dpbf16_ps(a1[r], wc, xat(r, t));
      }
    }
  }
  for (int64_t r = 0; r < MR; ++r) out[r * rso] = bd_lane_tree(_mm512_add_ps(a0[r], a1[r]));
}

// c[i * rsc + j] = bfloat16 activation row i (xb + i * kp, kp = k rounded up to 32, zero-padded) . bfloat16 weight
// row j (w + j * rsw bytes, k values) (+ bias[j]) for i < m <= 16, j < n; rows in tiles of up to four share each
// weight row's loads.
__attribute__((target("avx512bf16"), flatten)) inline void bf16dot_rows(int64_t m, int64_t n, int64_t k,
                                                                        const uint16_t* xb, const uint8_t* w,
                                                                        int64_t rsw, const float* bias, float* c,
                                                                        int64_t rsc) {
  const int64_t kp = (k + 31) / 32 * 32;
  const auto* stop = reinterpret_cast<const char*>(n > 0 ? w + (n - 1) * rsw + k * 2 : w);
  for (int64_t j = 0; j < n; ++j) {
    const auto* row = reinterpret_cast<const uint16_t*>(w + j * rsw);
    tile_rows<4, 3, 2, 1>(m, [&](auto rows, int64_t i) {
      bd_tile<decltype(rows)::value>(k, kp, xb + i * kp, row, c + i * rsc + j, rsc, stop);
    });
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

// NOTE [bfloat16 GEMM]: prompts (more than 16 rows) of bf16 weights in auto mode: C = A . W^T with A's rows rounded to
// bfloat16 as for the few-row kernel, on vdpbf16ps micro-tiles of up to 12 rows x 32 columns. Each output C[i, j] is
// one float32 lane that takes the pairs of values (2p, 2p + 1) in order p = 0, 1, ..: c = c + w[2p + 1] * a[2p + 1],
// then c = c + w[2p] * a[2p] (the instruction's order and flushes, NOTE [bfloat16 dot order]), from +0; the bias is
// added after the last pair. Depth runs in blocks of kBgKC values (the sum continues through C between blocks), so a
// row's result is the same whatever the number of rows or threads; it differs from the few-row kernel's (another
// order). The weight rows are packed per depth block into 32-column panels of value pairs (panel[p * 32 + j] = pair p
// of column j), zero beyond the row's end.
constexpr int kBgMR = 12;       // micro-tile rows
constexpr int64_t kBgNR = 32;   // micro-tile columns: two vectors of 16 lanes
constexpr int64_t kBgKC = 256;  // depth block (values); a panel is kBgKC / 2 x 32 pairs = 16 KiB
static_assert(kBgKC / 2 * kBgNR == ::kael::kBf16GemmPanelWords, "vec.h's panel size");

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// Panel of weight rows j0 .. j0 + cols (rsw bytes apart, k values each) for values k0 .. k0 + kc: pairs p < (kc + 1)
// / 2.
inline void bg_pack(const uint8_t* w, int64_t rsw, int64_t k, int64_t j0, int cols, int64_t k0, int64_t kc,
                    uint32_t* panel) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t j = 0; j < kBgNR; ++j) {
    if (j >= cols) {
      for (int64_t p = 0; p < pairs; ++p) panel[p * kBgNR + j] = 0;
      continue;
    }
    const auto* row = reinterpret_cast<const uint16_t*>(w + (j0 + j) * rsw) + k0;
    const int64_t whole = std::min(pairs, (k - k0) / 2);  // pairs with both values in the row
    for (int64_t p = 0; p < whole; ++p) {
      uint32_t v;
      std::memcpy(&v, row + 2 * p, 4);
      panel[p * kBgNR + j] = v;
    }
    for (int64_t p = whole; p < pairs; ++p) panel[p * kBgNR + j] = 2 * p < k - k0 ? row[2 * p] : 0u;
  }
}

// MR rows of A (bfloat16, kp apart, from value k0: pairs read as 32-bit words) times a packed panel: the pairs
// p < pairs continue C's sums (first: from +0) for the first cols columns.
template <int MR>
__attribute__((target("avx512bf16"))) inline void bg_tile(int64_t pairs, const uint16_t* a, int64_t kp,
                                                          const uint32_t* panel, bool first, float* c, int64_t rsc,
                                                          int cols) {
  const PanelEdge edge(cols);
  __m512 acc[MR][2];
  for (int64_t r = 0; r < MR; ++r) edge.load(c + r * rsc, first, acc[r]);
  for (int64_t p = 0; p < pairs; ++p) {
    const auto b0 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(panel + p * kBgNR));
    const auto b1 = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(panel + p * kBgNR + 16));
    for (int64_t r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * kp + 2 * p, 4);
      const auto av = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b0, av);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b1, av);
    }
  }
  for (int64_t r = 0; r < MR; ++r) edge.store(c + r * rsc, acc[r]);
}

// C[i * rsc + j] = A row i . weight row j for i < m, j in [j0, j1) (NOTE [bfloat16 GEMM]; no bias): A's rows are
// bfloat16, kp (k rounded up to 32, zero-padded) apart; panel: scratch of kBgKC / 2 * kBgNR words.
__attribute__((target("avx512bf16"), flatten)) inline void bf16gemm_cols(int64_t m, int64_t j0, int64_t j1, int64_t k,
                                                                         const uint16_t* a, const uint8_t* w,
                                                                         int64_t rsw, float* c, int64_t rsc,
                                                                         uint32_t* panel) {
  const int64_t kp = (k + 31) / 32 * 32;
  for (int64_t k0 = 0; k0 < k; k0 += kBgKC) {
    const int64_t kc = std::min(kBgKC, k - k0), pairs = (kc + 1) / 2;
    for (int64_t jb = j0; jb < j1; jb += kBgNR) {
      const int cols = static_cast<int>(std::min<int64_t>(kBgNR, j1 - jb));
      bg_pack(w, rsw, k, jb, cols, k0, kc, panel);
      tile_rows<kBgMR, 4, 1>(m, [&](auto rows, int64_t i) {
        bg_tile<decltype(rows)::value>(pairs, a + i * kp + k0, kp, panel, k0 == 0, c + i * rsc + jb, rsc, cols);
      });
    }
  }
}
#endif

// NOTE [bfloat16 GEMM pays]: vdpbf16ps does two products per lane, so where it issues as often as vfmadd231ps the
// bfloat16 GEMM does twice the float32 GEMM's work a cycle (1.7-2x on GPT-2's prompts on one AVX-512 host). Some
// CPUs issue it at half that rate or less: on a 2-core Xeon with AMX (a VM), 1.9 G/s against 7.7 G/s FMAs, and
// its GEMM ran at 115 GFLOP/s against the packed float32 GEMM's 203. bf16_issue_ratio measures the two rates
// (16 independent accumulator chains each, best of 5 interleaved passes of 4096 steps, about 0.3 ms in all);
// quant.cpp's auto mode takes the bfloat16 GEMM where the ratio is at least kBf16GemmMinRatio (0.375: the GEMM
// then does at least 3/4 of the float32 GEMM's products a cycle, and reads half its weight bytes), and the
// float32-activation path otherwise. The two measured rates differ by 2x or more on the CPUs seen, so the
// choice does not flip with timing noise; KAEL_BF16_GEMM=1 / 0 fixes it either way.
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
template <bool kBf16>
__attribute__((target("avx512bf16"), noinline)) double bf16_issue_pass(int64_t steps) {
  __m512 a[16];
  for (auto& v : a) v = _mm512_setzero_ps();
  __m512 b = _mm512_set1_ps(1.0f);
  const __m512 c = _mm512_set1_ps(0.0f);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < steps; ++t) {
#pragma GCC unroll 16
    for (auto& v : a) {
      if constexpr (kBf16) {
        v = _mm512_dpbf16_ps(v, (__m512bh)_mm512_castps_si512(b), (__m512bh)_mm512_castps_si512(c));
      } else {
        v = _mm512_fmadd_ps(b, c, v);
      }
    }
    __asm__ volatile("" : "+v"(b));  // b is unknown to the compiler at every step: the loop stays
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  __m512 s = a[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, a[i]);
  volatile float sink = _mm512_reduce_add_ps(s);
  (void)sink;
  return seconds;
}

inline double bf16_issue_ratio() {
  constexpr int64_t kSteps = 4096;
  double bf = 1e30, fma = 1e30;
  for (int pass = 0; pass < 5; ++pass) {
    bf = std::min(bf, bf16_issue_pass<true>(kSteps));
    fma = std::min(fma, bf16_issue_pass<false>(kSteps));
  }
  return bf > 0 ? fma / bf : 1.0;
}
#endif

// The table's bf16_issue_ratio: with its bfloat16 GEMM, else none.
inline auto bf16_issue_kernel() -> double (*)() {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_bf16) return bf16_issue_ratio;
#endif
  return nullptr;
}

// The table's bfloat16 GEMM (bf16gemm_cols), present with bf16dot_kernel's kernel.
inline auto bf16gemm_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const uint16_t*, const uint8_t*, int64_t,
                                          float*, int64_t, uint32_t*) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_bf16) return bf16gemm_cols;
#endif
  return nullptr;
}
