// The AVX2 / AVX-512 VNNI kernels of the integer path for the 32-value blocks (vec_quant_dot.h):
// Q8_0 activation rows . Q8_0, Q4_0, Q5_0 and IQ4_NL weight rows, the same bits as the portable
// qd_rows_plain (NOTE [integer dot order]); and the multiply-adds (QdMadd, QdVnni) that
// vec_quant_dot_q81.h's Q4_1 / Q5_1 kernels share.
//
// NOTE [integer dot in vectors]: the weight rows stay in GGML's layout; the activation rows of a
// call are rearranged once, on entry, into a QdRows (k bytes and 3 k / 32 words a row: the
// weight rows, read once each, are what costs). Blocks go in pairs (2p, 2p + 1): a pair's weight
// integers are two 32-byte vectors, lo = values 0..15 of block 2p then of block 2p + 1, hi =
// values 16..31 of both (for the nibble formats: the pair's two 16-byte quant runs side by side,
// masked, then shifted and masked; no byte shuffles), and QdRows holds each activation pair in
// that order. Each weight integer is an unsigned byte u = q + off: q4_0 nibble (off 8), q5_0
// nibble + 16 * bit (16); q8_0 and iq4_nl's signed q flipped
// to q + 128 (off 128) where the table has VNNI, else kept signed (off 0). A pair's products are
// one int32 vector, lanes 0..3 summing to block 2p's u . q_x and lanes 4..7 to block 2p + 1's:
// vpdpbusd (VNNI: four u * q_x to a lane, |lane| <= 8 * 255 * 127) or maddubs + madd (AVX2: u <=
// 31, so two maddubs' int16 pairs add without saturating, 2 * 2 * 31 * 128 < 2^15; the signed
// q8_0 / iq4_nl take maddubs(|q|, q_x with q's sign) per half, 2 * 128 * 127 < 2^15, widened
// apart). Three hadds reduce a group's four pair vectors to its eight block sums, in lane order
// kQdPerm (blocks 0, 2, 4, 6, 1, 3, 5, 7 of the group); adding -off * sum(q_x) of each block
// (QdRows.corr, same order; every partial sum stays below 2^21 in magnitude) gives exactly isum_b.
// The group's d_w are gathered in that order too (AVX-512: one word permute of two 64-byte
// windows where every scale lies in one), and QdRows holds d_x in it, so every
// float step of NOTE [integer dot order] runs lane for lane: accumulator lane t gathers the
// blocks b with b % 8 == kQdPerm[t], which makes the final tree's first level the sum of the
// accumulator's two halves (qd_lane_sum_perm). Blocks past the row's end (the last group) have
// zero scales, integers and activations: p_b = +0.
// Pasted inside the per-ISA namespace by vec_table.h through vec_quant_dot.h: no includes.
#pragma once

#if defined(__AVX2__)
// Lane t of a group's block sums (after qd_group's hadds) is block kQdPerm[t] of the group.
constexpr int kQdPerm[kQdLanes] = {0, 2, 4, 6, 1, 3, 5, 7};

// F's weight integers q as unsigned bytes q + kQdOff (NOTE [integer dot in vectors]); VNNI: the
// table multiplies with vpdpbusd, which takes any unsigned byte.
template <int F, bool VNNI>
constexpr int kQdOff = F == 1                       ? 8
                       : F == 5                     ? 16
                       : (F == 0 || F == 7) && VNNI ? 128
                                                    : 0;
// F's integers stay signed (maddubs of |q| and q_x with q's sign): q8_0 / iq4_nl without VNNI.
template <int F, bool VNNI>
constexpr bool kQdSigned = (F == 0 || F == 7) && !VNNI;

// The activation rows of one call, rearranged (NOTE [integer dot in vectors]); nb8 = blocks
// rounded up to a multiple of 8; row r's parts start at r * nb8 (x: r * nb8 * 32 bytes), the
// blocks past nb zero.
struct QdRows {
  int64_t nb8 = 0;
  std::vector<int8_t> x;      // pair p: values 0..15 of blocks 2p, 2p + 1, then values 16..31 of both
  std::vector<int32_t> corr;  // -off * sum of the block's q_x, group g's at 8g in kQdPerm order
  std::vector<float> d;       // d_x, likewise

  QdRows(int64_t m, int64_t k, const int8_t* xq, const float* xd, int off)
      : nb8((k / 32 + kQdLanes - 1) / kQdLanes * kQdLanes),
        x(static_cast<size_t>(m * nb8 * 32), 0),
        corr(static_cast<size_t>(m * nb8), 0),
        d(static_cast<size_t>(m * nb8), 0.0f) {
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int8_t* src = xq + r * k + b * 32;
        int8_t* dst = x.data() + r * nb8 * 32 + (b / 2) * 64 + (b % 2) * 16;
        std::memcpy(dst, src, 16);
        std::memcpy(dst + 32, src + 16, 16);
        const int64_t at = r * nb8 + b / kQdLanes * kQdLanes + qd_perm_lane(static_cast<int>(b % kQdLanes));
        int32_t sum = 0;
        for (int j = 0; j < 32; ++j) sum += src[j];
        corr[static_cast<size_t>(at)] = -off * sum;
        d[static_cast<size_t>(at)] = xd[r * 2 * nb + b];
      }
    }
  }

  // The lane t with kQdPerm[t] == c.
  static int qd_perm_lane(int c) { return c % 2 == 0 ? c / 2 : 4 + c / 2; }
};

// 16 bytes at p as the low half of a vector whose high half is 16 bytes at q (zero: q null).
inline __m256i qd_two(const uint8_t* p, const uint8_t* q) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i b = q == nullptr ? _mm_setzero_si128() : _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  return _mm256_set_m128i(b, a);
}

// The weight integers of blocks b0 (at p) and b1 (at q; null: past the row, zeros) as unsigned
// bytes q + kQdOff (or signed, kQdSigned): lo = values 0..15 of both blocks, hi = values 16..31.
template <int F, bool VNNI>
inline void qd_pair_ints(const uint8_t* p, const uint8_t* q, __m256i& lo, __m256i& hi) {
  if constexpr (F == 0) {
    lo = qd_two(p + 2, q == nullptr ? nullptr : q + 2);
    hi = qd_two(p + 18, q == nullptr ? nullptr : q + 18);
    if constexpr (VNNI) {
      lo = _mm256_xor_si256(lo, _mm256_set1_epi8(static_cast<char>(0x80)));
      hi = _mm256_xor_si256(hi, _mm256_set1_epi8(static_cast<char>(0x80)));
    }
  } else {
    static_assert(F == 1 || F == 5 || F == 7, "q8_0, q4_0, q5_0, iq4_nl");
    constexpr int kQs = F == 5 ? 6 : 2;
    const __m256i raw = qd_two(p + kQs, q == nullptr ? nullptr : q + kQs);
    const __m256i m4 = _mm256_set1_epi8(15);
    lo = _mm256_and_si256(raw, m4);
    hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
    if constexpr (F == 7) {
      __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
      if constexpr (VNNI) levels = _mm256_xor_si256(levels, _mm256_set1_epi8(static_cast<char>(0x80)));
      lo = _mm256_shuffle_epi8(levels, lo);
      hi = _mm256_shuffle_epi8(levels, hi);
    } else if constexpr (F == 5) {
      // bit j of qh (block 2p) and of qh' (block 2p + 1) is bit 4 of value j
      constexpr int kH = 2;
      uint32_t h0, h1 = 0;
      std::memcpy(&h0, p + kH, 4);
      if (q != nullptr) std::memcpy(&h1, q + kH, 4);
      const __m256i sixteen = _mm256_set1_epi8(16);
#if KAEL_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VL__)
      const auto mlo = static_cast<__mmask32>((h0 & 0xFFFFu) | (h1 << 16));
      const auto mhi = static_cast<__mmask32>((h0 >> 16) | (h1 & 0xFFFF0000u));
      lo = _mm256_mask_add_epi8(lo, mlo, lo, sixteen);
      hi = _mm256_mask_add_epi8(hi, mhi, hi, sixteen);
#else
      // byte i of a lane = bit i of that block's half of qh, as 16 or 0
      const __m256i hv =
          _mm256_set_m128i(_mm_set1_epi32(static_cast<int32_t>(h1)), _mm_set1_epi32(static_cast<int32_t>(h0)));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i sel_lo = _mm256_set_epi64x(0x0101010101010101LL, 0, 0x0101010101010101LL, 0);
      const __m256i sel_hi =
          _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0303030303030303LL, 0x0202020202020202LL);
      const __m256i blo = _mm256_shuffle_epi8(hv, sel_lo), bhi = _mm256_shuffle_epi8(hv, sel_hi);
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(blo, bit), bit), sixteen));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bhi, bit), bit), sixteen));
#endif
    }
  }
}

// A pair's products (NOTE [integer dot in vectors]): int32 lanes 0..3 sum to block 2p's, 4..7
// to block 2p + 1's. AVX2: maddubs and madd.
struct QdMadd {
  static constexpr bool kVnni = false;
  // unsigned u <= 31 times q_x
  static inline __m256i dot_u(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
  // signed q times q_x: |q| times q_x with q's sign, each half's int16 pairs widened apart
  static inline __m256i dot_s(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i a = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(xlo, lo)), one);
    const __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(xhi, hi)), one);
    return _mm256_add_epi32(a, b);
  }
  // one block's 32 unsigned u <= 31 (value i in byte i) times its q_x: lane j sums values 4j .. 4j + 3 (NOTE [ggml
  // q8_1 dot order]; maddubs' int16 pairs cannot saturate: 2 * 31 * 128 < 2^15)
  static inline __m256i dot32(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
  }
};

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// AVX-512 VNNI: vpdpbusd on 256-bit vectors (any unsigned byte times q_x, four to a lane).
struct QdVnni {
  static constexpr bool kVnni = true;
  __attribute__((target("avx512vnni"))) static inline __m256i dot_u(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xlo), hi, xhi);
  }
  __attribute__((target("avx512vnni"))) static inline __m256i dot_s(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    return dot_u(lo, xlo, hi, xhi);  // not used: kQdSigned is false with VNNI
  }
  __attribute__((target("avx512vnni"))) static inline __m256i dot32(__m256i u, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x);
  }
};
#endif

// The float16 scales (at offset OFF) of the group's blocks in kQdPerm order, as float32; blocks
// at or past cnt read as 0.
template <int64_t B, int OFF, bool TAIL>
inline __m256 qd_group_halves(const uint8_t* g, int cnt) {
#if KAEL_VBYTES == 64 && defined(__AVX512BW__)
  // two 64-byte windows, [0, 64) and [X, X + 64) with X the last scale's end - 64: when each
  // scale lies in one of them, one word permute gathers the eight
  constexpr int64_t kX = 7 * B + OFF + 2 - 64;
  constexpr bool kTwo = 3 * B + OFF + 2 <= 64 && 4 * B + OFF >= kX;
  if constexpr (kTwo && !TAIL) {
    (void)cnt;
    constexpr auto word = [](int c) {
      return static_cast<int16_t>(c < 4 ? (c * B + OFF) / 2 : 32 + (c * B + OFF - kX) / 2);
    };
    const __m512i idx =
        _mm512_zextsi128_si512(_mm_setr_epi16(word(kQdPerm[0]), word(kQdPerm[1]), word(kQdPerm[2]), word(kQdPerm[3]),
                                              word(kQdPerm[4]), word(kQdPerm[5]), word(kQdPerm[6]), word(kQdPerm[7])));
    const __m512i lo = _mm512_loadu_si512(g), hi = _mm512_loadu_si512(g + kX);
    // (maskz extract: GCC 12 warns of the plain cast's undefined upper source)
    return _mm256_cvtph_ps(_mm512_maskz_extracti32x4_epi32(0xF, _mm512_permutex2var_epi16(lo, idx, hi), 0));
  }
#endif
  uint16_t h[kQdLanes];
  for (int t = 0; t < kQdLanes; ++t) {
    if (TAIL && kQdPerm[t] >= cnt) {
      h[t] = 0;
    } else {
      std::memcpy(&h[t], g + kQdPerm[t] * B + OFF, 2);
    }
  }
  return _mm256_cvtph_ps(_mm_setr_epi16(
      static_cast<int16_t>(h[0]), static_cast<int16_t>(h[1]), static_cast<int16_t>(h[2]), static_cast<int16_t>(h[3]),
      static_cast<int16_t>(h[4]), static_cast<int16_t>(h[5]), static_cast<int16_t>(h[6]), static_cast<int16_t>(h[7])));
}

// NOTE [integer dot order]'s lane sum of accumulator lanes in kQdPerm order (lanes a0, a2, a4,
// a6, a1, a3, a5, a7): the halves' sum is (a0 + a1, a2 + a3, a4 + a5, a6 + a7), then pairs.
inline float qd_lane_sum_perm(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_hadd_ps(s, s);
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// Group g (blocks 8g .. 8g + 7; TAIL: only cnt < 8 left) of NW weight rows (w, rsw bytes apart)
// against MR rows of xs from row r0: for weight row v and activation row r, the eight exact
// block sums, scaled and added into acc[v][r], lane t for block
// 8g + kQdPerm[t] (NOTE [integer dot in vectors]). The NW weight rows share the activation loads.
template <int F, class DOT, int MR, int NW, bool TAIL>
inline void qd_group(int64_t g, int cnt, const QdRows& xs, int64_t r0, const uint8_t* w, int64_t rsw,
                     __m256 (&acc)[NW][MR]) {
  constexpr int64_t kBytes = kQdBytes<F>;
  constexpr bool kVnni = DOT::kVnni;
  const uint8_t* gw[NW];
  for (int v = 0; v < NW; ++v) {
    gw[v] = w + v * rsw + g * kQdLanes * kBytes;
    for (int64_t off = 0; off < kQdLanes * kBytes; off += 64) __builtin_prefetch(gw[v] + off + kQPrefetch, 0, 0);
  }
  __m256i h[NW][MR][2];
  for (int p = 0; p < 4; p += 2) {
    __m256i s[2][NW][MR];
    for (int u = 0; u < 2; ++u) {
      const int pair = p + u;
      if (TAIL && 2 * pair >= cnt) {
        for (int v = 0; v < NW; ++v) {
          for (int r = 0; r < MR; ++r) s[u][v][r] = _mm256_setzero_si256();
        }
        continue;
      }
      __m256i xlo[MR], xhi[MR];
      for (int r = 0; r < MR; ++r) {
        const int8_t* x = xs.x.data() + (r0 + r) * xs.nb8 * 32 + (g * 4 + pair) * 64;
        xlo[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
        xhi[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32));
      }
      for (int v = 0; v < NW; ++v) {
        __m256i lo, hi;
        const uint8_t* b1 = TAIL && 2 * pair + 1 >= cnt ? nullptr : gw[v] + (int64_t{2} * pair + 1) * kBytes;
        qd_pair_ints<F, kVnni>(gw[v] + int64_t{2} * pair * kBytes, b1, lo, hi);
        for (int r = 0; r < MR; ++r) {
          s[u][v][r] = kQdSigned<F, kVnni> ? DOT::dot_s(lo, xlo[r], hi, xhi[r]) : DOT::dot_u(lo, xlo[r], hi, xhi[r]);
        }
      }
    }
    for (int v = 0; v < NW; ++v) {
      for (int r = 0; r < MR; ++r) h[v][r][p / 2] = _mm256_hadd_epi32(s[0][v][r], s[1][v][r]);
    }
  }
  for (int v = 0; v < NW; ++v) {
    const __m256 dwf = qd_group_halves<kBytes, 0, TAIL>(gw[v], cnt);
    for (int r = 0; r < MR; ++r) {
      const int64_t at = (r0 + r) * xs.nb8 + g * kQdLanes;
      __m256i isum = _mm256_hadd_epi32(h[v][r][0], h[v][r][1]);
      if constexpr (kQdOff<F, kVnni> != 0) {
        isum = _mm256_add_epi32(isum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs.corr.data() + at)));
      }
      const __m256 dx = _mm256_loadu_ps(xs.d.data() + at);
      const __m256 pr = qd_opaque(_mm256_mul_ps(_mm256_mul_ps(dwf, dx), _mm256_cvtepi32_ps(isum)));
      acc[v][r] = _mm256_add_ps(acc[v][r], pr);
    }
  }
}

// MR rows of xs from row r0 against NW weight rows (w, rsw bytes apart; nb blocks each):
// out[r * rso + v * vso] = the dot products (no bias).
template <int F, class DOT, int MR, int NW>
inline void qd_tile_avx2(int64_t nb, const QdRows& xs, int64_t r0, const uint8_t* w, int64_t rsw, float* out,
                         int64_t rso, int64_t vso) {
  __m256 acc[NW][MR];
  for (auto& av : acc) {
    for (auto& a : av) a = _mm256_setzero_ps();
  }
  int64_t g = 0;
  for (; (g + 1) * kQdLanes <= nb; ++g) qd_group<F, DOT, MR, NW, false>(g, kQdLanes, xs, r0, w, rsw, acc);
  if (g * kQdLanes < nb) {
    qd_group<F, DOT, MR, NW, true>(g, static_cast<int>(nb - g * kQdLanes), xs, r0, w, rsw, acc);
  }
  for (int v = 0; v < NW; ++v) {
    for (int r = 0; r < MR; ++r) out[r * rso + v * vso] = qd_lane_sum_perm(acc[v][r]);
  }
}

// q8dot_rows (vec_quant_dot.h) on the vector tables: the activation rows rearranged once, then
// each weight row against tiles of up to four rows. One activation row: weight rows j and
// j + n / 2 go together (they share the activation loads), so the rows are read as two
// ascending streams, which the hardware prefetchers follow (rows j and j + 1 interleaved group
// by group defeat them once a row outgrows a few cache lines).
template <int F, class DOT>
inline void qd_rows_avx2(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                         int64_t rsw, const float* bias, float* c, int64_t rsc) {
  const int64_t nb = k / 32;
  const QdRows xs(m, k, xq, xd, kQdOff<F, DOT::kVnni>);
  int64_t j = 0;
  if (m == 1) {
    const int64_t half = n / 2;
    for (; j < half; ++j) qd_tile_avx2<F, DOT, 1, 2>(nb, xs, 0, w + j * rsw, half * rsw, c + j, rsc, half);
    j = 2 * half;
  }
  for (; j < n; ++j) {
    const uint8_t* row = w + j * rsw;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) qd_tile_avx2<F, DOT, 4, 1>(nb, xs, i, row, rsw, c + i * rsc + j, rsc, 0);
    qd_rest_rows(m - i, [&](auto mr) {
      qd_tile_avx2<F, DOT, decltype(mr)::value, 1>(nb, xs, i, row, rsw, c + i * rsc + j, rsc, 0);
    });
  }
  qd_add_bias(m, n, bias, c, rsc);
}
#endif
