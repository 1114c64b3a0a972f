// Weight-format rows (the dequantize and quantized_linear ops, csrc/quant.cpp): one weight row
// of a format expanded to float32, and the few-row dot products of float32 rows with weight
// rows, the weights expanded in registers. Formats, indexed by kael::QuantScheme (kernels.h):
// 0 q8_0 (34-byte blocks: float16 d, 32 int8 q; value d*q), 1 q4_0 (18-byte blocks: float16 d,
// 16 bytes; value i < 16 = d*((q[i] & 15) - 8), i + 16 = d*((q[i] >> 4) - 8)), 2 bfloat16,
// 3 float16, 4 q4_1 (20-byte blocks: float16 d, float16 m, 16 nibble bytes as q4_0's; value
// d*q + m), 5 q5_0 (22-byte blocks: float16 d, 4 bytes qh (uint32 little-endian: bit i the fifth
// bit of value i), 16 nibble bytes as q4_0's; value d*(q - 16)), 6 q5_1 (24-byte blocks: d, m,
// qh, nibbles; value d*q + m), 7 iq4_nl (18-byte blocks: float16 d, 16 nibble bytes as q4_0's;
// value d*kIq4nlValues[q]); 8..13 q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs: 256-value
// super-blocks, read 32 values at a time (vec_quant_k.h). A block value d*q is exact in
// float32 (11 + 8 significant bits), so a dequantized weight equals the reference's bit for
// bit (d*q + m: one rounding of an exact product, the same with or without a fused
// multiply-add).
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"

// clang-format off
typedef uint8_t vqu8 __attribute__((vector_size(KAEL_VBYTES / 4)));   // NOLINT(modernize-use-using): L uint8
typedef uint16_t vqu16 __attribute__((vector_size(KAEL_VBYTES / 2)));  // NOLINT(modernize-use-using): L uint16
typedef uint32_t vqu32 __attribute__((vector_size(KAEL_VBYTES)));      // NOLINT(modernize-use-using): L uint32
// clang-format on

// How far ahead the few-row dot products prefetch a weight row's bytes (measured on GPT-2 small
// decode, 1 thread: 4 KiB makes Q8_0/Q4_0/bfloat16 about 20% faster than the hardware
// prefetchers alone; 1-2 KiB helps less).
constexpr int64_t kQPrefetch = 4096;
constexpr int64_t kQBlock = 32;  // values per block (and per step of the dot loops)
// Bytes of a row holding one block of 32 values in format F (F = kQF32: float32, a dequantized row).
constexpr int kQF32 = 100;  // F of a float32 row (a row dequantized already)
// F is bfloat16 / float16 (values, no blocks; a row may end in a partial block).
template <int F>
constexpr bool kQ16 = F == 2 || F == 3;
// (A 256-value super-block format's share of its block: where the dot products prefetch.)
template <int F>
constexpr int64_t kQBlockBytes = F == kQF32 ? 128
                                 : kQ16<F>  ? 64
                                            : ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F)) * kQBlock /
                                                 ::kael::quant_block_values(static_cast<::kael::QuantScheme>(F));
// F's blocks are d * integer (q8_0, q4_0): the dot products scale a block's sum once.
template <int F>
constexpr bool kQScaled = F == 0 || F == 1;
// The F numbers this file's formats use are QuantScheme's (quant_formats.h).
static_assert(static_cast<int>(::kael::QuantScheme::Q4_0) == 1 && static_cast<int>(::kael::QuantScheme::F16) == 3 &&
                  static_cast<int>(::kael::QuantScheme::Q4_1) == 4 &&
                  static_cast<int>(::kael::QuantScheme::Q5_1) == 6 &&
                  static_cast<int>(::kael::QuantScheme::IQ4_NL) == 7 &&
                  static_cast<int>(::kael::QuantScheme::Q2_K) == 8,
              "vec_quant.h's format numbers");
constexpr int kQVecs = int{kQBlock / V<float>::L};  // float vectors per block

// float16 bits -> float32, exact for every value (subnormals, inf, nan) without F16C: the
// normal range is a shift and one exact power-of-two multiply, subnormals come out of a
// magic-number subtraction.
inline vf half_to_float_v(vqu16 h) {
  const vqu32 w = __builtin_convertvector(h, vqu32) << 16;
  const vqu32 sign = w & 0x80000000u;
  const vqu32 two_w = w + w;
  const vf normal = bitcast<vf>((two_w >> 4) + (0xE0u << 23)) * splat(0x1.0p-112f);
  const vf subnormal = bitcast<vf>((two_w >> 17) | (126u << 23)) - splat(0.5f);
  const auto is_sub = bitcast<vqu32>(two_w < (1u << 27));  // lanes all ones / zero
  return bitcast<vf>(sign | (is_sub & bitcast<vqu32>(subnormal)) | (~is_sub & bitcast<vqu32>(normal)));
}

inline float half_to_float_s(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normal = bitcast<float>((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = bitcast<float>((two_w >> 17) | (126u << 23)) - 0.5f;
  return bitcast<float>(sign | (two_w < (1u << 27) ? bitcast<uint32_t>(subnormal) : bitcast<uint32_t>(normal)));
#endif
}

inline vf bf16_to_float_v(vqu16 h) {
  return bitcast<vf>(__builtin_convertvector(h, vqu32) << 16);
}

// L 16-bit floats at p (F = 2 bfloat16, 3 float16) as float32.
template <int F>
inline vf load_16bit(const uint8_t* p) {
  vqu16 h;
  std::memcpy(&h, p, sizeof(h));
  if constexpr (F == 2) {
    return bf16_to_float_v(h);
  } else {
#if defined(__F16C__) && KAEL_VBYTES == 32
    return bitcast<vf>(_mm256_cvtph_ps(bitcast<__m128i>(h)));
#elif defined(__AVX512F__) && KAEL_VBYTES == 64
    return bitcast<vf>(_mm512_maskz_cvtph_ps(0xFFFF, bitcast<__m256i>(h)));  // (maskz: no -Wmaybe-uninitialized)
#else
    return half_to_float_v(h);
#endif
  }
}

template <int F>
inline float scalar_16bit(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return F == 2 ? bitcast<float>(static_cast<uint32_t>(h) << 16) : half_to_float_s(h);
}

// L values of a row of 16-bit floats (F = 2, 3) or of float32 (F = kQF32, a row dequantized already) from value t.
template <int F>
inline vf load_values(const uint8_t* row, int64_t t) {
  if constexpr (F == kQF32) {
    return load(reinterpret_cast<const float*>(row) + t);
  } else {
    return load_16bit<F>(row + t * 2);
  }
}
template <int F>
inline float scalar_value(const uint8_t* row, int64_t t) {
  if constexpr (F == kQF32) {
    return reinterpret_cast<const float*>(row)[t];
  } else {
    return scalar_16bit<F>(row + t * 2);
  }
}

#include "vec_quant_ints.h"  // the integers of the 32-value blocks (q8_values, q4_values, q451_values)

// The 32 products of a block with x[0..32), summed pairwise into one vector.
inline vf block_dot(const vf (&w)[kQVecs], const float* x) {
  constexpr int64_t L = V<float>::L;
  vf p[kQVecs];
  for (int v = 0; v < kQVecs; ++v) p[v] = w[v] * load(x + v * L);
  for (int s = kQVecs / 2; s >= 1; s /= 2) {
    for (int v = 0; v < s; ++v) p[v] = p[v] + p[v + s];
  }
  return p[0];
}

#include "vec_quant_k.h"  // the 256-value super-blocks (kq_dequant_row, kq_qdot_wrows): they use the above

// The 32 values of block b of a weight row, in kQVecs vectors (F = kQF32: a float32 row).
template <int F>
inline void load_block(const uint8_t* row, int64_t b, vf (&w)[kQVecs]) {
  constexpr int64_t L = V<float>::L;
  if constexpr (F == 0) {  // q8_0
    const uint8_t* blk = row + b * kQBlockBytes<0>;
    uint16_t dbits;
    std::memcpy(&dbits, blk, 2);
    const vf d = splat(half_to_float_s(dbits));
    vi q[kQVecs];
    q8_values(blk + 2, q);
    for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf) * d;
  } else if constexpr (F == 1) {  // q4_0: the low nibbles are values 0..15, the high ones 16..31
    const uint8_t* blk = row + b * kQBlockBytes<1>;
    uint16_t dbits;
    std::memcpy(&dbits, blk, 2);
    const vf d = splat(half_to_float_s(dbits));
    vi q[kQVecs];
    q4_values(blk + 2, q);
    for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf) * d;
  } else if constexpr (F >= 4 && F <= 7) {  // q4_1, q5_0, q5_1, iq4_nl: d*q (+ m)
    const uint8_t* blk = row + b * kQBlockBytes<F>;
    uint16_t dbits;
    std::memcpy(&dbits, blk, 2);
    const vf d = splat(half_to_float_s(dbits));
    vi q[kQVecs];
    q451_values<F>(blk, q);
    if constexpr (F == 5 || F == 7) {
      for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf) * d;
    } else {
      uint16_t mbits;
      std::memcpy(&mbits, blk + 2, 2);
      const vf mv = splat(half_to_float_s(mbits));
      for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf) * d + mv;
    }
  } else {  // bfloat16, float16, float32
    static_assert(kQ16<F> || F == kQF32, "a format without a block loader");
    for (int v = 0; v < kQVecs; ++v) w[v] = load_values<F>(row, b * kQBlock + v * L);
  }
}

// Block b of a Q8_0 (F = 0) or Q4_0 (F = 1) row as its integers in float32 (q8_0: q; q4_0:
// q - 8; exact) and its scale d, returned: value i = d * w[i]. The dot products scale a block's
// sum once instead of every value (two multiplies fewer a block).
template <int F>
inline float load_block_q(const uint8_t* row, int64_t b, vf (&w)[kQVecs]) {
  static_assert(kQScaled<F>, "q8_0 / q4_0 only");
  const uint8_t* blk = row + b * kQBlockBytes<F>;
  uint16_t dbits;
  std::memcpy(&dbits, blk, 2);
  if constexpr (F == 0) {
    vi q[kQVecs];
    q8_values(blk + 2, q);
    for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf);
  } else {
    vi q[kQVecs];
    q4_values(blk + 2, q);
    for (int v = 0; v < kQVecs; ++v) w[v] = __builtin_convertvector(q[v], vf);
  }
  return half_to_float_s(dbits);
}

// Row `row` for the few-row dot products' scratch: a block format's integers in float32 into
// out[0..k) and its k / 32 block scales into scales; a 16-bit row dequantized (scales unused).
template <int F>
void expand_row(float* out, float* scales, const uint8_t* row, int64_t k);

// out[0..k) = weight row `row` as float32 (k % 32 == 0 for the block formats).
template <int F>
void dequant_row(float* out, const uint8_t* row, int64_t k) {
  if constexpr (kQSuper<F>) {  // q2_k .. q6_k, iq4_xs
    kq_dequant_row<F>(out, row, k);
  } else {
    constexpr int64_t L = V<float>::L;
    const int64_t nb = k / kQBlock;
    for (int64_t b = 0; b < nb; ++b) {
      vf w[kQVecs];
      load_block<F>(row, b, w);
      for (int v = 0; v < kQVecs; ++v) store(out + b * kQBlock + v * L, w[v]);
    }
    if constexpr (kQ16<F>) {
      int64_t t = nb * kQBlock;
      for (; t + L <= k; t += L) store(out + t, load_16bit<F>(row + t * 2));
      for (; t < k; ++t) out[t] = scalar_16bit<F>(row + t * 2);
    }
  }
}

template <int F>
void expand_row(float* out, float* scales, const uint8_t* row, int64_t k) {
  if constexpr (kQScaled<F>) {
    constexpr int64_t L = V<float>::L;
    for (int64_t b = 0; b < k / kQBlock; ++b) {
      __builtin_prefetch(row + b * kQBlockBytes<F> + kQPrefetch, 0, 0);  // as in qdot_wrows
      vf w[kQVecs];
      scales[b] = load_block_q<F>(row, b, w);
      for (int v = 0; v < kQVecs; ++v) store(out + b * kQBlock + v * L, w[v]);
    }
  } else {
    (void)scales;
    const int64_t bytes = kQ16<F> ? 2 * k : k / kQBlock * kQBlockBytes<F>;  // (about, for the super-blocks)
    for (int64_t t = 0; t < bytes; t += 64) __builtin_prefetch(row + t + kQPrefetch, 0, 0);
    dequant_row<F>(out, row, k);
  }
}

// c[j * csc] = dot(a, weight row j) (+ bias[j]) for NB weight rows (rsw bytes apart) and one
// row of a: NB streams from memory at once, NB independent accumulators. Each dot product sums
// in one fixed order (32-value block sums, times the block's scale for Q8_0/Q4_0, added into one
// vector accumulator, its lanes, the tail of a 16-bit row, then the bias), whatever NB is.
template <int F, int NB>
inline void qdot_wrows(int64_t k, const float* a, const uint8_t* w, int64_t rsw, const float* bias, float* c,
                       int64_t csc) {
  constexpr int64_t L = V<float>::L;
  vf acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = vf{};
  const int64_t nb = k / kQBlock;
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; j < NB; ++j) {
      // the rows stream from memory: ask for what comes kQPrefetch bytes on (a hint: past the row is
      // harmless). float16 rows go faster without (and eight at a time, qdot_rows).
      if constexpr (F != 3) __builtin_prefetch(w + j * rsw + b * kQBlockBytes<F> + kQPrefetch, 0, 0);
      vf wv[kQVecs];
      if constexpr (kQScaled<F>) {
        const float d = load_block_q<F>(w + j * rsw, b, wv);
        acc[j] += splat(d) * block_dot(wv, a + b * kQBlock);
      } else {
        load_block<F>(w + j * rsw, b, wv);
        acc[j] += block_dot(wv, a + b * kQBlock);
      }
    }
  }
  int64_t kv = nb * kQBlock;
  if constexpr (kQ16<F>) {
    for (; kv + L <= k; kv += L) {
      const vf xv = load(a + kv);
      for (int j = 0; j < NB; ++j) acc[j] += load_values<F>(w + j * rsw, kv) * xv;
    }
  }
  for (int j = 0; j < NB; ++j) {
    float s = hsum<float>(acc[j]);
    if constexpr (kQ16<F>) {
      for (int64_t t = kv; t < k; ++t) {
#if defined(__FMA__)
        s = __builtin_fmaf(scalar_value<F>(w + j * rsw, t), a[t], s);
#else
        s += scalar_value<F>(w + j * rsw, t) * a[t];
#endif
      }
    }
    if (bias != nullptr) s += bias[j];
    c[j * csc] = s;
  }
}

// MB rows of a against NB weight rows expanded into qdot_rows' scratch (k floats apart; for a
// block format their integers, with k / 32 scales a row in `scales`, else null): an MB x NB tile,
// each x vector loaded once for the NB rows. Every dot product is the same operations on the
// same values as qdot_wrows' (products w * x, the block's pairwise tree, its scale, the
// accumulator, the lanes, the tail, the bias), so the results are its bits.
template <int MB, int NB, bool SCALED>
inline void qdot_tile(int64_t k, const float* a, int64_t rsa, const float* w, const float* scales, const float* bias,
                      float* c, int64_t rsc) {
  constexpr int64_t L = V<float>::L;
  vf acc[MB][NB];
  for (auto& r : acc) {
    for (auto& v : r) v = vf{};
  }
  const int64_t nb = k / kQBlock;
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < MB; ++i) {
      vf xv[kQVecs];
      for (int v = 0; v < kQVecs; ++v) xv[v] = load(a + i * rsa + b * kQBlock + v * L);
      for (int j = 0; j < NB; ++j) {
        vf p[kQVecs];
        for (int v = 0; v < kQVecs; ++v) p[v] = load(w + j * k + b * kQBlock + v * L) * xv[v];
        for (int s = kQVecs / 2; s >= 1; s /= 2) {
          for (int v = 0; v < s; ++v) p[v] = p[v] + p[v + s];
        }
        if constexpr (SCALED) {  // a block format: w holds integers, scaled per block
          acc[i][j] += splat(scales[j * nb + b]) * p[0];
        } else {
          acc[i][j] += p[0];
        }
      }
    }
  }
  int64_t kv = nb * kQBlock;
  for (; kv + L <= k; kv += L) {
    for (int i = 0; i < MB; ++i) {
      for (int j = 0; j < NB; ++j) acc[i][j] += load(w + j * k + kv) * load(a + i * rsa + kv);
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      float s = hsum<float>(acc[i][j]);
      for (int64_t t = kv; t < k; ++t) {
#if defined(__FMA__)
        s = __builtin_fmaf(w[j * k + t], a[i * rsa + t], s);
#else
        s += w[j * k + t] * a[i * rsa + t];
#endif
      }
      if (bias != nullptr) s += bias[j];
      c[i * rsc + j] = s;
    }
  }
}

// All m rows against NB float32 weight rows: tiles of four rows, then the rest.
template <int NB, bool SCALED>
inline void qdot_tiles(int64_t m, int64_t k, const float* a, int64_t rsa, const float* w, const float* scales,
                       const float* bias, float* c, int64_t rsc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) qdot_tile<4, NB, SCALED>(k, a + i * rsa, rsa, w, scales, bias, c + i * rsc, rsc);
  switch (m - i) {
    case 3:
      qdot_tile<3, NB, SCALED>(k, a + i * rsa, rsa, w, scales, bias, c + i * rsc, rsc);
      break;
    case 2:
      qdot_tile<2, NB, SCALED>(k, a + i * rsa, rsa, w, scales, bias, c + i * rsc, rsc);
      break;
    case 1:
      qdot_tile<1, NB, SCALED>(k, a + i * rsa, rsa, w, scales, bias, c + i * rsc, rsc);
      break;
    default:
      break;
  }
}

// Weight rows expanded at a time by qdot_rows for several rows of a (its scratch: kQRows * k
// floats, then kQRows * k / 32 block scales).
constexpr int64_t kQRows = 3;

// Few rows: c[i * rsc + j] = dot(a row i, weight row j) (+ bias[j]), i < m, j < n; weight row j
// at w + j * rsw bytes. One row of a: the weights are expanded in registers as they stream by.
// More: each weight row is expanded once into `row` (kQRows * (k + k / 32) floats of scratch,
// kQRows rows at a time) and read from there (L1/L2) by tiles of four rows of a x kQRows weight rows. The
// values and the operations on them are the same either way, so a row of c is the same bits
// whatever m is.
template <int F>
void qdot_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, const uint8_t* w, int64_t rsw,
               const float* bias, float* c, int64_t rsc, float* row) {
  if (m == 1) {
    // weight rows at a time (measured on GPT-2 small decode, 1 thread: more streams than two slow
    // the prefetched formats down; float16, unprefetched, gains from eight)
    constexpr int64_t kW = F == 3 ? 8 : 2;
    int64_t j = 0;
    if constexpr (kQSuper<F>) {  // q2_k .. q6_k, iq4_xs: the scales decoded once a super-block
      // (four rows at a time on AVX-512: about 7% faster than two on GPT-2's c_fc; AVX2's 16
      // registers do better with two)
      constexpr int64_t kWK = KAEL_VBYTES == 64 ? 4 : 2;
      for (; j + kWK <= n; j += kWK)
        kq_qdot_wrows<F, kWK>(k, a, w + j * rsw, rsw, bias == nullptr ? nullptr : bias + j, c + j, 1);
      for (; j < n; ++j) kq_qdot_wrows<F, 1>(k, a, w + j * rsw, rsw, bias == nullptr ? nullptr : bias + j, c + j, 1);
    } else {
      for (; j + kW <= n; j += kW)
        qdot_wrows<F, kW>(k, a, w + j * rsw, rsw, bias == nullptr ? nullptr : bias + j, c + j, 1);
      for (; j < n; ++j) qdot_wrows<F, 1>(k, a, w + j * rsw, rsw, bias == nullptr ? nullptr : bias + j, c + j, 1);
    }
    return;
  }
  for (int64_t j = 0; j < n; j += kQRows) {
    const int64_t cnt = n - j < kQRows ? n - j : kQRows;
    float* scales = row + kQRows * k;  // kQRows * k / 32 of them (block formats)
    for (int64_t r = 0; r < cnt; ++r) expand_row<F>(row + r * k, scales + r * (k / kQBlock), w + (j + r) * rsw, k);
    const float* sj = kQScaled<F> ? scales : nullptr;
    const float* bj = bias == nullptr ? nullptr : bias + j;
    if (cnt == 3) {
      qdot_tiles<3, kQScaled<F>>(m, k, a, rsa, row, sj, bj, c + j, rsc);
    } else if (cnt == 2) {
      qdot_tiles<2, kQScaled<F>>(m, k, a, rsa, row, sj, bj, c + j, rsc);
    } else {
      qdot_tiles<1, kQScaled<F>>(m, k, a, rsa, row, sj, bj, c + j, rsc);
    }
  }
}
