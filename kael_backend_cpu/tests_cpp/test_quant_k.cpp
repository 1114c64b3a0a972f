// The 256-value super-block kernels (vec_quant_k.h: q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs) against
// GGML's dequantize_row_* loops written out here a super-block at a time (ggml-quants.c's order:
// the loops walk the block, not its 32-value chunks as the kernels do): dequant_row of every
// vector table equal bit for bit, qdot_rows within a float32 summation bound of the
// double-precision dot products and the same bits for a row whatever the row count (1..16),
// and super-block shapes checked by dequantize / quantized_linear.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "half.h"
#include "kernels.h"
#include "vec.h"

namespace {

using kael::DType;
using kael::QuantScheme;
using kael::View;

constexpr int64_t kQK = 256;
constexpr QuantScheme kFormats[] = {QuantScheme::Q2_K, QuantScheme::Q3_K, QuantScheme::Q4_K,
                                    QuantScheme::Q5_K, QuantScheme::Q6_K, QuantScheme::IQ4_XS};
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

std::vector<const kael::VecTable*> tables() {
  std::vector<const kael::VecTable*> t;  // every table this CPU runs
  for (const auto& name : kael::vec_tables_runnable()) t.push_back(kael::vec_table_named(name));
  return t;
}

float half_at(const uint8_t* p) {
  uint16_t h = 0;
  std::memcpy(&h, p, 2);
  return kael::half_bits_to_float(h);
}

// Where a super-block keeps its float16 d (and dmin, or -1).
void scale_offsets(QuantScheme s, int* d, int* dmin) {
  *dmin = -1;
  if (s == QuantScheme::Q2_K) {
    *d = 80;
    *dmin = 82;
  } else if (s == QuantScheme::Q3_K) {
    *d = 108;
  } else if (s == QuantScheme::Q6_K) {
    *d = 208;
  } else {
    *d = 0;
    if (s != QuantScheme::IQ4_XS) *dmin = 2;
  }
}

// n rows of k values: random bytes, each super-block's float16 scales finite, of either sign.
std::vector<uint8_t> random_rows(QuantScheme s, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t bb = kael::quant_block_bytes(s);
  std::vector<uint8_t> r(static_cast<size_t>(n * k / kQK * bb));
  for (auto& b : r) b = static_cast<uint8_t>(byte(g));
  int off_d = 0, off_m = 0;
  scale_offsets(s, &off_d, &off_m);
  for (int64_t blk = 0; blk < n * k / kQK; ++blk) {
    for (int off : {off_d, off_m}) {
      if (off < 0) continue;
      const uint16_t h = kael::float_to_half_bits(0.02f * nd(g));
      std::memcpy(r.data() + blk * bb + off, &h, 2);
    }
  }
  return r;
}

// GGML's get_scale_min_k4.
void scale_min_k4(int64_t j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void ref_q2_k(const uint8_t* b, float* y) {
  const float d = half_at(b + 80), mn = half_at(b + 82);
  const uint8_t* q = b + 16;
  int64_t is = 0;
  for (int64_t n = 0; n < kQK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int64_t half = 0; half < 2; ++half) {
        const int sc = b[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = mn * static_cast<float>(sc >> 4);
        for (int64_t l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
    q += 32;
  }
}

void ref_q3_k(const uint8_t* b, float* y) {
  // the 16 six-bit scales by GGML's kmask shuffle of three uint32 words
  uint32_t aux[4];
  std::memcpy(aux, b + 96, 12);
  const uint32_t tmp = aux[2], kmask1 = 0x03030303u, kmask2 = 0x0f0f0f0fu;
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  std::memcpy(scales, aux, 16);
  const float d = half_at(b + 108);
  const uint8_t* q = b + 32;
  const uint8_t* hm = b;
  int m = 1;
  int64_t is = 0;
  for (int64_t n = 0; n < kQK; n += 128) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int64_t half = 0; half < 2; ++half) {
        const float dl = d * static_cast<float>(scales[is++] - 32);
        for (int64_t l = 16 * half; l < 16 * half + 16; ++l) {
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) != 0 ? 0 : 4));
        }
      }
      m <<= 1;
    }
    q += 32;
  }
}

void ref_q45_k(const uint8_t* b, float* y, bool five) {
  const float d = half_at(b), mn = half_at(b + 2);
  const uint8_t* ql = b + (five ? 48 : 16);
  const uint8_t* qh = b + 16;
  int u = 1;
  for (int64_t is = 0; is < 8; is += 2) {
    for (int64_t half = 0; half < 2; ++half) {
      int sc = 0, m = 0;
      scale_min_k4(is + half, b + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = mn * static_cast<float>(m);
      for (int64_t l = 0; l < 32; ++l) {
        const int hi = five && (qh[l] & u) != 0 ? 16 : 0;
        *y++ = d1 * static_cast<float>(((ql[l] >> (4 * half)) & 0xF) + hi) - m1;
      }
      u <<= 1;
    }
    ql += 32;
  }
}

void ref_q6_k(const uint8_t* b, float* y) {
  const float d = half_at(b + 208);
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int64_t n = 0; n < kQK; n += 128) {
    for (int64_t l = 0; l < 32; ++l) {
      const int64_t is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

void ref_iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint16_t scales_h = 0;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* qs = b + 8;
  for (int64_t ib = 0; ib < 8; ++ib) {
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int64_t j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nl[qs[j] & 0xf]);
      y[j + 16] = dl * static_cast<float>(kIq4nl[qs[j] >> 4]);
    }
    y += 32;
    qs += 16;
  }
}

// A row of k values in format s, decoded by the loops above.
std::vector<float> reference_row(QuantScheme s, const uint8_t* row, int64_t k) {
  std::vector<float> y(static_cast<size_t>(k));
  const int64_t bb = kael::quant_block_bytes(s);
  for (int64_t i = 0; i < k / kQK; ++i) {
    const uint8_t* b = row + i * bb;
    float* yi = y.data() + i * kQK;
    if (s == QuantScheme::Q2_K) {
      ref_q2_k(b, yi);
    } else if (s == QuantScheme::Q3_K) {
      ref_q3_k(b, yi);
    } else if (s == QuantScheme::Q4_K || s == QuantScheme::Q5_K) {
      ref_q45_k(b, yi, s == QuantScheme::Q5_K);
    } else if (s == QuantScheme::Q6_K) {
      ref_q6_k(b, yi);
    } else {
      ref_iq4_xs(b, yi);
    }
  }
  return y;
}

TEST(VecQuantK, DequantRowExactOnEveryTable) {
  for (const kael::VecTable* t : tables()) {
    for (const QuantScheme s : kFormats) {
      const int f = static_cast<int>(s);
      for (int64_t k : {256, 512, 2048}) {
        const int64_t rb = k / kQK * kael::quant_block_bytes(s);
        const auto rows = random_rows(s, 3, k, static_cast<uint32_t>(int64_t{f} * 1000 + k));
        std::vector<float> out(static_cast<size_t>(k) + 1, -7.0f);
        for (int64_t r = 0; r < 3; ++r) {
          const uint8_t* row = rows.data() + r * rb;
          t->dequant_row[f](out.data(), row, k);
          const auto want = reference_row(s, row, k);
          for (int64_t i = 0; i < k; ++i) {
            ASSERT_EQ(out[i], want[i]) << t->name << " " << kael::quant_scheme_name(s) << " k=" << k << " i=" << i;
          }
          EXPECT_EQ(out[k], -7.0f) << t->name << ": wrote past the row";
        }
      }
    }
  }
}

TEST(VecQuantK, RowDotsBoundedAndIndependentOfRowCount) {
  for (const kael::VecTable* t : tables()) {
    for (const QuantScheme s : kFormats) {
      const int f = static_cast<int>(s);
      for (int64_t k : {256, 768}) {
        const int64_t n = 11, m = 16, rb = k / kQK * kael::quant_block_bytes(s);
        const auto w = random_rows(s, n, k, static_cast<uint32_t>(int64_t{7} * f + k));
        std::mt19937 g(static_cast<uint32_t>(k));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k)), bias(n),
            scratch(static_cast<size_t>(kael::qdot_scratch_floats(k)));
        for (auto& v : x) v = nd(g);
        for (auto& v : bias) v = nd(g);
        std::vector<float> alone(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i) {
          t->qdot_rows[f](1, n, k, x.data() + i * k, k, w.data(), rb, bias.data(), alone.data() + i * n, n, nullptr);
          for (int64_t j = 0; j < n; ++j) {
            const auto wj = reference_row(s, w.data() + j * rb, k);
            double exact = bias[j], mag = std::fabs(bias[j]);
            for (int64_t tt = 0; tt < k; ++tt) {
              const double p = static_cast<double>(x[i * k + tt]) * wj[tt];
              exact += p;
              mag += std::fabs(p);
            }
            const int64_t height = k / 32 + 66;  // the kernels' summation depth, rounded up
            const double tol = 1.01 * static_cast<double>(height) * std::ldexp(1.0, -24) * mag;
            EXPECT_NEAR(alone[i * n + j], exact, tol) << t->name << " " << kael::quant_scheme_name(s) << " k=" << k;
          }
        }
        for (int64_t rows = 2; rows <= m; ++rows) {
          std::vector<float> c(static_cast<size_t>(rows * n));
          t->qdot_rows[f](rows, n, k, x.data(), k, w.data(), rb, bias.data(), c.data(), n, scratch.data());
          for (int64_t e = 0; e < rows * n; ++e) {
            ASSERT_EQ(c[e], alone[e]) << t->name << " " << kael::quant_scheme_name(s) << " k=" << k << " rows=" << rows;
          }
        }
      }
    }
  }
}

TEST(QuantKernelsK, SuperBlockShapesChecked) {
  std::vector<uint8_t> w(size_t{3} * 2 * 144);
  std::vector<float> x(size_t{2} * 512), out(size_t{2} * 3);
  const View wv = kael::contiguous_view(w.data(), DType::UInt8, {3, 288});
  const View xv = kael::contiguous_view(x.data(), DType::Float32, {2, 512});
  const View ov = kael::contiguous_view(out.data(), DType::Float32, {2, 3});
  EXPECT_NO_THROW(kael::quantized_linear(ov, xv, wv, nullptr, QuantScheme::Q4_K));
  EXPECT_THROW(kael::quantized_linear(ov, xv, wv, nullptr, QuantScheme::Q6_K), kael::Error);  // 288 != 420
  const View x288 = kael::contiguous_view(x.data(), DType::Float32, {2, 288});                // not 256k
  EXPECT_THROW(kael::quantized_linear(ov, x288, wv, nullptr, QuantScheme::Q4_K), kael::Error);
  std::vector<float> d(size_t{3} * 512);
  EXPECT_NO_THROW(kael::dequantize(kael::contiguous_view(d.data(), DType::Float32, {3, 512}), wv, QuantScheme::Q4_K));
  EXPECT_THROW(kael::dequantize(kael::contiguous_view(d.data(), DType::Float32, {3, 256}), wv, QuantScheme::Q4_K),
               kael::Error);
}

}  // namespace
