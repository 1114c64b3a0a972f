// The integer path of quantized_linear for GGML's 256-value super-blocks (NOTE [integer quantized
// linear] in quant.cpp): dot products of activation rows quantized to GGML's Q8_K blocks (per 256
// values: int8 q, a float32 scale d_x, and bsums, the sums of q over each 16 values) with Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS weight rows, as llama.cpp pairs them (vec_dot_type Q8_K).
// The weights' layouts are vec_quant_k.h's (GGML's ggml-common.h).
//
// NOTE [integer K dot order]: for each super-block b of a row (256 values; the weight's
// integers q_w, its integer scales sc (one per 16 values; the formats with one per 32 give both
// halves the same) and, for q2_k / q4_k / q5_k, its integer mins mn likewise):
//   isum_b = sum over the 16 groups g of sc_g * (sum of the group's 16 q_w * q_x)      (int32)
//   msum_b = sum over g of mn_g * bsums_g                                              (int32)
// both exact (|isum_b| <= 256 * 127 * 32 * 128 < 2^27, q6_k's worst, iq4_xs's 256 * 127 * 127 * 32 next); the scales
// are the formats' integers as ggml's generic kernels use them (q3_k, iq4_xs: the six-bit scale - 32; q6_k: the int8
// scale; q2_k: the low nibble; q4_k / q5_k: the six-bit scale). Then in float32, every product rounded apart (never
// fused into an add):
//   p_b = (d_w * d_x) * float(isum_b)                              q3_k, q6_k, iq4_xs
//   p_b = (d_w * d_x) * float(isum_b) - (dmin_w * d_x) * float(msum_b)   q2_k, q4_k, q5_k
// (d_w, dmin_w: the super-block's float16 scales widened; float(isum) rounds to nearest even
// where |isum| > 2^24). A row's p_b are added into one float32 accumulator starting at +0,
// super-blocks in order, then the bias. ggml's generic kernels take the same integer sums and
// scale products, but spread the q3..q6_k products over eight float lanes and scale iq4_xs's
// 32-value sums in float (its AVX2 kernel sums them in int32 as here); only the float rounding
// of those steps differs. Every table computes exactly this (the integers exactly, whatever
// instructions sum them; the floats by the same scalar operations), so results are the same bits
// on every ISA, thread count and number of rows.
// Pasted inside the per-ISA namespace by vec_table.h after vec_quant_k.h and vec_quant_dot.h
// (qd_opaque): no includes.
#pragma once

constexpr int64_t kKdValues = 256;  // values a super-block
constexpr int64_t kKdGroups = 16;   // 16-value groups a super-block (one bsum each)

// One weight super-block decoded to integers: value i = d * sc[i / 16] * q[i] - dmin * mn[i / 16].
struct KdBlock {
  int8_t q[kKdValues];
  int32_t sc[kKdGroups];
  int32_t mn[kKdGroups];
  float d;
  float dmin;
};

// GGML's packing of eight six-bit scales and eight six-bit mins in 12 bytes (q4_k, q5_k).
inline void kd_scales_mins6(const uint8_t* p, int32_t (&sc)[kKdGroups], int32_t (&mn)[kKdGroups]) {
  for (int j = 0; j < 8; ++j) {
    int32_t s, m;
    if (j < 4) {
      s = p[j] & 63;
      m = p[j + 4] & 63;
    } else {
      s = (p[j + 4] & 15) | ((p[j - 4] >> 6) << 4);
      m = (p[j + 4] >> 4) | ((p[j] >> 6) << 4);
    }
    const int g = 2 * j;  // groups g and g + 1 share the 32 values' scale and min
    sc[g] = sc[g + 1] = s;
    mn[g] = mn[g + 1] = m;
  }
}

// Super-block sb of format F as integers (F: a kQSuper format, vec_quant_k.h).
template <int F>
inline void kd_unpack(const uint8_t* sb, KdBlock& o) {
  o.dmin = 0.0f;
  if constexpr (F == kQ2K) {  // scales[16], qs[64], d, dmin; value 128h + 32j + l: (qs[32h + l] >> 2j) & 3
    for (int g = 0; g < kKdGroups; ++g) {
      o.sc[g] = sb[g] & 15;
      o.mn[g] = sb[g] >> 4;
    }
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l)
          o.q[128 * h + 32 * j + l] = static_cast<int8_t>((sb[16 + 32 * h + l] >> (2 * j)) & 3);
      }
    }
    o.d = kq_half(sb + 80);
    o.dmin = kq_half(sb + 82);
  } else if constexpr (F == kQ3K) {  // hmask[32], qs[64], scales[12], d: q - (bit 4h + j of hmask[l] ? 0 : 4)
    const uint8_t* s = sb + 96;
    for (int g = 0; g < kKdGroups; ++g) {
      const int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
      const int hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
      o.sc[g] = (lo | (hi << 4)) - 32;
      o.mn[g] = 0;
    }
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int q = (sb[32 + 32 * h + l] >> (2 * j)) & 3;
          const int high = (sb[l] >> (4 * h + j)) & 1;
          o.q[128 * h + 32 * j + l] = static_cast<int8_t>(q - (high != 0 ? 0 : 4));
        }
      }
    }
    o.d = kq_half(sb + 108);
  } else if constexpr (F == kQ4K || F == kQ5K) {  // d, dmin, scales[12], (q5_k: qh[32]), qs[128]
    kd_scales_mins6(sb + 4, o.sc, o.mn);
    const uint8_t* qs = sb + (F == kQ4K ? 16 : 48);
    for (int c = 0; c < 8; ++c) {
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * (c / 2) + l] >> (4 * (c % 2))) & 15;
        if constexpr (F == kQ5K) q |= ((sb[16 + l] >> c) & 1) << 4;
        o.q[32 * c + l] = static_cast<int8_t>(q);
      }
    }
    o.d = kq_half(sb);
    o.dmin = kq_half(sb + 2);
  } else if constexpr (F == kQ6K) {  // ql[128], qh[64], int8 scales[16], d
    for (int g = 0; g < kKdGroups; ++g) {
      o.sc[g] = static_cast<int8_t>(sb[192 + g]);
      o.mn[g] = 0;
    }
    for (int h = 0; h < 2; ++h) {
      for (int t = 0; t < 4; ++t) {
        for (int l = 0; l < 32; ++l) {
          const int lo = (sb[64 * h + 32 * (t & 1) + l] >> (t < 2 ? 0 : 4)) & 15;
          const int hi = (sb[128 + 32 * h + l] >> (2 * t)) & 3;
          o.q[128 * h + 32 * t + l] = static_cast<int8_t>((lo | (hi << 4)) - 32);
        }
      }
    }
    o.d = kq_half(sb + 208);
  } else {
    static_assert(F == kIQ4XS, "a super-block format without an integer decoder");
    uint16_t sh;  // d, scales_h, scales_l[4], qs[128]
    std::memcpy(&sh, sb + 2, 2);
    for (int c = 0; c < 8; ++c) {
      const int ls = ((sb[4 + c / 2] >> (4 * (c % 2))) & 15) | (((sh >> (2 * c)) & 3) << 4);
      const int g = 2 * c;
      o.sc[g] = o.sc[g + 1] = ls - 32;
      o.mn[g] = o.mn[g + 1] = 0;
      for (int j = 0; j < 16; ++j) {
        o.q[32 * c + j] = kIq4nlValues[sb[8 + 16 * c + j] & 15];
        o.q[32 * c + 16 + j] = kIq4nlValues[sb[8 + 16 * c + j] >> 4];
      }
    }
    o.d = kq_half(sb);
  }
}

// sum over the 16 groups g of sc[g] * (sum of the group's 16 products q[i] * x[i]), exact in int32
// (lane l of acc takes value 16g + l of every group: the order of integer sums is free).
inline int32_t kd_isum(const int8_t* q, const int8_t* x, const int32_t (&sc)[kKdGroups]) {
  int32_t acc[16] = {};
  for (int g = 0; g < kKdGroups; ++g) {
    for (int l = 0; l < 16; ++l) acc[l] += sc[g] * (int32_t{q[16 * g + l]} * int32_t{x[16 * g + l]});
  }
  int32_t s = 0;
  for (int l = 0; l < 16; ++l) s += acc[l];
  return s;
}

// acc + p_b, p_b from a super-block's integer sums isum and msum (msum: q2_k, q4_k, q5_k only) by
// NOTE [integer K dot order]: every table's kernel takes its float steps from here.
template <int F>
inline float kd_add_block(float acc, float d, float dmin, float dx, int32_t isum, int32_t msum) {
  float p = qd_opaque(qd_opaque(d * dx) * static_cast<float>(isum));
  if constexpr (kQSuperMin<F>) {
    p = qd_opaque(p - qd_opaque(qd_opaque(dmin * dx) * static_cast<float>(msum)));
  } else {
    (void)dmin;
    (void)msum;
  }
  return qd_opaque(acc + p);
}

// The portable kernel's pieces for kd_rows: a super-block decoded to a KdBlock, its sums by kd_isum.
struct KdPlain {
  using Block = KdBlock;
  template <int F>
  static void unpack(const uint8_t* sb, KdBlock& o) {
    kd_unpack<F>(sb, o);
  }
  // isum_b and msum_b (NOTE [integer K dot order]) of blk and an activation super-block (x: 256
  // int8; bs: its 16 bsums).
  template <int F>
  static void sums(const KdBlock& blk, const int8_t* x, const int16_t* bs, int32_t& isum, int32_t& msum) {
    isum = kd_isum(blk.q, x, blk.sc);
    msum = 0;
    if constexpr (kQSuperMin<F>) {
      for (int g = 0; g < kKdGroups; ++g) msum += blk.mn[g] * int32_t{bs[g]};
    }
  }
};

// c[i * rsc + j] = Q8_K activation row i . weight row j (+ bias[j]) for i < m <= 16, j < n, by NOTE
// [integer K dot order]: activation row i is xq + i * k int8, its k / 256 scales at xd + i * (k / 256)
// and its k / 16 bsums at xs + i * (k / 16); weight row j at w + j * rsw bytes. Each weight
// super-block is unpacked once for the m rows (K::unpack into a K::Block with its d and dmin), and
// K::sums gives its integer sums with each row: KdPlain here, vec_quant_dot_k_simd.h's vector kernels.
template <int F, class K>
inline void kd_rows(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const int16_t* xs,
                    const uint8_t* w, int64_t rsw, const float* bias, float* c, int64_t rsc) {
  constexpr int64_t kBytes = ::kael::quant_block_bytes(static_cast<::kael::QuantScheme>(F));
  const int64_t nb = k / kKdValues;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = w + j * rsw;
    float acc[16] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* sb = row + b * kBytes;
      for (int64_t t = 0; t < kBytes; t += 64) __builtin_prefetch(sb + kBytes + t, 0, 0);  // the next super-block
      typename K::Block blk;
      K::template unpack<F>(sb, blk);
      for (int64_t r = 0; r < m; ++r) {
        int32_t isum, msum;
        K::template sums<F>(blk, xq + r * k + b * kKdValues, xs + r * (k / kKdGroups) + b * kKdGroups, isum, msum);
        acc[r] = kd_add_block<F>(acc[r], blk.d, blk.dmin, xd[r * nb + b], isum, msum);
      }
    }
    for (int64_t r = 0; r < m; ++r) c[r * rsc + j] = bias != nullptr ? acc[r] + bias[j] : acc[r];
  }
}

// The portable kernel (the baseline table's): kd_rows with KdPlain.
template <int F>
void q8kdot_rows(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd, const int16_t* xs,
                 const uint8_t* w, int64_t rsw, const float* bias, float* c, int64_t rsc) {
  kd_rows<F, KdPlain>(m, n, k, xq, xd, xs, w, rsw, bias, c, rsc);
}
