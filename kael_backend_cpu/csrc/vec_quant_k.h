// The 256-value super-blocks of GGML's K-quants and IQ4_XS (quant_formats.h rows Q2_K..IQ4_XS),
// one 32-value chunk at a time, for vec_quant.h's load_block: chunk c (0..7) of a super-block
// is values 32c..32c+31, decoded as 32 integers q and, per 16 values, a scale s and an offset m
// (value = s * q - m, m = 0 but for q2_k, q4_k, q5_k). Byte layouts and arithmetic are GGML's
// (ggml-common.h, dequantize_row_*): d, dmin are float16, QK_K = 256.
// * q2_k (84 bytes): scales[16] (low nibble scale, high nibble min, one per 16 values), qs[64]
//   (2 bits a value), d, dmin. Chunk c = 4h + j: q = (qs[32h + l] >> 2j) & 3, scale byte 2c + l/16;
//   s = d * (sc & 15), m = dmin * (sc >> 4).
// * q3_k (110 bytes): hmask[32], qs[64], scales[12] (16 six-bit scales), d. Chunk c = 4h + j:
//   q = ((qs[32h + l] >> 2j) & 3) - (bit c of hmask[l] ? 0 : 4); s = d * (scale[2c + l/16] - 32).
// * q4_k (144 bytes): d, dmin, scales[12] (8 six-bit scales and mins), qs[128]. Chunk c: the low
//   (c even) or high nibbles of qs[32 (c/2) + l]; s = d * scale c, m = dmin * min c.
// * q5_k (176 bytes): d, dmin, scales[12], qh[32], qs[128]: q4_k's nibble plus bit c of qh[l] as 16.
// * q6_k (210 bytes): ql[128], qh[64], int8 scales[16], d. Chunk c = 4h + t: the low (t < 2) or
//   high nibble of ql[64h + 32 (t & 1) + l], bits 2t, 2t+1 of qh[32h + l] as bits 4, 5, less 32;
//   s = d * scales[8h + 2t + l/16].
// * iq4_xs (136 bytes): d, scales_h (uint16), scales_l[4], qs[128]. Chunk c: IQ4_NL's levels of the
//   16 bytes qs[16c..] (low nibbles values 0..15, high 16..31); s = d * (six-bit scale c - 32),
//   its low nibble from scales_l[c/2], its high bits 2c, 2c+1 of scales_h.
// Every d * sc and s * q is exact in float32 (at most 11 + 8 + 6 significant bits, < 2^24) and
// m = dmin * min too, so a value is one rounding of s * q - m with or without a fused
// multiply-add: bit-exact with GGML's reference and gguf.quants.
// Pasted inside the per-ISA namespace by vec_table.h through vec_quant.h: no includes.
#pragma once

constexpr int kQ2K = static_cast<int>(::kael::QuantScheme::Q2_K);
constexpr int kQ3K = static_cast<int>(::kael::QuantScheme::Q3_K);
constexpr int kQ4K = static_cast<int>(::kael::QuantScheme::Q4_K);
constexpr int kQ5K = static_cast<int>(::kael::QuantScheme::Q5_K);
constexpr int kQ6K = static_cast<int>(::kael::QuantScheme::Q6_K);
constexpr int kIQ4XS = static_cast<int>(::kael::QuantScheme::IQ4_XS);
// F is a 256-value super-block format; and one whose values have an offset m.
template <int F>
constexpr bool kQSuper = F == kQ2K || F == kQ3K || F == kQ4K || F == kQ5K || F == kQ6K || F == kIQ4XS;
template <int F>
constexpr bool kQSuperMin = F == kQ2K || F == kQ4K || F == kQ5K;
constexpr int64_t kQSuperChunks = 8;  // 32-value chunks a super-block

inline float kq_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float_s(h);
}

// q4_k / q5_k: scale and min j (0..7) of the 12 packed bytes at q (GGML's get_scale_min_k4).
inline void kq_scale_min_k4(int64_t j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// q3_k: six-bit scale i (0..15) of the 12 packed bytes at q: its low nibble from byte i % 8
// (low nibble for i < 8, high for i >= 8), its high two bits from byte 8 + i % 4, bits 2 (i / 4).
inline int kq_scale_q3(int64_t i, const uint8_t* q) {
  const int lo = i < 8 ? q[i] & 15 : q[i - 8] >> 4;
  return lo | (((q[8 + i % 4] >> (2 * (i / 4))) & 3) << 4);
}

// Chunk c of the super-block at sb in format F: q[0..32), and per 16 values s[0..2), m[0..2)
// (value l = s[l / 16] * q[l] - m[l / 16]; m untouched for the formats without an offset).
template <int F>
inline void kq_chunk(const uint8_t* sb, int64_t c, int32_t (&q)[kQBlock], float (&s)[2], float (&m)[2]) {
  if constexpr (F == kQ2K) {
    const uint8_t* qs = sb + 16 + 32 * (c / 4);
    const int64_t sh = 2 * (c % 4);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> sh) & 3;
    const float d = kq_half(sb + 80), dmin = kq_half(sb + 82);
    for (int i = 0; i < 2; ++i) {
      const int sc = sb[2 * c + i];
      s[i] = d * static_cast<float>(sc & 15);
      m[i] = dmin * static_cast<float>(sc >> 4);
    }
  } else if constexpr (F == kQ3K) {
    const uint8_t* qs = sb + 32 + 32 * (c / 4);
    const int64_t sh = 2 * (c % 4);
    for (int l = 0; l < 32; ++l) q[l] = ((qs[l] >> sh) & 3) - (((sb[l] >> c) & 1) != 0 ? 0 : 4);
    const float d = kq_half(sb + 108);
    for (int i = 0; i < 2; ++i) s[i] = d * static_cast<float>(kq_scale_q3(2 * c + i, sb + 96) - 32);
  } else if constexpr (F == kQ4K || F == kQ5K) {
    const uint8_t* qs = sb + (F == kQ4K ? 16 : 48) + 32 * (c / 2);
    const int64_t sh = 4 * (c % 2);
    for (int l = 0; l < 32; ++l) q[l] = (qs[l] >> sh) & 15;
    if constexpr (F == kQ5K) {
      const uint8_t* qh = sb + 16;
      for (int l = 0; l < 32; ++l) q[l] |= ((qh[l] >> c) & 1) << 4;
    }
    int sc = 0, mn = 0;
    kq_scale_min_k4(c, sb + 4, &sc, &mn);
    s[0] = s[1] = kq_half(sb) * static_cast<float>(sc);
    m[0] = m[1] = kq_half(sb + 2) * static_cast<float>(mn);
  } else if constexpr (F == kQ6K) {
    const int64_t h = c / 4, t = c % 4;
    const uint8_t* ql = sb + 64 * h + 32 * (t & 1);
    const uint8_t* qh = sb + 128 + 32 * h;
    const int64_t sh = t < 2 ? 0 : 4;
    for (int l = 0; l < 32; ++l) q[l] = (((ql[l] >> sh) & 15) | (((qh[l] >> (2 * t)) & 3) << 4)) - 32;
    const float d = kq_half(sb + 208);
    for (int i = 0; i < 2; ++i) s[i] = d * static_cast<float>(static_cast<int8_t>(sb[192 + 8 * h + 2 * t + i]));
  } else {
    static_assert(F == kIQ4XS, "a super-block format without a chunk decoder");
    const uint8_t* qs = sb + 8 + 16 * c;
    for (int l = 0; l < 16; ++l) {
      q[l] = kIq4nlValues[qs[l] & 15];
      q[l + 16] = kIq4nlValues[qs[l] >> 4];
    }
    uint16_t sh;
    std::memcpy(&sh, sb + 2, 2);
    const int ls = ((sb[4 + c / 2] >> (4 * (c % 2))) & 15) | (((sh >> (2 * c)) & 3) << 4);
    s[0] = s[1] = kq_half(sb) * static_cast<float>(ls - 32);
  }
}

// The 32 values of chunk b (of the row's k / 32) of a super-block row, in kQVecs vectors.
template <int F>
inline void kq_load_block(const uint8_t* row, int64_t b, vf (&w)[kQVecs]) {
  constexpr int64_t L = V<float>::L;
  const uint8_t* sb = row + b / kQSuperChunks * ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F));
  int32_t q[kQBlock];
  float s[2], m[2];
  kq_chunk<F>(sb, b % kQSuperChunks, q, s, m);
  for (int v = 0; v < kQVecs; ++v) {
    vi qv;
    std::memcpy(&qv, q + v * L, sizeof(vi));
    const int half = static_cast<int>(v * L / 16);
    if constexpr (kQSuperMin<F>) {
      w[v] = __builtin_convertvector(qv, vf) * splat(s[half]) - splat(m[half]);
    } else {
      w[v] = __builtin_convertvector(qv, vf) * splat(s[half]);
    }
  }
}
