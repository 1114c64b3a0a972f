// The integer path on repacked weight rows (NOTE [repacked rows]): Q8_0 activation rows . Q8_0 / Q4_0 / IQ4_NL weight
// rows that quant.cpp's pack_rows16 rearranged 16 at a time, on the AVX-512 table of a CPU with AVX512_VNNI.
//
// NOTE [repacked rows]: GGML keeps a row's blocks one after the other (Q4_0: a float16 scale, then 16 bytes of
// nibbles), so a one-row kernel spends most of its instructions gathering each block's 16 or 32 bytes and
// reducing each block's integer products across vector lanes. Repacked, the rows 16s .. 16s + 15 (a slab) keep
// their bytes in the same 16 * row-bytes span, block by block: block b is the 16 rows' float16 scales (32 bytes),
// then chunk c (4 values of each row: c = 0..3 for Q4_0, the nibble bytes 4c .. 4c + 3, whose low nibbles are
// values 4c .. 4c + 3 and high ones 16 + 4c ..; c = 0..7 for Q8_0, values 4c .. 4c + 3, each q + 128 as an
// unsigned byte; IQ4_NL as Q4_0, its nibbles turned into level + 128 by a byte shuffle) as 16 rows x 4 bytes.
// Q5_0 as Q4_0 with its fifth bits in one more vector after the scales (its chunks start at byte 96): byte i of
// row r holds, in bit 2c, the fifth bit of value 4c + i and in bit 2c + 1 that of value 16 + 4c + i (c = 0..3),
// so chunk c's five-bit integers u = q + 16 are its nibbles ORed with two shifted, masked copies. One
// 64-byte load is then four values of each of the 16 rows, and vpdpbusd against the activation's four matching int8
// values (broadcast) adds their products into lane r, row r's block sum: after a block's loads every lane holds its
// row's exact isum_b (with the offset folded back in: - 8 or
// - 128 times the activation block's sum), never reduced across lanes. The float steps are NOTE [integer dot
// order]'s, lane for lane: p_b = (d_w * d_x) * float(isum_b), added into accumulator b % 8, then the same tree,
// so a repacked row gives the same bits as its GGML row through q8dot_rows. Rows past the last whole slab stay
// in GGML's layout (quant.cpp runs them through q8dot_rows). The repacked copy lives in memory only.
// Q6_K (Q8_K activations, NOTE [integer K dot order]) likewise, per 256-value super-block b of a slab: the 16
// rows' float16 d (32 bytes), their int8 scales group by group (16 groups x 16 rows), then each 16-value group's
// six-bit integers u = q + 32 as three 64-byte vectors: the low nibbles of values 0..3 of the group (low
// nibble) and 4..7 (high), of 8..11 and 12..15, then the two high bits of values 0..3, 4..7, 8..11, 12..15 (bits
// 0-1, 2-3, 4-5, 6-7), each vector 16 rows x 4 values. A group's u . q_x minus 32 times its bsum is its exact
// sum of q_w * q_x, times the row's scale (vpmulld) into isum_b, lane r for row r; then p_b as the format's
// kd_add_block in lanes. Q4_K: see pk_q4k_slab_row.
// Pasted inside the per-ISA namespace by vec_table.h: no includes.
#pragma once

constexpr int64_t kPackRows = 16;  // weight rows a slab interleaves

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// Bytes of block b of a slab of format F (0 q8_0, 1 q4_0, 5 q5_0, 7 iq4_nl): 16 scales and 16 rows' integers.
template <int F>
constexpr int64_t kPackBlockBytes = F == 0   ? 16 * 34
                                    : F == 5 ? 16 * 22
                                             : 16 * 18;

// The bits of v at position s of each byte moved to bit 4 (16-bit lanes: what crosses a byte is masked off).
template <int S>
__attribute__((target("avx512vnni"))) inline __m512i pk_bit_to_4(__m512i v) {
  const __m512i m = _mm512_set1_epi8(0x10);
  if constexpr (S <= 4) {
    return _mm512_and_si512(_mm512_slli_epi16(v, 4 - S), m);
  } else {
    return _mm512_and_si512(_mm512_srli_epi16(v, S - 4), m);
  }
}

// Chunk C of a Q5_0 slab block (blk; qh: its fifth-bit vector) against activation block x: its products added to is.
template <int64_t C>
__attribute__((target("avx512vnni"))) inline __m512i pk_q5_0_chunk(const uint8_t* blk, const int8_t* x, __m512i qh,
                                                                   __m512i is) {
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i v = _mm512_loadu_si512(blk + 96 + 64 * C);
  int32_t lo, hi;
  std::memcpy(&lo, x + 4 * C, 4);
  std::memcpy(&hi, x + 16 + 4 * C, 4);
  const __m512i ul = _mm512_or_si512(_mm512_and_si512(v, m4), pk_bit_to_4<2 * C>(qh));
  const __m512i uh = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m4), pk_bit_to_4<2 * C + 1>(qh));
  is = _mm512_dpbusd_epi32(is, ul, _mm512_set1_epi32(lo));
  return _mm512_dpbusd_epi32(is, uh, _mm512_set1_epi32(hi));
}

// Block b of a slab (p) against one activation row (xq, xd, xs as pk_slab_row's): the 16 rows' p_b added into a.
template <int F>
__attribute__((target("avx512vnni"))) inline void pk_block(int64_t b, const int8_t* xq, const float* xd,
                                                           const int32_t* xs, const uint8_t* p, __m512& a) {
  static_assert(F == 0 || F == 1 || F == 5 || F == 7, "q8_0, q4_0, q5_0 and iq4_nl");
  constexpr int kOff = F == 1 ? 8 : F == 5 ? 16 : 128;  // iq4_nl: its levels + 128, by the lookup
  const uint8_t* blk = p + b * kPackBlockBytes<F>;
  const int8_t* x = xq + b * 32;
  __m512i is = _mm512_set1_epi32(-kOff * xs[b]);
  if constexpr (F == 5) {
    const __m512i qh = _mm512_loadu_si512(blk + 32);
    is = pk_q5_0_chunk<0>(blk, x, qh, is);
    is = pk_q5_0_chunk<1>(blk, x, qh, is);
    is = pk_q5_0_chunk<2>(blk, x, qh, is);
    is = pk_q5_0_chunk<3>(blk, x, qh, is);
  } else if constexpr (F == 1 || F == 7) {
    const __m512i m4 = _mm512_set1_epi8(15);
    // iq4_nl: each nibble's level + 128 as an unsigned byte (a byte shuffle of the 16 levels)
    const __m512i levels = _mm512_xor_si512(
        _mm512_maskz_broadcast_i32x4(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))),
        _mm512_set1_epi8(static_cast<char>(0x80)));
    for (int64_t c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(blk + 32 + 64 * c);
      int32_t lo, hi;
      std::memcpy(&lo, x + 4 * c, 4);
      std::memcpy(&hi, x + 16 + 4 * c, 4);
      __m512i ul = _mm512_and_si512(v, m4), uh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      if constexpr (F == 7) {
        ul = _mm512_shuffle_epi8(levels, ul);
        uh = _mm512_shuffle_epi8(levels, uh);
      }
      is = _mm512_dpbusd_epi32(is, ul, _mm512_set1_epi32(lo));
      is = _mm512_dpbusd_epi32(is, uh, _mm512_set1_epi32(hi));
    }
  } else {
    for (int64_t c = 0; c < 8; ++c) {
      int32_t xc;
      std::memcpy(&xc, x + 4 * c, 4);
      is = _mm512_dpbusd_epi32(is, _mm512_loadu_si512(blk + 32 + 64 * c), _mm512_set1_epi32(xc));
    }
  }
  const __m512 dw = _mm512_maskz_cvtph_ps(
      0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));  // (maskz: no -Wmaybe-uninitialized)
  const __m512 pr = qd_opaque(
      _mm512_mul_ps(qd_opaque(_mm512_mul_ps(dw, _mm512_set1_ps(xd[b]))), _mm512_maskz_cvtepi32_ps(0xFFFF, is)));
  a = _mm512_add_ps(a, pr);
}

// One activation row (xq, xd: its int8 values and block scales; xs: its block sums of q) against one slab
// (nb blocks at p): out[0..16) = the 16 rows' dot products (no bias).
template <int F>
__attribute__((target("avx512vnni"))) inline void pk_slab_row(int64_t nb, const int8_t* xq, const float* xd,
                                                              const int32_t* xs, const uint8_t* p, float* out) {
  __m512 acc[kQdLanes];
  for (auto& a : acc) a = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + kQdLanes <= nb; b += kQdLanes) {
    __builtin_prefetch(p + (b + kQdLanes) * kPackBlockBytes<F>, 0, 0);  // (the hardware prefetchers do the rest)
#pragma GCC unroll 8
    for (int64_t t = 0; t < kQdLanes; ++t) pk_block<F>(b + t, xq, xd, xs, p, acc[t]);
  }
#pragma GCC unroll 8
  for (int64_t t = 0; t < kQdLanes; ++t) {
    if (b + t < nb) pk_block<F>(b + t, xq, xd, xs, p, acc[t]);
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])),
                                 _mm512_add_ps(_mm512_add_ps(acc[4], acc[5]), _mm512_add_ps(acc[6], acc[7])));
  _mm512_storeu_ps(out, s);
}

// m activation rows (xq: k int8 apart; xd: 2 * (k / 32) floats apart, scales first; xs: k / 32 block sums apart)
// against the slabs s0 .. s1 of pw (16 * rsw bytes each): c[i * rsc + j] for 16 s0 <= j < 16 s1 (no bias). Each
// slab is read from memory once; the rows after the first find it in the cache.
template <int F>
__attribute__((target("avx512vnni"), flatten)) void q8dot_packed_slabs(int64_t m, int64_t s0, int64_t s1, int64_t k,
                                                                       const int8_t* xq, const float* xd,
                                                                       const int32_t* xs, const uint8_t* pw,
                                                                       int64_t rsw, float* c, int64_t rsc) {
  const int64_t nb = k / 32;
  for (int64_t s = s0; s < s1; ++s) {
    for (int64_t i = 0; i < m; ++i) {
      pk_slab_row<F>(nb, xq + i * k, xd + i * 2 * nb, xs + i * nb, pw + s * kPackRows * rsw,
                     c + i * rsc + s * kPackRows);
    }
  }
}
#endif

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
constexpr int64_t kPackQ6kBytes = int64_t{16} * 210;  // a Q6_K super-block of a slab

// One Q8_K activation row (xq, xd: its int8 values and super-block scales; xs: its 16-value bsums) against one
// Q6_K slab (nb super-blocks at p): out[0..16) = the 16 rows' dot products (no bias).
__attribute__((target("avx512vnni"))) inline void pk_q6k_slab_row(int64_t nb, const int8_t* xq, const float* xd,
                                                                  const int16_t* xs, const uint8_t* p, float* out) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3), m30 = _mm512_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = p + b * kPackQ6kBytes;
    __builtin_prefetch(blk + kPackQ6kBytes, 0, 0);
    const int8_t* x = xq + b * kKdValues;
    __m512i isum = _mm512_setzero_si512();
    for (int64_t g = 0; g < kKdGroups; ++g) {
      const uint8_t* q = blk + 32 + 256 + g * 192;
      const __m512i n0 = _mm512_loadu_si512(q), n1 = _mm512_loadu_si512(q + 64), h = _mm512_loadu_si512(q + 128);
      const __m512i u0 = _mm512_or_si512(_mm512_and_si512(n0, m4), _mm512_slli_epi16(_mm512_and_si512(h, m3), 4));
      const __m512i u1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), m4),
                                         _mm512_and_si512(_mm512_slli_epi16(h, 2), m30));
      const __m512i u2 = _mm512_or_si512(_mm512_and_si512(n1, m4), _mm512_and_si512(h, m30));
      const __m512i u3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi16(h, 2), m30));
      const int8_t* xg = x + g * 16;
      int32_t x0, x1, x2, x3;
      std::memcpy(&x0, xg, 4);
      std::memcpy(&x1, xg + 4, 4);
      std::memcpy(&x2, xg + 8, 4);
      std::memcpy(&x3, xg + 12, 4);
      __m512i gs = _mm512_set1_epi32(-32 * int32_t{xs[b * kKdGroups + g]});
      gs = _mm512_dpbusd_epi32(gs, u0, _mm512_set1_epi32(x0));
      gs = _mm512_dpbusd_epi32(gs, u1, _mm512_set1_epi32(x1));
      gs = _mm512_dpbusd_epi32(gs, u2, _mm512_set1_epi32(x2));
      gs = _mm512_dpbusd_epi32(gs, u3, _mm512_set1_epi32(x3));
      const __m512i sc =
          _mm512_maskz_cvtepi8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + g * 16)));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(gs, sc));
    }
    // kd_add_block (no mins) lane for lane: acc + (d_w * d_x) * float(isum_b), each product rounded apart
    const __m512 dw = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 pr = qd_opaque(
        _mm512_mul_ps(qd_opaque(_mm512_mul_ps(dw, _mm512_set1_ps(xd[b]))), _mm512_maskz_cvtepi32_ps(0xFFFF, isum)));
    acc = qd_opaque(_mm512_add_ps(acc, pr));
  }
  _mm512_storeu_ps(out, acc);
}

constexpr int64_t kPackQ4kBytes = int64_t{16} * 144;  // a Q4_K super-block of a slab

// One Q8_K activation row against one Q4_K slab (as pk_q6k_slab_row). The slab's super-block: the 16 rows'
// float16 d, then dmin (32 bytes each), GGML's 12 bytes of six-bit scales and mins byte by byte (byte t of
// the 16 rows at 64 + 16 t), then 32 vectors of 16 rows x 4 values: vector i holds values 4i .. 4i + 3 in its
// low nibbles and 128 + 4i .. in its high ones. Scales and mins are decoded in 16-row byte lanes.
__attribute__((target("avx512vnni"))) inline void pk_q4k_slab_row(int64_t nb, const int8_t* xq, const float* xd,
                                                                  const int16_t* xs, const uint8_t* p, float* out) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m128i m63 = _mm_set1_epi8(63), l4 = _mm_set1_epi8(15), h2 = _mm_set1_epi8(3);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = p + b * kPackQ4kBytes;
    __builtin_prefetch(blk + kPackQ4kBytes, 0, 0);
    const int8_t* x = xq + b * kKdValues;
    const int16_t* bs = xs + b * kKdGroups;
    __m128i sb[12];
    for (int64_t t = 0; t < 12; ++t) sb[t] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * t));
    __m512i sc[8], isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
    for (int64_t j = 0; j < 8; ++j) {  // GGML's get_scale_min_k4, 16 rows at once
      __m128i s8, m8;
      if (j < 4) {
        s8 = _mm_and_si128(sb[j], m63);
        m8 = _mm_and_si128(sb[j + 4], m63);
      } else {
        s8 = _mm_or_si128(_mm_and_si128(sb[j + 4], l4),
                          _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(sb[j - 4], 6), h2), 4));
        m8 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(sb[j + 4], 4), l4),
                          _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(sb[j], 6), h2), 4));
      }
      sc[j] = _mm512_maskz_cvtepu8_epi32(0xFFFF, s8);
      const __m512i mn = _mm512_maskz_cvtepu8_epi32(0xFFFF, m8);
      msum = _mm512_add_epi32(msum,
                              _mm512_mullo_epi32(mn, _mm512_set1_epi32(int32_t{bs[2 * j]} + int32_t{bs[2 * j + 1]})));
    }
    for (int64_t s = 0; s < 4; ++s) {  // sub-blocks s (low nibbles) and s + 4 (high)
      __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
      for (int64_t c = 0; c < 8; ++c) {
        const __m512i v = _mm512_loadu_si512(blk + 256 + (8 * s + c) * 64);
        int32_t xl, xh;
        std::memcpy(&xl, x + 32 * s + 4 * c, 4);
        std::memcpy(&xh, x + 128 + 32 * s + 4 * c, 4);
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, m4), _mm512_set1_epi32(xl));
        hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4), _mm512_set1_epi32(xh));
      }
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(lo, sc[s]));
      isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(hi, sc[s + 4]));
    }
    // kd_add_block with mins, lane for lane
    const __m512 dx = _mm512_set1_ps(xd[b]);
    const __m512 dw = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512 dm = _mm512_maskz_cvtph_ps(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    __m512 pr = qd_opaque(_mm512_mul_ps(qd_opaque(_mm512_mul_ps(dw, dx)), _mm512_maskz_cvtepi32_ps(0xFFFF, isum)));
    pr = qd_opaque(_mm512_sub_ps(
        pr, qd_opaque(_mm512_mul_ps(qd_opaque(_mm512_mul_ps(dm, dx)), _mm512_maskz_cvtepi32_ps(0xFFFF, msum)))));
    acc = qd_opaque(_mm512_add_ps(acc, pr));
  }
  _mm512_storeu_ps(out, acc);
}

// m Q8_K activation rows (xq: k int8 apart; xd: k / 256 scales apart; xs: k / 16 bsums apart) against the slabs
// s0 .. s1 of pw (16 * rsw bytes each) through ROW (pk_q4k_slab_row, pk_q6k_slab_row): c[i * rsc + j] for
// 16 s0 <= j < 16 s1 (no bias).
template <void (*ROW)(int64_t, const int8_t*, const float*, const int16_t*, const uint8_t*, float*)>
__attribute__((target("avx512vnni"), flatten)) void q8kdot_packed_slabs(int64_t m, int64_t s0, int64_t s1, int64_t k,
                                                                        const int8_t* xq, const float* xd,
                                                                        const int16_t* xs, const uint8_t* pw,
                                                                        int64_t rsw, float* c, int64_t rsc) {
  const int64_t nb = k / kKdValues;
  for (int64_t s = s0; s < s1; ++s) {
    for (int64_t i = 0; i < m; ++i) {
      ROW(nb, xq + i * k, xd + i * nb, xs + i * (k / 16), pw + s * kPackRows * rsw, c + i * rsc + s * kPackRows);
    }
  }
}
#endif

// The table's repacked-rows kernel for the super-block format F: q4_k and q6_k on the AVX-512 table of a CPU with
// AVX512_VNNI, else none.
template <int F>
auto q8kdot_packed_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const int8_t*, const float*, const int16_t*,
                                        const uint8_t*, int64_t, float*, int64_t) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if constexpr (F == kQ6K || F == kQ4K) {
    if (::kael::cpu_features().avx512_vnni)
      return F == kQ6K ? q8kdot_packed_slabs<pk_q6k_slab_row> : q8kdot_packed_slabs<pk_q4k_slab_row>;
  }
#endif
  return nullptr;
}

// The table's repacked-rows kernel for format F: q8_0, q4_0, q5_0 and iq4_nl on the AVX-512 table of a CPU with
// AVX512_VNNI, else none (the weight is then never repacked).
template <int F>
auto q8dot_packed_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const int8_t*, const float*, const int32_t*,
                                       const uint8_t*, int64_t, float*, int64_t) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if constexpr (F == 0 || F == 1 || F == 5 || F == 7) {
    if (::kael::cpu_features().avx512_vnni) return q8dot_packed_slabs<F>;
  }
#endif
  return nullptr;
}
