// The integer path's kernels for Q4_1 / Q5_1 weights (Q8_1 activations) in ggml's own order: the portable
// qg_rows_plain and the AVX2 / AVX-512 VNNI qg_rows_avx2, the same bits on every table.
//
// NOTE [ggml q8_1 dot order]: llama.cpp takes every Q4_1 / Q5_1 dot product, decode and prompt alike, through
// ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q5_1_q8_1 (no repacked or sgemm path takes these formats), whose x86 code
// (AVX2, AVX-VNNI and AVX-512 VNNI alike) fixes this float order, which these kernels compute for a weight row and an
// activation row: eight float32 lanes a_0 .. a_7 and a scalar t, all from +0; for each 32-value block b in order,
// L_bj = the int32 sum of q_w * q_x over values 4j .. 4j + 3 (exact: |L| <= 4 * 31 * 127), and
// a_j = fma(d_w * d_x, float(L_bj), a_j) (d_w * d_x exact: two float16 significands; one rounding), and
// t = t + m_w * s_x (m_w * s_x exact likewise; s_x the activation block's Q8_1 sum); the result is
// (((a_0 + a_4) + (a_2 + a_6)) + ((a_1 + a_5) + (a_3 + a_7))) + t, then the bias. Matching it, rather than NOTE
// [integer dot order]'s lanes by block, took llama.cpp agreement on a llama-quantize Q4_1 file from 282 to 287 of 288
// teacher-forced top tokens (tests/core/test_gguf_llama_quantize.py): a Q4_1 block's d * q + m terms cancel,
// so last-bit order differences show there first. Each row is computed alone (rows of a call share weight loads
// only), so rows are the same bits batched and alone, on every thread count.
// Pasted inside the per-ISA namespace by vec_table.h through vec_quant_dot.h: no includes.
#pragma once

// F's dot products follow NOTE [ggml q8_1 dot order] (q4_1, q5_1) instead of NOTE [integer dot order].
template <int F>
constexpr bool kQdGgml = F == 4 || F == 6;

// NOTE [ggml q8_1 dot order]'s final sum of the lanes and t.
inline float qg_lane_sum(const float (&a)[kQdLanes], float t) {
  return (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) + t;
}

// The portable kernel: MR <= 16 activation rows (xq: k int8 apart; xd: a row's nb scales d_x, then its nb sums s_x)
// against one weight row w, out[r * rso] = the dot products (no bias). std::fma rounds once on every table.
template <int F>
inline void qg_rows_plain(int64_t mr, int64_t nb, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                          float* out, int64_t rso) {
  static_assert(kQdGgml<F>, "q4_1, q5_1");
  constexpr int64_t kBytes = kQdBytes<F>;
  float acc[16][kQdLanes] = {};
  float t[16] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = w + b * kBytes;
    int8_t q[32];
    qd_weight_ints<F>(blk, q);
    uint16_t bits;
    std::memcpy(&bits, blk, 2);
    const float dw = half_to_float_s(bits);
    std::memcpy(&bits, blk + 2, 2);
    const float mw = half_to_float_s(bits);
    for (int64_t r = 0; r < mr; ++r) {
      const int8_t* x = xq + r * k + b * 32;
      const float c = dw * xd[r * 2 * nb + b];
      for (int j = 0; j < kQdLanes; ++j) {
        int32_t lane = 0;
        for (int i = 4 * j; i < 4 * j + 4; ++i) lane += int32_t{q[i]} * int32_t{x[i]};
        acc[r][j] = std::fma(c, static_cast<float>(lane), acc[r][j]);
      }
      t[r] += mw * xd[r * 2 * nb + nb + b];  // the product is exact: fused or not, one rounding
    }
  }
  for (int64_t r = 0; r < mr; ++r) out[r * rso] = qg_lane_sum(acc[r], t[r]);
}

#if defined(__AVX2__)
// Weight block blk's 32 integers, value i in byte i: the nibbles (Q4_1: low nibbles are values 0..15, high ones
// 16..31) and, for Q5_1, bit i of qh as bit 4 of value i.
template <int F>
inline __m256i qg_block_ints(const uint8_t* blk) {
  constexpr int kQs = F == 4 ? 4 : 8;
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
  __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
  if constexpr (F == 6) {
    uint32_t qh;
    std::memcpy(&qh, blk + 4, 4);
    const __m256i sixteen = _mm256_set1_epi8(16);
#if KAEL_VBYTES == 64 && defined(__AVX512BW__) && defined(__AVX512VL__)
    u = _mm256_mask_add_epi8(u, static_cast<__mmask32>(qh), u, sixteen);
#else
    // byte i = byte i / 8 of qh, then its bit i % 8 tested
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i by = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(qh)), sel), bit);
    u = _mm256_or_si256(u, _mm256_and_si256(_mm256_cmpeq_epi8(by, bit), sixteen));
#endif
  }
  return u;
}

// NOTE [ggml q8_1 dot order]'s final sum of an accumulator vector and t: hsum as ggml's hsum_float_8.
inline float qg_lane_sum_vec(__m256 a, float t) {
  __m128 s = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));  // a_j + a_{j+4}
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                         // (0 + 2), (1 + 3)
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s) + t;
}

// The group's d_w and m_w (each block's first four bytes: float16 d, then float16 m), blocks B bytes apart, in block
// order, as float32; blocks at or past cnt read as 0. One 32-bit load a block, then the even and odd halves apart.
// (AVX-512's two-window word permute, which qd_group_halves takes for Q4_1's 20-byte blocks, measured 1.3-1.8x
// slower in this kernel.)
template <int64_t B, bool TAIL>
inline void qg_scales(const uint8_t* g, int cnt, __m256& dwf, __m256& mwf) {
  alignas(32) uint32_t dm[kQdLanes] = {};
  for (int i = 0; i < (TAIL ? cnt : kQdLanes); ++i) std::memcpy(&dm[i], g + i * B, 4);
  const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(dm));
  // per 128-bit lane: the four d (even words) into bytes 0..7, the four m (odd words) into bytes 8..15
  const __m256i split = _mm256_shuffle_epi8(v, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0,
                                                                1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  const __m256i ordered = _mm256_permute4x64_epi64(split, 0xD8);  // d0..d7, then m0..m7
  dwf = _mm256_cvtph_ps(_mm256_castsi256_si128(ordered));
  mwf = _mm256_cvtph_ps(_mm256_extracti128_si256(ordered, 1));
}

// Eight floats from p (TAIL: the first cnt, then zeros).
template <bool TAIL>
inline __m256 qg_load8(const float* p, int cnt) {
  if constexpr (TAIL) {
    alignas(32) float v[kQdLanes] = {};
    for (int i = 0; i < cnt; ++i) v[i] = p[i];
    return _mm256_load_ps(v);
  } else {
    (void)cnt;
    return _mm256_loadu_ps(p);
  }
}

// Group g (blocks 8g .. 8g + cnt - 1; TAIL: cnt < 8) of NW weight rows (w, rsw bytes apart) against MR activation
// rows from row r0, continuing acc and t in block order. The scale products of the group's blocks are taken in
// vectors first (d_w * d_x and m_w * s_x: exact either way), then each block's lanes are fused into acc one block
// after another and its m_w * s_x added to t, as NOTE [ggml q8_1 dot order] orders them.
template <int F, class DOT, int MR, int NW, bool TAIL>
inline void qg_group(int64_t g, int cnt, int64_t nb, int64_t k, const int8_t* xq, const float* xd, int64_t r0,
                     const uint8_t* w, int64_t rsw, __m256 (&acc)[NW][MR], float (&t)[NW][MR]) {
  constexpr int64_t kBytes = kQdBytes<F>;
  alignas(32) float cs[NW][MR][kQdLanes];
  alignas(32) float ms[NW][MR][kQdLanes];
  const uint8_t* gw[NW];
  for (int v = 0; v < NW; ++v) {
    gw[v] = w + v * rsw + g * kQdLanes * kBytes;
    for (int64_t off = 0; off < kQdLanes * kBytes; off += 64) __builtin_prefetch(gw[v] + off + kQPrefetch, 0, 0);
    __m256 dwf, mwf;
    qg_scales<kBytes, TAIL>(gw[v], cnt, dwf, mwf);
    for (int r = 0; r < MR; ++r) {
      const float* xr = xd + (r0 + r) * 2 * nb + g * kQdLanes;
      _mm256_store_ps(cs[v][r], _mm256_mul_ps(dwf, qg_load8<TAIL>(xr, cnt)));
      _mm256_store_ps(ms[v][r], _mm256_mul_ps(mwf, qg_load8<TAIL>(xr + nb, cnt)));
    }
  }
  for (int i = 0; i < cnt; ++i) {
    __m256i x[MR];
    for (int r = 0; r < MR; ++r) {
      x[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (r0 + r) * k + (g * kQdLanes + i) * 32));
    }
    for (int v = 0; v < NW; ++v) {
      const __m256i u = qg_block_ints<F>(gw[v] + i * kBytes);
      for (int r = 0; r < MR; ++r) {
        const __m256 lanes = _mm256_cvtepi32_ps(DOT::dot32(u, x[r]));
        acc[v][r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&cs[v][r][i]), lanes, acc[v][r]);
        t[v][r] += ms[v][r][i];
      }
    }
  }
}

// MR activation rows (from row r0) against NW weight rows (w, rsw bytes apart): out[r * rso + v * vso] = the dot
// products (no bias). The NW weight rows share the activation loads; the MR rows share the weight integers.
template <int F, class DOT, int MR, int NW>
inline void qg_tile_avx2(int64_t nb, int64_t k, const int8_t* xq, const float* xd, int64_t r0, const uint8_t* w,
                         int64_t rsw, float* out, int64_t rso, int64_t vso) {
  __m256 acc[NW][MR];
  float t[NW][MR];
  for (int v = 0; v < NW; ++v) {
    for (int r = 0; r < MR; ++r) {
      acc[v][r] = _mm256_setzero_ps();
      t[v][r] = 0.0f;
    }
  }
  int64_t g = 0;
  for (; (g + 1) * kQdLanes <= nb; ++g) {
    qg_group<F, DOT, MR, NW, false>(g, kQdLanes, nb, k, xq, xd, r0, w, rsw, acc, t);
  }
  if (g * kQdLanes < nb) {
    qg_group<F, DOT, MR, NW, true>(g, static_cast<int>(nb - g * kQdLanes), nb, k, xq, xd, r0, w, rsw, acc, t);
  }
  for (int v = 0; v < NW; ++v) {
    for (int r = 0; r < MR; ++r) out[r * rso + v * vso] = qg_lane_sum_vec(acc[v][r], t[v][r]);
  }
}

// q8dot_rows (vec_quant_dot.h) for Q4_1 / Q5_1 on the vector tables. One activation row: four weight rows at a
// time, j, j + n / 4, j + n / 2 and j + 3 n / 4, read as four ascending streams (which the hardware prefetchers
// follow) and four independent chains of fused adds; several rows: tiles of up to four rows per weight row.
template <int F, class DOT>
inline void qg_rows_avx2(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const uint8_t* w,
                         int64_t rsw, const float* bias, float* c, int64_t rsc) {
  const int64_t nb = k / 32;
  int64_t j = 0;
  if (m == 1) {
    const int64_t quarter = n / 4;
    for (; j < quarter; ++j) {
      qg_tile_avx2<F, DOT, 1, 4>(nb, k, xq, xd, 0, w + j * rsw, quarter * rsw, c + j, rsc, quarter);
    }
    j = 4 * quarter;
  }
  for (; j < n; ++j) {
    const uint8_t* row = w + j * rsw;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) qg_tile_avx2<F, DOT, 4, 1>(nb, k, xq, xd, i, row, rsw, c + i * rsc + j, rsc, 0);
    qd_rest_rows(m - i, [&](auto mr) {
      qg_tile_avx2<F, DOT, decltype(mr)::value, 1>(nb, k, xq, xd, i, row, rsw, c + i * rsc + j, rsc, 0);
    });
  }
  qd_add_bias(m, n, bias, c, rsc);
}
#endif
