// The integer path of quantized_linear (NOTE [integer quantized linear] in quant.cpp): dot
// products of activation rows quantized to GGML's Q8_0 blocks (int8 q, float32 scale d_x: the
// float16 scale GGML stores, widened; for Q4_1 / Q5_1 weights also Q8_1's sum s_x) with Q8_0 /
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL weight rows, as llama.cpp pairs them.
//
// NOTE [integer dot order] (Q8_0, Q4_0, Q5_0, IQ4_NL; Q4_1 and Q5_1, whose values are d_w * q + m_w, follow
// ggml's own order instead, NOTE [ggml q8_1 dot order] in vec_quant_dot_q81.h): for each 32-value block b,
// isum_b = sum of q_w * q_x in int32 (exact: |isum| <= 32 * 128 * 127); its product
// p_b = (d_w * d_x) * float(isum_b) in float32 (d_w * d_x is exact: two 11-bit significands; one rounding
// for the second product, never fused into the add). p_b is added into lane b % 8 of eight float32 accumulators
// starting at +0, blocks in order (blocks past the row's end, up to a multiple of 8, add +0); then
// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the bias. Every table computes exactly
// this, so results are the same bits on every ISA, thread count and number of rows: the int32
// sums are exact, so how a kernel gets them is free (the portable qd_rows_plain unpacks each
// block's integers; the vector tables' qd_rows_avx2, NOTE [integer dot in vectors] in
// vec_quant_dot_simd.h, multiplies unsigned weight bytes by a per-call copy of the activations
// and folds the offset back in), while the float steps keep this order.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but vec_quant_dot_simd.h's and
// vec_quant_dot_q81.h's.
#pragma once

// v, opaque to the optimiser: keeps a product from being fused with the add that follows
// (-ffp-contract=fast would make it an FMA on the AVX tables and not on the baseline).
template <class T>
inline T qd_opaque(T v) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(v));
#elif defined(__aarch64__)
  __asm__("" : "+w"(v));
#else
  __asm__("" : "+m"(v));
#endif
  return v;
}

constexpr int kQdLanes = 8;  // accumulator lanes (blocks b, b + 8, .. share lane b % 8)

// Bytes of a block of the formats: 0 q8_0, 1 q4_0, 4 q4_1, 5 q5_0, 6 q5_1, 7 iq4_nl.
template <int F>
constexpr int64_t kQdBytes = F == 0   ? 34
                             : F == 4 ? 20
                             : F == 5 ? 22
                             : F == 6 ? 24
                                      : 18;
// F's values are d * q + m (q4_1, q5_1: unsigned q), with Q8_1 activations: a block's dot product is
// d_w * d_x * isum + m_w * s_x, s_x = d_x * sum(q_x) (Q8_1's s).
template <int F>
constexpr bool kQdMin = F == 4 || F == 6;

// The 32 integers of weight block blk into q: F = 0 q8_0's int8; 1 q4_0's nibbles - 8; 4 q4_1's
// nibbles; 5 q5_0's nibbles with bit j of qh as bit 4 of value j, - 16; 6 q5_1's likewise without
// the - 16; 7 iq4_nl's levels of the nibbles
// (low nibbles are values 0..15, high ones 16..31).
template <int F>
inline void qd_weight_ints(const uint8_t* blk, int8_t (&q)[32]) {
  if constexpr (F == 0) {
    std::memcpy(q, blk + 2, 32);
  } else if constexpr (F == 4) {
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>(blk[4 + j] & 15);
      q[j + 16] = static_cast<int8_t>(blk[4 + j] >> 4);
    }
  } else if constexpr (F == 5 || F == 6) {
    constexpr int kH = F == 5 ? 2 : 4, kS = kH + 4, kOff = F == 5 ? 16 : 0;
    uint32_t qh;
    std::memcpy(&qh, blk + kH, 4);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>(static_cast<int>((blk[kS + j] & 15u) | (((qh >> j) & 1u) << 4)) - kOff);
      q[j + 16] = static_cast<int8_t>(static_cast<int>((blk[kS + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - kOff);
    }
  } else if constexpr (F == 7) {
    for (int j = 0; j < 16; ++j) {
      q[j] = kIq4nlValues[blk[2 + j] & 15];
      q[j + 16] = kIq4nlValues[blk[2 + j] >> 4];
    }
  } else {
    static_assert(F == 1, "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl");
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<int8_t>((blk[2 + j] & 15) - 8);
      q[j + 16] = static_cast<int8_t>((blk[2 + j] >> 4) - 8);
    }
  }
}

// The lanes' sum in NOTE [integer dot order]'s order.
inline float qd_lane_sum(const float (&a)[kQdLanes]) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

// The portable kernel of NOTE [integer dot order] (not q4_1 / q5_1: qg_rows_plain): MR <= 16 activation
// rows (xq: k int8 apart; xd: nb scales apart) against one weight row w, out[r * rso] = the dot products (no bias);
// each block's integers are unpacked once for the rows.
template <int F>
inline void qd_rows_plain(int64_t mr, int64_t nb, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                          float* out, int64_t rso) {
  constexpr int64_t kBytes = kQdBytes<F>;
  float acc[16][kQdLanes] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    int8_t q[32];
    qd_weight_ints<F>(blk, q);
    uint16_t dbits;
    std::memcpy(&dbits, blk, 2);
    const float dw = half_to_float_s(dbits);
    for (int64_t r = 0; r < mr; ++r) {
      const int8_t* x = xq + r * k + b * 32;
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) isum += int32_t{q[j]} * int32_t{x[j]};
      acc[r][b % kQdLanes] += qd_opaque((dw * xd[r * 2 * nb + b]) * static_cast<float>(isum));
    }
  }
  for (int64_t r = 0; r < mr; ++r) out[r * rso] = qd_lane_sum(acc[r]);
}

// The last m % 4 < 4 activation rows of a weight row: tile(std::integral_constant<int, MR>{}) for MR = their count.
template <class Tile>
inline void qd_rest_rows(int64_t rest, Tile&& tile) {
  switch (rest) {
    case 3:
      tile(std::integral_constant<int, 3>{});
      break;
    case 2:
      tile(std::integral_constant<int, 2>{});
      break;
    case 1:
      tile(std::integral_constant<int, 1>{});
      break;
    default:
      break;
  }
}

// c[i * rsc + j] += bias[j] for i < m, j < n (nothing when bias is null).
inline void qd_add_bias(int64_t m, int64_t n, const float* bias, float* c, int64_t rsc) {
  if (bias == nullptr) return;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * rsc + j] += bias[j];
  }
}

#include "vec_quant_dot_q81.h"   // Q4_1 / Q5_1 in ggml's order (qg_rows_plain, qg_rows_avx2)
#include "vec_quant_dot_simd.h"  // the AVX2 / VNNI kernels (qd_rows_avx2)

// c[i * rsc + j] = activation row i . weight row j (+ bias[j]) for i < m, j < n: activation row i
// is xq + i * k int8 with its k / 32 scales d at xd + i * 2 * (k / 32), then its k / 32 sums s
// (Q8_1's d_x * sum q_x, float16-rounded); weight row j at w + j * rsw bytes. Each weight row is
// read from memory once for the m rows. DOT: QdMadd / QdVnni (the vector tables: qd_rows_avx2,
// NOTE [integer dot in vectors]), void: the portable loop.
template <int F, class DOT>
inline void q8dot_rows(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                       int64_t rsw, const float* bias, float* c, int64_t rsc) {
  if constexpr (std::is_void_v<DOT>) {
    const int64_t nb = k / 32;
    for (int64_t j = 0; j < n; ++j) {
      if constexpr (kQdGgml<F>) {
        qg_rows_plain<F>(m, nb, k, xq, xd, w + j * rsw, c + j, rsc);
      } else {
        qd_rows_plain<F>(m, nb, k, xq, xd, w + j * rsw, c + j, rsc);
      }
      if (bias != nullptr) {
        for (int64_t i = 0; i < m; ++i) c[i * rsc + j] += bias[j];
      }
    }
  } else {
#if defined(__AVX2__)
    if constexpr (kQdGgml<F>) {
      qg_rows_avx2<F, DOT>(m, n, k, xq, xd, w, rsw, bias, c, rsc);
    } else {
      qd_rows_avx2<F, DOT>(m, n, k, xq, xd, w, rsw, bias, c, rsc);
    }
#endif
  }
}

template <int F, class DOT>
void q8dot_rows_fn(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w, int64_t rsw,
                   const float* bias, float* c, int64_t rsc) {
  q8dot_rows<F, DOT>(m, n, k, xq, xd, w, rsw, bias, c, rsc);
}

#if defined(__AVX2__) && KAEL_VBYTES == 64 && defined(__AVX512F__)
// The VNNI entry: compiled for avx512vnni, everything inlined into it (flatten), so vpdpbusd
// only runs when the table maker saw the CPU has it.
template <int F>
__attribute__((target("avx512vnni"), flatten)) void q8dot_rows_vnni(int64_t m, int64_t n, int64_t k, const int8_t* xq,
                                                                    const float* xd, const uint8_t* w, int64_t rsw,
                                                                    const float* bias, float* c, int64_t rsc) {
  q8dot_rows<F, QdVnni>(m, n, k, xq, xd, w, rsw, bias, c, rsc);
}
#endif

// The table's integer kernel for format F (0 q8_0, 1 q4_0, 4 q4_1, 5 q5_0, 6 q5_1, 7 iq4_nl):
// VNNI where this table and the CPU have it, else AVX2's maddubs, else the portable loop.
template <int F>
auto q8dot_kernel() -> void (*)(int64_t, int64_t, int64_t, const int8_t*, const float*, const uint8_t*, int64_t,
                                const float*, float*, int64_t) {
#if defined(__AVX2__)
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_vnni) return q8dot_rows_vnni<F>;
#endif
  return q8dot_rows_fn<F, QdMadd>;
#else
  return q8dot_rows_fn<F, void>;
#endif
}
