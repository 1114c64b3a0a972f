// The 256-value super-blocks of GGML's K-quants and IQ4_XS (quant_formats.h rows Q2_K..IQ4_XS)
// for vec_quant.h: a super-block's scales s and offsets m (one per 16 values, or per 32 for
// q4_k, q5_k, iq4_xs; m = 0 but for q2_k, q4_k, q5_k) decoded once, then its 32-value chunks c
// (0..7: values 32c..32c+31) as 32 integers q each (value = s * q - m), into float32 rows
// (kq_dequant_row) or the one-row dot products (kq_qdot_wrows). Byte layouts and arithmetic are GGML's (ggml-common.h,
// dequantize_row_*): d, dmin are float16, QK_K = 256.
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
// Every d * sc and s * q is exact in float32 (an 11-bit float16 significand times integers: at
// most 2047 * 127 * 31 < 2^23, q6_k's and iq4_xs's worst) and m = dmin * min too, so a value is
// one rounding of s * q - m with or without a fused multiply-add: bit-exact with GGML's
// reference and gguf.quants whatever the order of the products.
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

// The formats with one scale (and offset) per 32 values; the others have one per 16.
template <int F>
constexpr bool kQSuper32 = F == kQ4K || F == kQ5K || F == kIQ4XS;

// out[0..16) = (b[i] - offset) * mult for 16 bytes at b, uint8 or (SIGNED) int8: one widening,
// conversion and product per vector (GCC leaves the scalar form of this loop scalar; the maskz
// forms of the AVX-512 widenings: no -Wmaybe-uninitialized from the unmasked ones).
template <bool SIGNED>
inline void kq_to_floats(const uint8_t* b, int32_t offset, float mult, float* out) {
  constexpr int64_t L = V<float>::L;
  for (int64_t i = 0; i < 16; i += L) {
    vi x;
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    x = bitcast<vi>(SIGNED ? _mm512_maskz_cvtepi8_epi32(0xFFFF, p) : _mm512_maskz_cvtepu8_epi32(0xFFFF, p));
#elif KAEL_VBYTES == 32 && defined(__AVX2__)
    const __m128i p = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + i));
    x = bitcast<vi>(SIGNED ? _mm256_cvtepi8_epi32(p) : _mm256_cvtepu8_epi32(p));
#else
    int32_t t[L];
    for (int64_t l = 0; l < L; ++l) t[l] = SIGNED ? static_cast<int8_t>(b[i + l]) : b[i + l];
    std::memcpy(&x, t, sizeof(x));
#endif
    store(out + i, __builtin_convertvector(x - offset, vf) * splat(mult));
  }
}

// A super-block's scales s and offsets m: value i = s[k] * q[i] - m[k], k = i / 16, or i / 32
// for kQSuper32 formats (entries 8.. then unused); m left alone for the formats without
// offsets. The small integers come out of their packing as bytes (GGML's kmask shuffles for
// the 6-bit ones), then one kq_to_floats each.
template <int F>
inline void kq_scales(const uint8_t* sb, float (&s)[16], float (&m)[16]) {
  uint8_t b[32] = {};
  if constexpr (F == kQ2K) {  // scale in the low nibble, min in the high one (as 16-bit lanes)
    typedef uint16_t v8u16 __attribute__((vector_size(16)));  // NOLINT(modernize-use-using)
    v8u16 x;
    std::memcpy(&x, sb, sizeof(x));
    const v8u16 lo = x & 0x0f0f, hi = (x >> 4) & 0x0f0f;
    std::memcpy(b, &lo, sizeof(lo));
    std::memcpy(b + 16, &hi, sizeof(hi));
    kq_to_floats<false>(b, 0, kq_half(sb + 80), s);
    kq_to_floats<false>(b + 16, 0, kq_half(sb + 82), m);
  } else if constexpr (F == kQ3K) {  // 16 six-bit scales: low nibbles in bytes 0..7, high bits in 8..11
    uint32_t aux[4];
    std::memcpy(aux, sb + 96, 12);
    const uint32_t tmp = aux[2];
    constexpr uint32_t kLow4 = 0x0f0f0f0fu, kLow2 = 0x03030303u;
    aux[2] = ((aux[0] >> 4) & kLow4) | (((tmp >> 4) & kLow2) << 4);
    aux[3] = ((aux[1] >> 4) & kLow4) | (((tmp >> 6) & kLow2) << 4);
    aux[0] = (aux[0] & kLow4) | ((tmp & kLow2) << 4);
    aux[1] = (aux[1] & kLow4) | (((tmp >> 2) & kLow2) << 4);
    std::memcpy(b, aux, 16);
    kq_to_floats<false>(b, 32, kq_half(sb + 108), s);
  } else if constexpr (F == kQ4K || F == kQ5K) {  // 8 six-bit scales, then 8 six-bit mins
    uint32_t u[4];
    std::memcpy(u, sb + 4, 12);
    constexpr uint32_t kLow6 = 0x3f3f3f3fu, kLow4 = 0x0f0f0f0fu, kLow2 = 0x03030303u;
    u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
    const uint32_t mins_lo = u[1] & kLow6;
    u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
    u[2] = mins_lo;
    u[0] &= kLow6;
    std::memcpy(b, u, 16);
    kq_to_floats<false>(b, 0, kq_half(sb), s);
    kq_to_floats<false>(b + 8, 0, kq_half(sb + 2), m);
  } else if constexpr (F == kQ6K) {  // int8 scales
    kq_to_floats<true>(sb + 192, 0, kq_half(sb + 208), s);
  } else {
    static_assert(F == kIQ4XS, "a super-block format without scales");
    uint16_t sh;
    std::memcpy(&sh, sb + 2, 2);
    for (int64_t c = 0; c < kQSuperChunks; ++c) {
      b[c] = static_cast<uint8_t>(((sb[4 + c / 2] >> (4 * (c % 2))) & 15) | (((sh >> (2 * c)) & 3) << 4));
    }
    kq_to_floats<false>(b, 32, kq_half(sb), s);
  }
  if constexpr (!kQSuperMin<F>) (void)m;
}

// 32 bytes, the unit of a chunk's quant bits, as 16 uint16 lanes: x86 has no byte shifts (GCC
// would take a uint8 vector apart byte by byte), and a lane shifted right by s, then masked
// per byte to fewer than 8 - s bits, is each byte shifted alone.
typedef uint16_t vkb __attribute__((vector_size(32)));  // NOLINT(modernize-use-using)

inline vkb kq_bytes(const uint8_t* p) {
  vkb v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// A byte mask in every byte of a lane.
constexpr uint16_t kq_mask(int bits) {
  return static_cast<uint16_t>(((1u << bits) - 1u) * 0x0101u);
}

// The 32 small unsigned integers of b (bytes), less `offset`, as kQVecs int32 vectors (element
// order): zero extensions by intrinsics on AVX2 / AVX-512 (GCC takes a uint8 -> int32
// conversion of its vectors apart there), a vector conversion on the baseline table.
inline void kq_widen(vkb b, int32_t offset, vi (&q)[kQVecs]) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  const __m256i x = bitcast<__m256i>(b);
  q[0] = bitcast<vi>(_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm256_castsi256_si128(x))) - offset;
  q[1] = bitcast<vi>(_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm256_extracti128_si256(x, 1))) - offset;
#elif KAEL_VBYTES == 32 && defined(__AVX2__)
  const __m256i x = bitcast<__m256i>(b);
  const __m128i lo = _mm256_castsi256_si128(x), hi = _mm256_extracti128_si256(x, 1);
  q[0] = bitcast<vi>(_mm256_cvtepu8_epi32(lo)) - offset;
  q[1] = bitcast<vi>(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))) - offset;
  q[2] = bitcast<vi>(_mm256_cvtepu8_epi32(hi)) - offset;
  q[3] = bitcast<vi>(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))) - offset;
#else
  constexpr int64_t L = V<float>::L;
  uint8_t t[32];
  std::memcpy(t, &b, sizeof(t));
  for (int v = 0; v < kQVecs; ++v) {
    vqu8 p;
    std::memcpy(&p, t + v * L, sizeof(p));
    q[v] = __builtin_convertvector(p, vi) - offset;
  }
#endif
}

// The 32 integers q of chunk c (0..7) of the super-block at sb, in kQVecs vectors.
template <int F>
inline void kq_ints(const uint8_t* sb, int64_t c, vi (&q)[kQVecs]) {
  if constexpr (F == kQ2K || F == kQ3K) {
    const int sh = static_cast<int>(2 * (c % 4));
    vkb b = (kq_bytes(sb + (F == kQ2K ? 16 : 32) + 32 * (c / 4)) >> sh) & kq_mask(2);
    if constexpr (F == kQ3K) {  // q - (bit c of hmask ? 0 : 4) = (q | bit << 2) - 4
      b |= ((kq_bytes(sb) >> static_cast<int>(c)) & kq_mask(1)) << 2;
    }
    kq_widen(b, F == kQ3K ? 4 : 0, q);
  } else if constexpr (F == kQ4K || F == kQ5K) {
    const int sh = static_cast<int>(4 * (c % 2));
    vkb b = (kq_bytes(sb + (F == kQ4K ? 16 : 48) + 32 * (c / 2)) >> sh) & kq_mask(4);
    if constexpr (F == kQ5K) b |= ((kq_bytes(sb + 16) >> static_cast<int>(c)) & kq_mask(1)) << 4;
    kq_widen(b, 0, q);
  } else if constexpr (F == kQ6K) {
    const int64_t h = c / 4, t = c % 4;
    const vkb lo = (kq_bytes(sb + 64 * h + 32 * (t & 1)) >> static_cast<int>(t < 2 ? 0 : 4)) & kq_mask(4);
    const vkb hi = (kq_bytes(sb + 128 + 32 * h) >> static_cast<int>(2 * t)) & kq_mask(2);
    kq_widen(lo | (hi << 4), 32, q);
  } else {
    static_assert(F == kIQ4XS, "a super-block format without a chunk decoder");
    iq4_levels(sb + 8 + 16 * c, q);  // IQ4_NL's levels of the low, then the high nibbles
  }
}

// The 32 values of chunk c of the super-block at sb (its scales s, offsets m from kq_scales).
template <int F>
inline void kq_values(const uint8_t* sb, int64_t c, const float (&s)[16], const float (&m)[16], vf (&w)[kQVecs]) {
  constexpr int64_t L = V<float>::L;
  vi q[kQVecs];
  kq_ints<F>(sb, c, q);
  for (int v = 0; v < kQVecs; ++v) {
    const int64_t i = kQSuper32<F> ? c : 2 * c + v * L / 16;  // the scale of these values
    if constexpr (kQSuperMin<F>) {
      w[v] = __builtin_convertvector(q[v], vf) * splat(s[i]) - splat(m[i]);
    } else {
      w[v] = __builtin_convertvector(q[v], vf) * splat(s[i]);
    }
  }
}

constexpr int64_t kQSuperValues = kQSuperChunks * kQBlock;

// out[0..k) = a super-block row as float32 (k % 256 == 0).
template <int F>
void kq_dequant_row(float* out, const uint8_t* row, int64_t k) {
  constexpr int64_t L = V<float>::L;
  constexpr int64_t B = ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F));
  for (int64_t sb = 0; sb < k / kQSuperValues; ++sb) {
    const uint8_t* blk = row + sb * B;
    float s[16], m[16];
    kq_scales<F>(blk, s, m);
    for (int64_t c = 0; c < kQSuperChunks; ++c) {
      vf w[kQVecs];
      kq_values<F>(blk, c, s, m, w);
      for (int v = 0; v < kQVecs; ++v) store(out + sb * kQSuperValues + c * kQBlock + v * L, w[v]);
    }
  }
}

// qdot_wrows for a super-block format, the scales decoded once a super-block: each row's dot
// product is the same operations on the same values, in the same order, as qdot_tile's over the
// rows kq_dequant_row expands for several rows of a (each 32-value chunk's products summed
// pairwise, added into the row's accumulator, its lanes, then the bias), so a row's bits do not
// depend on how many rows come with it.
template <int F, int NB>
inline void kq_qdot_wrows(int64_t k, const float* a, const uint8_t* w, int64_t rsw, const float* bias, float* c,
                          int64_t csc) {
  constexpr int64_t B = ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F));
  vf acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = vf{};
  for (int64_t sb = 0; sb < k / kQSuperValues; ++sb) {
    for (int j = 0; j < NB; ++j) {
      const uint8_t* blk = w + j * rsw + sb * B;
      for (int64_t off = 0; off < B; off += 64) __builtin_prefetch(blk + off + kQPrefetch, 0, 0);
      float s[16], m[16];
      kq_scales<F>(blk, s, m);
      for (int64_t ch = 0; ch < kQSuperChunks; ++ch) {
        vf wv[kQVecs];
        kq_values<F>(blk, ch, s, m, wv);
        acc[j] += block_dot(wv, a + sb * kQSuperValues + ch * kQBlock);
      }
    }
  }
  for (int j = 0; j < NB; ++j) {
    float r = hsum<float>(acc[j]);
    if (bias != nullptr) r += bias[j];
    c[j * csc] = r;
  }
}
