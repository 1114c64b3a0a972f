// The integer GEMM of quantized_linear for prompts (NOTE [integer GEMM]): activation rows quantized to GGML's Q8_0
// blocks (as the integer path's, quant.cpp quantize_row_q8) times Q8_0 / Q4_0 / Q5_0 / IQ4_NL weight rows, on
// AVX-512 VNNI vpdpbusd micro-tiles.
//
// NOTE [integer GEMM]: for each output C[i, j] and 32-value block b: isum_b = sum of q_w * q_x in int32 (exact),
// p_b = (d_w * d_x) * float(isum_b) in float32 (one rounding for the second product, never fused), added in block
// order into one float32 sum from +0, then the bias. A row's result is the same whatever the number of rows or threads;
// it differs from the few-row integer kernels' (NOTE [integer dot order]: eight lanes by b % 8) in summation order
// only. The weight integers are stored unsigned (u = q_w + off: Q4_0 and Q5_0 their raw nibbles, off 8 and 16;
// Q8_0 and IQ4_NL's levels + 128), so vpdpbusd multiplies them with the signed q_x; the int32 sums start at
// -off * sum(q_x of the block), which makes them isum_b. The weights are packed per depth block of kIgBlocks blocks
// into panels of 32 columns: per block, 8 groups of 4 values, each a 32-column row of 4-byte words, then the 32
// columns' d_w.
//
// NOTE [integer K GEMM]: prompts of the super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8_K
// activations compute NOTE [integer K dot order] itself, so a prompt row's result is the few-row kernels' bits: per
// super-block, each 16-value group's exact int32 sum (vpdpbusd on u = q_w + 128, started at -128 * the group's bsum)
// times the group's integer scale (vpmulld) into isum_b; msum_b = sum of the mins times the bsums (vpdpwssd on
// pairs of int16); then kd_add_block's float steps lane by lane in the same order. The weights are packed per depth
// block of kIkBlocks super-blocks into 32-column panels (kd_unpack's integers).
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

#include "vec_quant_dot.h"    // qd_weight_ints, qd_opaque
#include "vec_quant_dot_k.h"  // kd_unpack, KdBlock
#include "vec_tiles.h"        // tile_rows, PanelEdge

constexpr int kIgMR = 6;       // micro-tile rows
constexpr int64_t kIgNR = 32;  // micro-tile columns: two vectors of 16 int32 / float32 lanes
constexpr int kIgBlocks = 16;  // 32-value blocks per depth block (512 values)
constexpr int64_t kIgBlockBytes = 8 * kIgNR * 4 + kIgNR * 4;  // one block of a panel: the words, then d_w
static_assert(int64_t{kIgBlocks} * kIgBlockBytes == ::kael::kInt8GemmPanelBytes, "vec.h's panel size");

// F's offset: u = q_w + off is in 0..255 (F = 0 q8_0, 1 q4_0, 5 q5_0, 7 iq4_nl).
template <int F>
constexpr int kIgOff = F == 1   ? 8
                       : F == 5 ? 16
                                : 128;

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// Panel of weight rows j0 .. j0 + cols (rsw bytes apart) for blocks b0 .. b0 + nblk; missing columns hold u = off
// and d_w = 0 (their outputs are never stored).
template <int F>
inline void ig_pack(const uint8_t* w, int64_t rsw, int64_t j0, int cols, int64_t b0, int nblk, uint8_t* panel) {
  constexpr int64_t kBytes = kQdBytes<F>;
  for (int64_t bb = 0; bb < nblk; ++bb) {
    uint8_t* pb = panel + bb * kIgBlockBytes;
    auto* dws = reinterpret_cast<float*>(pb + 8 * kIgNR * 4);
    for (int64_t j = 0; j < kIgNR; ++j) {
      alignas(4) uint8_t u[32];
      if (j < cols) {
        const uint8_t* blk = w + (j0 + j) * rsw + (b0 + bb) * kBytes;
        int8_t q[32];
        qd_weight_ints<F>(blk, q);
        for (int64_t t = 0; t < 32; ++t) u[t] = static_cast<uint8_t>(q[t] + kIgOff<F>);
        uint16_t dbits;
        std::memcpy(&dbits, blk, 2);
        dws[j] = half_to_float_s(dbits);
      } else {
        std::memset(u, kIgOff<F>, 32);
        dws[j] = 0.0f;
      }
      for (int64_t g = 0; g < 8; ++g) std::memcpy(pb + (g * kIgNR + j) * 4, u + 4 * g, 4);
    }
  }
}

// MR rows of the quantized activations (xq: k int8 apart, from block b0; xd: their scales, nb apart; xs: their
// block sums of q_x, nb apart) times a packed panel of nblk blocks: continue C's sums (first: from +0) for the first
// cols columns.
template <int F, int MR>
__attribute__((target("avx512vnni"))) inline void ig_tile(int nblk, const int8_t* xq, int64_t k, const float* xd,
                                                          const int32_t* xs, int64_t nb, const uint8_t* panel,
                                                          bool first, float* c, int64_t rsc, int cols) {
  // xd: a row's k / 32 scales, then its Q8_1 sums (unused here): 2 nb apart
  const PanelEdge edge(cols);
  __m512 acc[MR][2];
  for (int64_t r = 0; r < MR; ++r) edge.load(c + r * rsc, first, acc[r]);
  for (int64_t bb = 0; bb < nblk; ++bb) {
    const uint8_t* pb = panel + bb * kIgBlockBytes;
    __m512i isum[MR][2];
    for (int64_t r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = _mm512_set1_epi32(-kIgOff<F> * xs[r * nb + bb]);
    for (int64_t g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_loadu_si512(static_cast<const void*>(pb + g * kIgNR * 4));
      const __m512i w1 = _mm512_loadu_si512(static_cast<const void*>(pb + g * kIgNR * 4 + 64));
      for (int64_t r = 0; r < MR; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq + r * k + bb * 32 + 4 * g, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
        isum[r][0] = _mm512_dpbusd_epi32(isum[r][0], w0, xv);
        isum[r][1] = _mm512_dpbusd_epi32(isum[r][1], w1, xv);
      }
    }
    const auto* dws = reinterpret_cast<const float*>(pb + 8 * kIgNR * 4);
    const __m512 dw0 = _mm512_loadu_ps(dws), dw1 = _mm512_loadu_ps(dws + 16);
    for (int64_t r = 0; r < MR; ++r) {
      const __m512 dx = _mm512_set1_ps(xd[r * 2 * nb + bb]);
      const __m512 p0 = qd_opaque(_mm512_mul_ps(_mm512_mul_ps(dw0, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, isum[r][0])));
      const __m512 p1 = qd_opaque(_mm512_mul_ps(_mm512_mul_ps(dw1, dx), _mm512_maskz_cvtepi32_ps(0xFFFF, isum[r][1])));
      acc[r][0] = _mm512_add_ps(acc[r][0], p0);
      acc[r][1] = _mm512_add_ps(acc[r][1], p1);
    }
  }
  for (int64_t r = 0; r < MR; ++r) edge.store(c + r * rsc, acc[r]);
}

// C[i * rsc + j] = activation row i . weight row j for i < m, j0 <= j < j1 (NOTE [integer GEMM]; no bias): xq, xd
// (k / 32 scales, then k / 32 Q8_1 sums a row) and xs (k / 32 block sums a row) as quantize_row_q8 and the block sums
// give them; panel: scratch of kInt8GemmPanelBytes bytes.
template <int F>
__attribute__((target("avx512vnni"), flatten)) void int8gemm_cols(int64_t m, int64_t j0, int64_t j1, int64_t k,
                                                                  const int8_t* xq, const float* xd, const int32_t* xs,
                                                                  const uint8_t* w, int64_t rsw, float* c, int64_t rsc,
                                                                  uint8_t* panel) {
  const int64_t nb = k / 32;
  for (int64_t b0 = 0; b0 < nb; b0 += kIgBlocks) {
    const int nblk = static_cast<int>(std::min<int64_t>(kIgBlocks, nb - b0));
    for (int64_t jb = j0; jb < j1; jb += kIgNR) {
      const int cols = static_cast<int>(std::min<int64_t>(kIgNR, j1 - jb));
      ig_pack<F>(w, rsw, jb, cols, b0, nblk, panel);
      const auto tile = [&](auto rows, int64_t i) {
        ig_tile<F, decltype(rows)::value>(nblk, xq + i * k + b0 * 32, k, xd + i * 2 * nb + b0, xs + i * nb + b0, nb,
                                          panel, b0 == 0, c + i * rsc + jb, rsc, cols);
      };
      tile_rows<kIgMR, 1>(m, tile);
    }
  }
}
#endif

constexpr int kIkMR = 4;      // micro-tile rows
constexpr int kIkBlocks = 2;  // super-blocks per depth block (512 values)
// One super-block of a panel: 64 groups of 4 bytes x 32 columns, 16 scales x 32 (int32), 8 pairs of int16 mins x 32,
// then d and dmin x 32 (float32).
constexpr int64_t kIkBlockBytes = 64 * kIgNR * 4 + 16 * kIgNR * 4 + 8 * kIgNR * 4 + 2 * kIgNR * 4;
static_assert(int64_t{kIkBlocks} * kIkBlockBytes <= ::kael::kInt8GemmPanelBytes * 2, "vec.h's K panel size");
// Formats whose 16-value group sums fit in 16 bits (|q| <= 15 against Q8_K's |x| <= 127: at most 15 * 127 * 16 =
// 30480; Q5_K's, Q6_K's and IQ4_XS's do not): ik_tile scales those with one vpdpwssd against the scales stored
// zero-extended (the high half 0, so it adds nothing), where the others take vpmulld (two uops) and an add.
template <int F>
constexpr bool kIkSum16 = F == kQ2K || F == kQ3K || F == kQ4K;

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// Panel of weight rows j0 .. j0 + cols for super-blocks b0 .. b0 + nblk; missing columns hold u = 128 and zero
// scales, mins, d and dmin (their outputs are never stored).
template <int F>
inline void ik_pack(const uint8_t* w, int64_t rsw, int64_t j0, int cols, int64_t b0, int nblk, uint8_t* panel) {
  constexpr int64_t kBytes = ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F));
  for (int64_t bb = 0; bb < nblk; ++bb) {
    uint8_t* pb = panel + bb * kIkBlockBytes;
    auto* sc = reinterpret_cast<int32_t*>(pb + 64 * kIgNR * 4);
    auto* mn = reinterpret_cast<int16_t*>(pb + 80 * kIgNR * 4);
    auto* dd = reinterpret_cast<float*>(pb + 88 * kIgNR * 4);
    for (int64_t j = 0; j < kIgNR; ++j) {
      KdBlock blk;
      if (j < cols) {
        kd_unpack<F>(w + (j0 + j) * rsw + (b0 + bb) * kBytes, blk);
      } else {
        std::memset(&blk, 0, sizeof(blk));
      }
      for (int64_t g = 0; g < 64; ++g) {
        uint8_t u[4];
        for (int64_t t = 0; t < 4; ++t) u[t] = static_cast<uint8_t>(blk.q[4 * g + t] + 128);
        std::memcpy(pb + (g * kIgNR + j) * 4, u, 4);
      }
      for (int64_t g = 0; g < kKdGroups; ++g) {
        sc[g * kIgNR + j] = kIkSum16<F> ? static_cast<int32_t>(static_cast<uint16_t>(blk.sc[g])) : blk.sc[g];
      }
      for (int64_t p = 0; p < 8; ++p) {
        mn[(p * kIgNR + j) * 2] = static_cast<int16_t>(kQSuperMin<F> ? blk.mn[2 * p] : 0);
        mn[(p * kIgNR + j) * 2 + 1] = static_cast<int16_t>(kQSuperMin<F> ? blk.mn[2 * p + 1] : 0);
      }
      dd[j] = blk.d;
      dd[kIgNR + j] = blk.dmin;
    }
  }
}

// MR rows of Q8_K activations (xq: k int8 apart, from super-block b0; xd: their scales, nb apart; xs: their bsums,
// 16 nb apart) times a packed panel of nblk super-blocks: continue C's sums (first: from +0) for cols columns.
template <int F, int MR>
__attribute__((target("avx512vnni"))) inline void ik_tile(int nblk, const int8_t* xq, int64_t k, const float* xd,
                                                          const int16_t* xs, int64_t nb, const uint8_t* panel,
                                                          bool first, float* c, int64_t rsc, int cols) {
  const PanelEdge edge(cols);
  __m512 acc[MR][2];
  for (int64_t r = 0; r < MR; ++r) edge.load(c + r * rsc, first, acc[r]);
  for (int64_t bb = 0; bb < nblk; ++bb) {
    const uint8_t* pb = panel + bb * kIkBlockBytes;
    const auto* sc = reinterpret_cast<const int32_t*>(pb + 64 * kIgNR * 4);
    __m512i isum[MR][2];
    for (int64_t r = 0; r < MR; ++r) isum[r][0] = isum[r][1] = _mm512_setzero_si512();
    for (int64_t g = 0; g < kKdGroups; ++g) {
      __m512i gs[MR][2];
      for (int64_t r = 0; r < MR; ++r) gs[r][0] = gs[r][1] = _mm512_set1_epi32(-128 * xs[r * 16 * nb + bb * 16 + g]);
      for (int64_t t = 0; t < 4; ++t) {
        const uint8_t* wg = pb + (4 * g + t) * kIgNR * 4;
        const __m512i w0 = _mm512_loadu_si512(static_cast<const void*>(wg));
        const __m512i w1 = _mm512_loadu_si512(static_cast<const void*>(wg + 64));
        for (int64_t r = 0; r < MR; ++r) {
          int32_t x4;
          std::memcpy(&x4, xq + r * k + bb * kKdValues + 16 * g + 4 * t, 4);
          const __m512i xv = _mm512_set1_epi32(x4);
          gs[r][0] = _mm512_dpbusd_epi32(gs[r][0], w0, xv);
          gs[r][1] = _mm512_dpbusd_epi32(gs[r][1], w1, xv);
        }
      }
      const __m512i s0 = _mm512_loadu_si512(static_cast<const void*>(sc + g * kIgNR));
      const __m512i s1 = _mm512_loadu_si512(static_cast<const void*>(sc + g * kIgNR + 16));
      for (int64_t r = 0; r < MR; ++r) {
        if constexpr (kIkSum16<F>) {  // (gs's low half is its exact value, times the scale in the low half)
          isum[r][0] = _mm512_dpwssd_epi32(isum[r][0], gs[r][0], s0);
          isum[r][1] = _mm512_dpwssd_epi32(isum[r][1], gs[r][1], s1);
        } else {
          isum[r][0] = _mm512_add_epi32(isum[r][0], _mm512_mullo_epi32(gs[r][0], s0));
          isum[r][1] = _mm512_add_epi32(isum[r][1], _mm512_mullo_epi32(gs[r][1], s1));
        }
      }
    }
    const auto* mn = reinterpret_cast<const int32_t*>(pb + 80 * kIgNR * 4);
    const auto* dd = reinterpret_cast<const float*>(pb + 88 * kIgNR * 4);
    for (int64_t v = 0; v < 2; ++v) {
      const __m512 dw = _mm512_loadu_ps(dd + 16 * v);
      const __m512 dmw = _mm512_loadu_ps(dd + kIgNR + 16 * v);
      for (int64_t r = 0; r < MR; ++r) {
        const __m512 dx = _mm512_set1_ps(xd[r * nb + bb]);
        __m512 p =
            qd_opaque(_mm512_mul_ps(qd_opaque(_mm512_mul_ps(dw, dx)), _mm512_maskz_cvtepi32_ps(0xFFFF, isum[r][v])));
        if constexpr (kQSuperMin<F>) {
          __m512i msum = _mm512_setzero_si512();
          for (int64_t q = 0; q < 8; ++q) {
            int32_t b2;
            std::memcpy(&b2, xs + r * 16 * nb + bb * 16 + 2 * q, 4);
            const __m512i mv = _mm512_loadu_si512(static_cast<const void*>(mn + q * kIgNR + 16 * v));
            msum = _mm512_dpwssd_epi32(msum, mv, _mm512_set1_epi32(b2));
          }
          p = qd_opaque(_mm512_sub_ps(
              p, qd_opaque(_mm512_mul_ps(qd_opaque(_mm512_mul_ps(dmw, dx)), _mm512_maskz_cvtepi32_ps(0xFFFF, msum)))));
        }
        acc[r][v] = qd_opaque(_mm512_add_ps(acc[r][v], p));
      }
    }
  }
  for (int64_t r = 0; r < MR; ++r) edge.store(c + r * rsc, acc[r]);
}

// C[i * rsc + j] = Q8_K activation row i . weight row j for i < m, j0 <= j < j1 (NOTE [integer K GEMM]; no bias):
// xq, xd (k / 256 scales a row) and xs (k / 16 bsums a row) as quantize_row_q8k gives them; panel: scratch of
// kInt8GemmPanelBytes * 2 bytes.
template <int F>
__attribute__((target("avx512vnni"), flatten)) void int8kgemm_cols(int64_t m, int64_t j0, int64_t j1, int64_t k,
                                                                   const int8_t* xq, const float* xd, const int16_t* xs,
                                                                   const uint8_t* w, int64_t rsw, float* c, int64_t rsc,
                                                                   uint8_t* panel) {
  const int64_t nb = k / kKdValues;
  for (int64_t b0 = 0; b0 < nb; b0 += kIkBlocks) {
    const int nblk = static_cast<int>(std::min<int64_t>(kIkBlocks, nb - b0));
    for (int64_t jb = j0; jb < j1; jb += kIgNR) {
      const int cols = static_cast<int>(std::min<int64_t>(kIgNR, j1 - jb));
      ik_pack<F>(w, rsw, jb, cols, b0, nblk, panel);
      const auto tile = [&](auto rows, int64_t i) {
        ik_tile<F, decltype(rows)::value>(nblk, xq + i * k + b0 * kKdValues, k, xd + i * nb + b0,
                                          xs + i * 16 * nb + b0 * 16, nb, panel, b0 == 0, c + i * rsc + jb, rsc, cols);
      };
      tile_rows<kIkMR, 1>(m, tile);
    }
  }
}
#endif

// The table's integer K GEMM for super-block format F: the AVX-512 table on a CPU with AVX512_VNNI, else none.
template <int F>
auto int8kgemm_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const int8_t*, const float*, const int16_t*,
                                    const uint8_t*, int64_t, float*, int64_t, uint8_t*) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_vnni) return int8kgemm_cols<F>;
#endif
  return nullptr;
}

// The table's integer GEMM for format F (0 q8_0, 1 q4_0, 5 q5_0, 7 iq4_nl): the AVX-512 table on a CPU with
// AVX512_VNNI, else none (prompts then take the packed float GEMM).
template <int F>
auto int8gemm_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const int8_t*, const float*, const int32_t*,
                                   const uint8_t*, int64_t, float*, int64_t, uint8_t*) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_vnni) return int8gemm_cols<F>;
#endif
  return nullptr;
}
