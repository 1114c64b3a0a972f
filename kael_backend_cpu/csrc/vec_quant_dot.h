// The integer path of quantized_linear (NOTE [integer quantized linear] in quant.cpp): dot
// products of activation rows quantized to GGML's Q8_0 blocks (int8 q, float32 scale d_x: the
// float16 scale GGML stores, widened; for Q4_1 / Q5_1 weights also Q8_1's sum s_x) with Q8_0 /
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL weight rows, as llama.cpp pairs them.
//
// NOTE [integer dot order]: for each 32-value block b, isum_b = sum of q_w * q_x in int32
// (exact: |isum| <= 32 * 128 * 127); its product p_b = (d_w * d_x) * float(isum_b) in float32
// (d_w * d_x is exact: two 11-bit significands; one rounding for the second product, never
// fused into the add); for q4_1 / q5_1 (value d_w * q + m_w) then p_b = p_b + m_w * s_x, s_x
// the activation block's Q8_1 sum (d_x * sum q_x as GGML rounds it), each product rounded
// apart. p_b is added into lane b % 8 of eight float32 accumulators starting at +0, blocks in
// order (blocks past the row's end, up to a multiple of 8, add +0); then
// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), then the bias. Every table computes exactly
// this, so results are the same bits on every ISA, thread count and number of rows.
// Pasted inside the per-ISA namespace by vec_table.h: no includes.
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
// F's values are d * q + m (q4_1, q5_1: unsigned q): a block adds m * s_x, s_x = d_x * sum(q_x) (Q8_1's s).
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

// The portable kernel: MR <= 16 activation rows (xq: k int8 apart; xd: nb scales apart) against
// one weight row w, out[r * rso] = the dot products (no bias); each block's integers are unpacked
// once for the rows.
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
    float mw = 0.0f;
    if constexpr (kQdMin<F>) {
      std::memcpy(&dbits, blk + 2, 2);
      mw = half_to_float_s(dbits);
    }
    for (int64_t r = 0; r < mr; ++r) {
      const int8_t* x = xq + r * k + b * 32;
      int32_t isum = 0;
      for (int j = 0; j < 32; ++j) isum += int32_t{q[j]} * int32_t{x[j]};
      float p = qd_opaque((dw * xd[r * 2 * nb + b]) * static_cast<float>(isum));
      if constexpr (kQdMin<F>) p = qd_opaque(p + qd_opaque(mw * xd[r * 2 * nb + nb + b]));
      acc[r][b % kQdLanes] += p;
    }
  }
  for (int64_t r = 0; r < mr; ++r) out[r * rso] = qd_lane_sum(acc[r]);
}

#if defined(__AVX2__)
// The 32 signed weight integers of block blk as one vector (qd_weight_ints' values).
template <int F>
inline __m256i qd_weight_vec(const uint8_t* blk) {
  if constexpr (F == 0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  } else {
    const uint8_t* qs = blk + (F == 5 || F == 4 ? (F == 5 ? 6 : 4) : F == 6 ? 8 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
    if constexpr (F == 7) {
      const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
      return _mm256_set_m128i(_mm_shuffle_epi8(levels, hi), _mm_shuffle_epi8(levels, lo));
    } else if constexpr (F == 4) {
      return _mm256_set_m128i(hi, lo);
    } else if constexpr (F == 5 || F == 6) {
      // byte i of the vector = bit i of qh (as 0 / 0xFF), then 16 there
      uint32_t qh;
      std::memcpy(&qh, blk + (F == 5 ? 2 : 4), 4);
      const __m256i bytes =
          _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(qh)),
                              _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
      const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
      const __m256i q = _mm256_or_si256(_mm256_set_m128i(hi, lo), high);
      return F == 5 ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q;
    } else {
      return _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
    }
  }
}

// Eight int32 partial sums of block products q_w * q_x (|q_x| <= 127), given aw = |q_w|: |q_w|
// as unsigned times q_x with q_w's sign, by maddubs (pairs <= 2 * 128 * 127: no saturation) and
// madd.
struct QdMadd {
  static inline __m256i dot(__m256i aw, __m256i w, __m256i x) {
    const __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
};

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// AVX-512 VNNI: vpdpbusd on 256-bit vectors, the same unsigned |q_w| x signed q_x products.
struct QdVnni {
  __attribute__((target("avx512vnni"))) static inline __m256i dot(__m256i aw, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, w));
  }
};
#endif

// Eight float16 bits as float32.
inline __m256 qd_halves(const uint16_t (&h)[kQdLanes]) {
  return _mm256_cvtph_ps(_mm_setr_epi16(
      static_cast<int16_t>(h[0]), static_cast<int16_t>(h[1]), static_cast<int16_t>(h[2]), static_cast<int16_t>(h[3]),
      static_cast<int16_t>(h[4]), static_cast<int16_t>(h[5]), static_cast<int16_t>(h[6]), static_cast<int16_t>(h[7])));
}

// p[0 .. cnt) and zeros (TAIL), or p[0 .. 8).
template <bool TAIL>
inline __m256 qd_load8(const float* p, int cnt) {
  if constexpr (TAIL) {
    alignas(32) float d[kQdLanes] = {};
    for (int t = 0; t < cnt; ++t) d[t] = p[t];
    return _mm256_load_ps(d);
  } else {
    (void)cnt;
    return _mm256_loadu_ps(p);
  }
}

// Blocks b0 .. b0 + 7 of MR activation rows (xq: k int8 apart; xd: 2 nb floats apart, the scales
// d then the sums s) against one weight row w: each row's eight exact block sums (hadd tree: lane t
// = block b0 + t), scaled (plus m_w * s_x for q4_1 / q5_1) and added into acc[r] (NOTE [integer
// dot order]). TAIL: only cnt < 8 blocks are left; the missing lanes add (0 * 0) * 0 = +0.
template <int F, class DOT, int MR, bool TAIL>
inline void qd_group(int64_t b0, int cnt, int64_t k, int64_t nb, const int8_t* xq, const float* xd, const uint8_t* w,
                     __m256 (&acc)[MR]) {
  constexpr int64_t kBytes = kQdBytes<F>;
  __m256i h[MR][4];
  uint16_t dw[kQdLanes], mw[kQdLanes];
  for (int t = 0; t < kQdLanes; t += 2) {
    __m256i s[2][MR];
    for (int u = 0; u < 2; ++u) {
      const int64_t b = b0 + t + u;
      if (TAIL && t + u >= cnt) {
        dw[t + u] = 0;
        mw[t + u] = 0;
        for (int r = 0; r < MR; ++r) s[u][r] = _mm256_setzero_si256();
        continue;
      }
      const uint8_t* blk = w + b * kBytes;
      __builtin_prefetch(blk + kQPrefetch, 0, 0);
      std::memcpy(&dw[t + u], blk, 2);
      if constexpr (kQdMin<F>) std::memcpy(&mw[t + u], blk + 2, 2);
      const __m256i wv = qd_weight_vec<F>(blk);
      const __m256i aw = _mm256_sign_epi8(wv, wv);
      for (int r = 0; r < MR; ++r) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + b * 32));
        s[u][r] = DOT::dot(aw, wv, x);
      }
    }
    for (int r = 0; r < MR; ++r) h[r][t / 2] = _mm256_hadd_epi32(s[0][r], s[1][r]);
  }
  const __m256 dwf = qd_halves(dw);
  __m256 mwf = _mm256_setzero_ps();
  if constexpr (kQdMin<F>) mwf = qd_halves(mw);
  for (int r = 0; r < MR; ++r) {
    const __m256i h01 = _mm256_hadd_epi32(h[r][0], h[r][1]), h23 = _mm256_hadd_epi32(h[r][2], h[r][3]);
    const __m256i isum =
        _mm256_add_epi32(_mm256_permute2x128_si256(h01, h23, 0x20), _mm256_permute2x128_si256(h01, h23, 0x31));
    const __m256 dx = qd_load8<TAIL>(xd + static_cast<int64_t>(r) * 2 * nb + b0, cnt);
    __m256 p = qd_opaque(_mm256_mul_ps(_mm256_mul_ps(dwf, dx), _mm256_cvtepi32_ps(isum)));
    if constexpr (kQdMin<F>) {
      const __m256 sx = qd_load8<TAIL>(xd + static_cast<int64_t>(r) * 2 * nb + nb + b0, cnt);
      p = qd_opaque(_mm256_add_ps(p, qd_opaque(_mm256_mul_ps(mwf, sx))));
    }
    acc[r] = _mm256_add_ps(acc[r], p);
  }
}

// MR activation rows against one weight row: out[r * rso] = the dot products (no bias).
template <int F, class DOT, int MR>
inline void qd_tile_avx2(int64_t nb, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w, float* out,
                         int64_t rso) {
  __m256 acc[MR];
  for (auto& a : acc) a = _mm256_setzero_ps();
  int64_t b0 = 0;
  for (; b0 + kQdLanes <= nb; b0 += kQdLanes) qd_group<F, DOT, MR, false>(b0, kQdLanes, k, nb, xq, xd, w, acc);
  if (b0 < nb) qd_group<F, DOT, MR, true>(b0, static_cast<int>(nb - b0), k, nb, xq, xd, w, acc);
  for (int r = 0; r < MR; ++r) {
    alignas(32) float lanes[kQdLanes];
    _mm256_store_ps(lanes, acc[r]);
    out[r * rso] = qd_lane_sum(lanes);
  }
}
#endif

// c[i * rsc + j] = activation row i . weight row j (+ bias[j]) for i < m, j < n: activation row i
// is xq + i * k int8 with its k / 32 scales d at xd + i * 2 * (k / 32), then its k / 32 sums s
// (Q8_1's d_x * sum q_x, float16-rounded); weight row j at w + j * rsw bytes. Each weight
// row is read from memory once for the m rows (tiles of four rows share its loads). DOT: QdMadd /
// QdVnni (AVX2 tables), void: portable.
template <int F, class DOT>
inline void q8dot_rows(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                       int64_t rsw, const float* bias, float* c, int64_t rsc) {
  const int64_t nb = k / 32;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = w + j * rsw;
    if constexpr (std::is_void_v<DOT>) {
      qd_rows_plain<F>(m, nb, k, xq, xd, row, c + j, rsc);
    } else {
#if defined(__AVX2__)
      int64_t i = 0;
      for (; i + 4 <= m; i += 4) qd_tile_avx2<F, DOT, 4>(nb, k, xq + i * k, xd + i * 2 * nb, row, c + i * rsc + j, rsc);
      switch (m - i) {
        case 3:
          qd_tile_avx2<F, DOT, 3>(nb, k, xq + i * k, xd + i * 2 * nb, row, c + i * rsc + j, rsc);
          break;
        case 2:
          qd_tile_avx2<F, DOT, 2>(nb, k, xq + i * k, xd + i * 2 * nb, row, c + i * rsc + j, rsc);
          break;
        case 1:
          qd_tile_avx2<F, DOT, 1>(nb, k, xq + i * k, xd + i * 2 * nb, row, c + i * rsc + j, rsc);
          break;
        default:
          break;
      }
#endif
    }
    if (bias != nullptr) {
      for (int64_t i = 0; i < m; ++i) c[i * rsc + j] += bias[j];
    }
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
