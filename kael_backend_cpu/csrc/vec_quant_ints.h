// The integers of GGML's 32-value blocks for vec_quant.h's load_block / load_block_q: Q8_0's
// int8, Q4_0's nibbles - 8, Q4_1 / Q5_0 / Q5_1's 4- and 5-bit values and IQ4_NL's levels (the
// layouts are in vec_quant.h's header), each as kQVecs int32 vectors in element order.
// Pasted inside the per-ISA namespace by vec_table.h through vec_quant.h: no includes.
#pragma once

// The 32 int8 values of a Q8_0 block at qs, in element order: one sign extension per vector on
// AVX2 / AVX-512 (the maskz form: no -Wmaybe-uninitialized from the unmasked one).
inline void q8_values(const uint8_t* qs, vi (&out)[kQVecs]) {
  constexpr int64_t L = V<float>::L;
  for (int v = 0; v < kQVecs; ++v) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
    out[v] =
        bitcast<vi>(_mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + v * L))));
#elif KAEL_VBYTES == 32 && defined(__AVX2__)
    out[v] = bitcast<vi>(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + v * L))));
#else
    // int8 q = (q ^ 0x80) - 128 read unsigned: GCC vectorises the zero extension, and
    // scalarises a sign extension of these vectors
    vqu8 q;
    std::memcpy(&q, qs + v * L, sizeof(q));
    out[v] = __builtin_convertvector(q ^ 0x80, vi) - 128;
#endif
  }
}

// The 32 integers q - 8 of a Q4_0 block's 16 nibble bytes at qs, in element order (low nibbles
// are values 0..15, high ones 16..31).
inline void q4_values(const uint8_t* qs, vi (&out)[kQVecs]) {
#if KAEL_VBYTES == 32 && defined(__AVX2__)
  // 8-byte GCC vectors are scalarised here: the nibbles by 16-byte intrinsics instead
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(q, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
  out[0] = bitcast<vi>(_mm256_cvtepu8_epi32(lo)) - 8;
  out[1] = bitcast<vi>(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))) - 8;
  out[2] = bitcast<vi>(_mm256_cvtepu8_epi32(hi)) - 8;
  out[3] = bitcast<vi>(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))) - 8;
#else
  constexpr int64_t L = V<float>::L;
  constexpr int H = kQVecs / 2;
  for (int v = 0; v < H; ++v) {
    vqu8 q;
    std::memcpy(&q, qs + v * L, sizeof(q));
    out[v] = __builtin_convertvector(q & 15, vi) - 8;
    out[H + v] = __builtin_convertvector(q >> 4, vi) - 8;
  }
#endif
}

// IQ4_NL's 16 non-linear levels (GGML's kvalues_iq4nl), indexed by a nibble.
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL's levels of the 16 nibble bytes at qs as 32 integers in element order (low nibbles are
// values 0..15, high ones 16..31): one pshufb table look-up per 16 on AVX2 / AVX-512.
inline void iq4_levels(const uint8_t* qs, vi (&out)[kQVecs]) {
#if defined(__AVX2__) && (KAEL_VBYTES == 32 || KAEL_VBYTES == 64)
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), low4 = _mm_set1_epi8(15);
  const __m128i lo = _mm_shuffle_epi8(levels, _mm_and_si128(raw, low4));
  const __m128i hi = _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16(raw, 4), low4));
#if KAEL_VBYTES == 64
  out[0] = bitcast<vi>(_mm512_maskz_cvtepi8_epi32(0xFFFF, lo));
  out[1] = bitcast<vi>(_mm512_maskz_cvtepi8_epi32(0xFFFF, hi));
#else
  out[0] = bitcast<vi>(_mm256_cvtepi8_epi32(lo));
  out[1] = bitcast<vi>(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  out[2] = bitcast<vi>(_mm256_cvtepi8_epi32(hi));
  out[3] = bitcast<vi>(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
#endif
#else
  constexpr int64_t L = V<float>::L;
  int32_t q[kQBlock];
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4nlValues[qs[j] & 15];
    q[j + 16] = kIq4nlValues[qs[j] >> 4];
  }
  for (int v = 0; v < kQVecs; ++v) std::memcpy(&out[v], q + v * L, sizeof(vi));
#endif
}

// The 32 integers of a q4_1 / q5_0 / q5_1 / iq4_nl block (F = 4, 5, 6, 7) at blk, in element
// order: nibble j of the 16 bytes at qs is value j (low) and j + 16 (high); the 5-bit formats add
// bit j of qh as the fifth bit of value j (bit 4 of the result). q5_0's are q - 16; iq4_nl's
// are its levels kIq4nlValues[q].
template <int F>
inline void q451_values(const uint8_t* blk, vi (&out)[kQVecs]) {
  if constexpr (F == 7) {
    iq4_levels(blk + 2, out);
  } else {  // the nibbles as Q4_0's (+ 8 back), bit j of qh by a per-lane shift (vectorised: the scalar loop was not)
    constexpr int64_t L = V<float>::L;
    q4_values(blk + (F == 4 ? 4 : F == 5 ? 6 : 8), out);
    uint32_t qh = 0;
    if constexpr (F == 5 || F == 6) std::memcpy(&qh, blk + (F == 5 ? 2 : 4), 4);
    vi lane{};
    for (int64_t l = 0; l < L; ++l) lane[l] = static_cast<int32_t>(l);
    const vi h = vi{} + static_cast<int32_t>(qh);
    for (int v = 0; v < kQVecs; ++v) {
      out[v] += 8;
      if constexpr (F == 5 || F == 6) out[v] |= ((h >> (lane + static_cast<int32_t>(v * L))) & 1) << 4;
      if constexpr (F == 5) out[v] -= 16;
    }
  }
}
