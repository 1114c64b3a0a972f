// The AVX2 / AVX-512 VNNI kernels of the integer path for GGML's super-blocks (vec_quant_dot_k.h):
// Q8_K activation rows . Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weight rows, the same bits as the
// portable q8kdot_rows (NOTE [integer K dot order]).
//
// NOTE [integer K dot in vectors]: a weight super-block is unpacked once (shifts, masks and
// shuffles) into eight 32-byte vectors of its integers as unsigned bytes u (q2_k 0..3; q3_k
// 0..7, that is q + 4; q4_k 0..15; q5_k 0..31; q6_k 0..63, that is q + 32; iq4_xs |q|, its
// levels' magnitudes, <= 127) and, for each, a vector of sixteen int16 scales (lanes 0..7 the
// scale of the vector's first 16 values, lanes 8..15 of the next 16). For each activation row:
// maddubs(u, q_x) (iq4_xs: maddubs(|q|, q_x with q's sign)) gives int16 sums of two products, at
// most 2 * 127 * 128 = 32512 < 2^15 in magnitude (iq4_xs; q6_k's 2 * 63 * 128 next; |q_x| <= 128
// even though Q8_K's q_x lie in [-127, 127], but for iq4_xs, whose sign flip of -128 would wrap):
// no int16 saturation. madd (AVX2) or vpdpwssd (VNNI, non-saturating) multiplies those by the
// int16 scales (|sc| <= 128) and adds pairs into int32 lanes: each step is exact, and every
// partial sum is bounded by the exact |isum_b| < 2^27 of the NOTE. q6_k's q = u - 32 then takes
// -32 * sum of sc_g * bsums_g (the activation's group sums, which Q8_K's bsums are; |bsums_g| <=
// 16 * 128; -32 * sc_g, at most 4096 in magnitude, is an int16) by the same instruction, q3_k's
// q = u - 4 likewise -4 * sum of sc_g * bsums_g, and q2_k / q4_k / q5_k's msum is madd(bsums, mn)
// (mn_g <= 63). The integer sums are exact, so the order is free: isum_b and msum_b are the
// portable kernel's integers, and kd_add_block takes the float steps the same way.
// Pasted inside the per-ISA namespace by vec_table.h after vec_quant_dot_k.h: no includes.
#pragma once

#if defined(__AVX2__)
// One weight super-block unpacked for the vector kernel (NOTE [integer K dot in vectors]).
struct KsBlock {
  __m256i u[8];   // unsigned integers of values 32c .. 32c + 31
  __m256i sc[8];  // int16 scales of u[c]'s value pairs
  __m256i bw;     // int16 weights of the 16 bsums: q6_k -32 * sc_g, q3_k -4 * sc_g, q2_k / q4_k / q5_k mn_g
  __m256i sg[8];  // iq4_xs: the signed integers of u[c] (their signs)
  float d;
  float dmin;
};

// Sixteen int16 lanes, lanes 0..7 = lane a, lanes 8..15 = lane a + 1 of s (16 int16 lanes, a even).
template <int A>
inline __m256i ks_pair_scales(__m256i s) {
  const __m256i half = _mm256_permute2x128_si256(s, s, A < 8 ? 0x00 : 0x11);
  constexpr int i = A % 8;
  const __m256i ctrl = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((2 * i + 3) << 8) | (2 * i + 2))),
                                        _mm_set1_epi16(static_cast<int16_t>(((2 * i + 1) << 8) | (2 * i))));
  return _mm256_shuffle_epi8(half, ctrl);
}

// sc[c] = the scales of groups 2c and 2c + 1 (s: 16 int16 lanes, one a group) as ks_pair_scales.
inline void ks_pair_scales_all(__m256i s, __m256i (&sc)[8]) {
  sc[0] = ks_pair_scales<0>(s);
  sc[1] = ks_pair_scales<2>(s);
  sc[2] = ks_pair_scales<4>(s);
  sc[3] = ks_pair_scales<6>(s);
  sc[4] = ks_pair_scales<8>(s);
  sc[5] = ks_pair_scales<10>(s);
  sc[6] = ks_pair_scales<12>(s);
  sc[7] = ks_pair_scales<14>(s);
}

inline __m256i ks_load(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// q4_k / q5_k's eight six-bit scales and mins (kd_scales_mins6's values), by bytes of three words.
inline void ks_scales_mins6(const uint8_t* p, uint64_t& sc8, uint64_t& mn8) {
  uint32_t u[3];
  std::memcpy(u, p, 12);
  const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, b45 = 0x30303030u;
  sc8 = (u[0] & lo6) | uint64_t{(u[2] & lo4) | ((u[0] >> 2) & b45)} << 32;
  mn8 = (u[1] & lo6) | uint64_t{((u[2] >> 4) & lo4) | ((u[1] >> 2) & b45)} << 32;
}

// Super-block sb of format F (kKsSimd) unpacked into o.
template <int F>
inline void ks_unpack(const uint8_t* sb, KsBlock& o) {
  const __m256i lo4 = _mm256_set1_epi8(15);
  if constexpr (F == kQ6K) {  // ql[128], qh[64], int8 scales[16], d
    const __m256i b45 = _mm256_set1_epi8(0x30);
    for (int64_t h = 0; h < 2; ++h) {
      const __m256i l0 = ks_load(sb + 64 * h), l1 = ks_load(sb + 64 * h + 32), hb = ks_load(sb + 128 + 32 * h);
      // bits 2t, 2t + 1 of qh to bits 4, 5 (16-bit shifts: the masked bits stay in their byte)
      o.u[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), b45));
      o.u[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), b45));
      o.u[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(hb, b45));
      o.u[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), b45));
    }
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 192)));
    ks_pair_scales_all(s16, o.sc);
    o.bw = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5));
    o.d = kq_half(sb + 208);
    o.dmin = 0.0f;
  } else if constexpr (F == kQ2K || F == kQ3K) {
    // q2_k: scales[16], qs[64], d, dmin; q3_k: hmask[32], qs[64], scales[12], d. Value 128h + 32j + l:
    // (qs[32h + l] >> 2j) & 3, for q3_k + 4 where bit 4h + j of hmask[l] is set
    const uint8_t* qs = sb + (F == kQ2K ? 16 : 32);
    const __m256i lo2 = _mm256_set1_epi8(3);
    for (int64_t h = 0; h < 2; ++h) {
      const __m256i v = ks_load(qs + 32 * h);
      o.u[4 * h] = _mm256_and_si256(v, lo2);
      o.u[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), lo2);
      o.u[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo2);
      o.u[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), lo2);
    }
    __m256i s16;
    if constexpr (F == kQ3K) {
      const __m256i hm = ks_load(sb);
      for (int c = 0; c < 8; ++c) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << c));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
        o.u[c] = _mm256_or_si256(o.u[c], _mm256_and_si256(set, _mm256_set1_epi8(4)));
      }
      // scale g: (g < 8 ? s[g] & 15 : s[g - 8] >> 4) | ((s[8 + g % 4] >> 2 (g / 4)) & 3) << 4, - 32
      uint32_t a[3];
      std::memcpy(a, sb + 96, 12);
      const uint32_t m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
      const __m128i bytes = _mm_setr_epi32(static_cast<int>((a[0] & m4) | (a[2] & m2) << 4),
                                           static_cast<int>((a[1] & m4) | ((a[2] >> 2) & m2) << 4),
                                           static_cast<int>(((a[0] >> 4) & m4) | ((a[2] >> 4) & m2) << 4),
                                           static_cast<int>(((a[1] >> 4) & m4) | ((a[2] >> 6) & m2) << 4));
      s16 = _mm256_sub_epi16(_mm256_cvtepu8_epi16(bytes), _mm256_set1_epi16(32));
      o.bw = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 2));
      o.d = kq_half(sb + 108);
      o.dmin = 0.0f;
    } else {  // scale in the low nibble, min in the high one
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb));
      const __m128i m4 = _mm_set1_epi8(15);
      s16 = _mm256_cvtepu8_epi16(_mm_and_si128(bytes, m4));
      o.bw = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), m4));
      o.d = kq_half(sb + 80);
      o.dmin = kq_half(sb + 82);
    }
    ks_pair_scales_all(s16, o.sc);
  } else if constexpr (F == kIQ4XS) {
    // d, scales_h, scales_l[4], qs[128]; values 32c .. 32c + 15: levels of the low nibbles of
    // qs[16c .. 16c + 15], 32c + 16 .. 32c + 31 of the high ones; scale c (both halves):
    // ((scales_l[c / 2] >> 4 (c % 2)) & 15) | ((scales_h >> 2c) & 3) << 4, - 32
    const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
    for (int64_t c = 0; c < 8; ++c) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + 8 + 16 * c));
      const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), lo4);
      o.sg[c] = _mm256_shuffle_epi8(levels, nib);
      o.u[c] = _mm256_sign_epi8(o.sg[c], o.sg[c]);
    }
    uint16_t sh;
    uint32_t sl;
    std::memcpy(&sh, sb + 2, 2);
    std::memcpy(&sl, sb + 4, 4);
    // low bits: the nibbles of scales_l interleaved (c = 0, 1, 2, ..); high bits: lane c of
    // sh << (14 - 2c) (16-bit products), shifted down by 14
    const __m128i l = _mm_cvtsi32_si128(static_cast<int>(sl)), m4 = _mm_set1_epi8(15);
    const __m128i lows =
        _mm_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_and_si128(l, m4), _mm_and_si128(_mm_srli_epi16(l, 4), m4)));
    const __m128i highs =
        _mm_srli_epi16(_mm_mullo_epi16(_mm_set1_epi16(static_cast<int16_t>(sh)),
                                       _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)),
                       14);
    const __m256i s16 =
        _mm256_broadcastsi128_si256(_mm_sub_epi16(_mm_or_si128(lows, _mm_slli_epi16(highs, 4)), _mm_set1_epi16(32)));
    for (int c = 0; c < 8; ++c) {
      o.sc[c] = _mm256_shuffle_epi8(s16, _mm256_set1_epi16(static_cast<int16_t>(((2 * c + 1) << 8) | (2 * c))));
    }
    o.bw = _mm256_setzero_si256();
    o.d = kq_half(sb);
    o.dmin = 0.0f;
  } else {
    static_assert(F == kQ4K || F == kQ5K, "the super-block formats");
    // d, dmin, scales[12], (q5_k: qh[32]), qs[128]; value 32c + l: (qs[32 (c / 2) + l] >> 4 (c % 2)) & 15
    const uint8_t* qs = sb + (F == kQ4K ? 16 : 48);
    for (int64_t i = 0; i < 4; ++i) {
      const __m256i v = ks_load(qs + 32 * i);
      o.u[2 * i] = _mm256_and_si256(v, lo4);
      o.u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
    }
    if constexpr (F == kQ5K) {  // bit 4 of value 32c + l: bit c of qh[l]
      const __m256i qh = ks_load(sb + 16);
      for (int c = 0; c < 8; ++c) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << c));
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        o.u[c] = _mm256_or_si256(o.u[c], _mm256_and_si256(set, _mm256_set1_epi8(16)));
      }
    }
    uint64_t sc8, mn8;
    ks_scales_mins6(sb + 4, sc8, mn8);
    // scale c for both 16-value halves of u[c]; mins once per group (mn_{g / 2})
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc8))));
    for (int c = 0; c < 8; ++c) {
      o.sc[c] = _mm256_shuffle_epi8(s16, _mm256_set1_epi16(static_cast<int16_t>(((2 * c + 1) << 8) | (2 * c))));
    }
    const __m128i m = _mm_cvtsi64_si128(static_cast<int64_t>(mn8));
    o.bw = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
    o.d = kq_half(sb);
    o.dmin = kq_half(sb + 2);
  }
}

// The sum of the eight int32 lanes of v.
inline int32_t ks_hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// acc + the int16 pair products of p and s, as int32 lanes: madd then add (AVX2).
struct KsMadd {
  static inline __m256i acc(__m256i a, __m256i p, __m256i s) { return _mm256_add_epi32(a, _mm256_madd_epi16(p, s)); }
};

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// AVX-512 VNNI: vpdpwssd, the same exact pair products added in one instruction.
struct KsVnni {
  __attribute__((target("avx512vnni"))) static inline __m256i acc(__m256i a, __m256i p, __m256i s) {
    return _mm256_dpwssd_epi32(a, p, s);
  }
};
#endif

// isum_b and msum_b (NOTE [integer K dot order]) of the unpacked super-block blk and an
// activation super-block (x: 256 int8; bs: its 16 bsums).
// Four accumulators (c % 4), added at the end: the sums are exact, so this is the same isum_b,
// and four short chains of the multiply-add's latency instead of one of eight (the one-row case,
// a decode step, is otherwise bound by that chain).
template <int F, class DOT>
inline void ks_sums(const KsBlock& blk, const int8_t* x, const int16_t* bs, int32_t& isum, int32_t& msum) {
  __m256i part[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int64_t c = 0; c < 8; ++c) {
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * c));
    if constexpr (F == kIQ4XS) xv = _mm256_sign_epi8(xv, blk.sg[c]);
    part[c % 4] = DOT::acc(part[c % 4], _mm256_maddubs_epi16(blk.u[c], xv), blk.sc[c]);
  }
  const __m256i acc = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
  msum = 0;
  if constexpr (F == kIQ4XS) {
    (void)bs;
    isum = ks_hsum(acc);
  } else if constexpr (F == kQ6K || F == kQ3K) {
    const __m256i bsv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs));
    isum = ks_hsum(DOT::acc(acc, bsv, blk.bw));
  } else {
    const __m256i bsv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bs));
    isum = ks_hsum(acc);
    msum = ks_hsum(_mm256_madd_epi16(bsv, blk.bw));
  }
}

// kd_rows' pieces (same bits as KdPlain's) with the vector unpacking and sums above.
template <class DOT>
struct KsKernel {
  using Block = KsBlock;
  template <int F>
  static void unpack(const uint8_t* sb, KsBlock& o) {
    ks_unpack<F>(sb, o);
  }
  template <int F>
  static void sums(const KsBlock& blk, const int8_t* x, const int16_t* bs, int32_t& isum, int32_t& msum) {
    ks_sums<F, DOT>(blk, x, bs, isum, msum);
  }
};

template <int F, class DOT>
void ks_rows_fn(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const int16_t* xs, const uint8_t* w,
                int64_t rsw, const float* bias, float* c, int64_t rsc) {
  kd_rows<F, KsKernel<DOT>>(m, n, k, xq, xd, xs, w, rsw, bias, c, rsc);
}

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// The VNNI entry: compiled for avx512vnni, everything inlined into it (flatten), so vpdpwssd only
// runs when the table maker saw the CPU has it.
template <int F>
__attribute__((target("avx512vnni"), flatten)) void ks_rows_vnni(int64_t m, int64_t n, int64_t k, const int8_t* xq,
                                                                 const float* xd, const int16_t* xs, const uint8_t* w,
                                                                 int64_t rsw, const float* bias, float* c,
                                                                 int64_t rsc) {
  kd_rows<F, KsKernel<KsVnni>>(m, n, k, xq, xd, xs, w, rsw, bias, c, rsc);
}
#endif
#endif

// The table's integer kernel for super-block format F: VNNI where this table and the CPU have
// it, else AVX2's madd; else (the baseline table) the portable q8kdot_rows.
template <int F>
auto q8kdot_kernel() -> void (*)(int64_t, int64_t, int64_t, const int8_t*, const float*, const int16_t*, const uint8_t*,
                                 int64_t, const float*, float*, int64_t) {
#if defined(__AVX2__)
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().avx512_vnni) return ks_rows_vnni<F>;
#endif
  return ks_rows_fn<F, KsMadd>;
#else
  return q8kdot_rows<F>;
#endif
}
