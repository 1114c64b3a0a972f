// The integer path for the super-blocks (vec_quant_dot_k.h: Q8_K activations . q2_k, q3_k, q4_k,
// q5_k, q6_k, iq4_xs weight rows): every vector table gives the same bits (NOTE [integer K dot
// order]), a row's result does not depend on the row count (1..16), and it is within float32
// rounding of the double-precision dot product of the dequantized weights (the baseline table's
// dequant_row, exact) with the activations d_x * q_x.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "half.h"
#include "kernels.h"
#include "vec.h"

namespace {

using kael::QuantScheme;

constexpr int64_t kQK = 256;
constexpr QuantScheme kFormats[] = {QuantScheme::Q2_K, QuantScheme::Q3_K, QuantScheme::Q4_K,
                                    QuantScheme::Q5_K, QuantScheme::Q6_K, QuantScheme::IQ4_XS};

// n weight rows of k values: random bytes, each super-block's float16 scales (d, and dmin where
// the format has one) finite, of either sign.
std::vector<uint8_t> random_rows(QuantScheme s, int64_t n, int64_t k, std::mt19937& g) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t bb = kael::quant_block_bytes(s);
  std::vector<uint8_t> r(static_cast<size_t>(n * k / kQK * bb));
  for (auto& b : r) b = static_cast<uint8_t>(byte(g));
  const int d = s == QuantScheme::Q2_K ? 80 : s == QuantScheme::Q3_K ? 108 : s == QuantScheme::Q6_K ? 208 : 0;
  const int dmin = s == QuantScheme::Q2_K ? 82 : (s == QuantScheme::Q4_K || s == QuantScheme::Q5_K) ? 2 : -1;
  for (int64_t blk = 0; blk < n * k / kQK; ++blk) {
    for (int off : {d, dmin}) {
      if (off < 0) continue;
      const uint16_t h = kael::float_to_half_bits(0.02f * nd(g));
      std::memcpy(r.data() + blk * bb + off, &h, 2);
    }
  }
  return r;
}

TEST(VecQuantDotK, SameBitsOnEveryTableAndRowCountAndNearTheDoubleDot) {
  const kael::VecTable& base = kael::vec_base_table();
  std::mt19937 g(11);
  std::uniform_int_distribution<int> qd(-127, 127);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const QuantScheme s : kFormats) {
    const int f = static_cast<int>(s);
    const int64_t k = 768, n = 9, m = 16, nb = k / kQK, rb = nb * kael::quant_block_bytes(s);
    const auto w = random_rows(s, n, k, g);
    // Q8_K activation rows: q, d (either sign), bsums
    std::vector<int8_t> xq(static_cast<size_t>(m * k));
    std::vector<float> xd(static_cast<size_t>(m * nb)), bias(n);
    std::vector<int16_t> xs(static_cast<size_t>(m * k / 16));
    for (auto& v : xq) v = static_cast<int8_t>(qd(g));
    for (auto& v : xd) v = 0.01f * nd(g);
    for (auto& v : bias) v = nd(g);
    for (int64_t i = 0; i < m * k / 16; ++i) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += xq[i * 16 + l];
      xs[i] = static_cast<int16_t>(sum);
    }
    std::vector<float> want(static_cast<size_t>(m * n));
    ASSERT_NE(base.q8kdot_rows[f], nullptr) << kael::quant_scheme_name(s);
    base.q8kdot_rows[f](m, n, k, xq.data(), xd.data(), xs.data(), w.data(), rb, bias.data(), want.data(), n);
    std::vector<float> wrow(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      base.dequant_row[f](wrow.data(), w.data() + j * rb, k);
      for (int64_t i = 0; i < m; ++i) {
        double exact = bias[j], mag = std::fabs(bias[j]);
        for (int64_t t = 0; t < k; ++t) {
          const double p = static_cast<double>(xd[i * nb + t / kQK]) * xq[i * k + t] * wrow[t];
          exact += p;
          mag += std::fabs(p);
        }
        EXPECT_NEAR(want[i * n + j], exact, 8 * std::ldexp(1.0, -24) * mag) << kael::quant_scheme_name(s);
      }
    }
    for (const auto& name : kael::vec_tables_runnable()) {
      const kael::VecTable* t = kael::vec_table_named(name);
      for (int64_t rows = 1; rows <= m; ++rows) {
        for (int64_t i0 = 0; i0 + rows <= m; i0 += rows) {
          std::vector<float> c(static_cast<size_t>(rows * n));
          t->q8kdot_rows[f](rows, n, k, xq.data() + i0 * k, xd.data() + i0 * nb, xs.data() + i0 * k / 16, w.data(), rb,
                            bias.data(), c.data(), n);
          for (int64_t e = 0; e < rows * n; ++e) {
            uint32_t got_bits = 0, want_bits = 0;
            std::memcpy(&got_bits, &c[e], 4);
            std::memcpy(&want_bits, &want[i0 * n + e], 4);
            ASSERT_EQ(got_bits, want_bits)
                << name << " " << kael::quant_scheme_name(s) << " rows=" << rows << " i0=" << i0;
          }
        }
      }
    }
  }
}

// The bits of c and want agree, element by element.
void expect_same_bits(const std::vector<float>& c, const float* want, const std::string& what) {
  for (size_t e = 0; e < c.size(); ++e) {
    uint32_t got_bits = 0, want_bits = 0;
    std::memcpy(&got_bits, &c[e], 4);
    std::memcpy(&want_bits, want + e, 4);
    ASSERT_EQ(got_bits, want_bits) << what << " element " << e;
  }
}

// Integers at their limits (NOTE [integer K dot in vectors]: the vector kernels' int16 steps): every
// weight byte one of 0x00, 0x7f, 0x80, 0xff (q6_k: q = -32 or 31, sc = -128, -1 or 127; q5_k: q =
// 31, sc and mn = 63; ...) against activations q_x all -128 (iq4_xs: -127), all 127 or alternating, with their
// bsums (d = 1, dmin = 1 / 2, d_x = 1): every table gives the portable kernel's bits, and those are
// within float32 rounding of the double-precision dot product.
TEST(VecQuantDotK, ExtremeIntegersSameBitsOnEveryTable) {
  const kael::VecTable& base = kael::vec_base_table();
  constexpr uint8_t kFills[] = {0x00, 0x7f, 0x80, 0xff};
  constexpr int64_t m = 16, n = 16, k = 2 * kQK, nb = k / kQK;
  for (const QuantScheme s : kFormats) {
    const int f = static_cast<int>(s);
    // iq4_xs's kernel flips q_x's sign: -128 is outside Q8_K's q_x (and wraps)
    const int lowest = s == QuantScheme::IQ4_XS ? -127 : -128;
    std::vector<int8_t> xq(static_cast<size_t>(m * k));
    std::vector<float> xd(static_cast<size_t>(m * nb), 1.0f);
    std::vector<int16_t> xs(static_cast<size_t>(m * k / 16));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t t = 0; t < k; ++t) {
        const int pattern = static_cast<int>(i % 3);
        xq[i * k + t] = static_cast<int8_t>(pattern == 0 ? lowest : pattern == 1 ? 127 : (t % 2 == 0 ? 127 : lowest));
      }
    }
    for (int64_t i = 0; i < m * k / 16; ++i) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += xq[i * 16 + l];
      xs[i] = static_cast<int16_t>(sum);
    }
    const int64_t bb = kael::quant_block_bytes(s), rb = nb * bb;
    // weight row j: every byte kFills[j % 4], scale bytes kFills[j / 4], d = 1 and dmin = 1 / 2
    std::vector<uint8_t> w(static_cast<size_t>(n * rb));
    const int d = s == QuantScheme::Q2_K ? 80 : s == QuantScheme::Q3_K ? 108 : s == QuantScheme::Q6_K ? 208 : 0;
    const int dmin = s == QuantScheme::Q2_K ? 82 : (s == QuantScheme::Q4_K || s == QuantScheme::Q5_K) ? 2 : -1;
    const int slo = s == QuantScheme::Q2_K     ? 0
                    : s == QuantScheme::Q3_K   ? 96
                    : s == QuantScheme::Q6_K   ? 192
                    : s == QuantScheme::IQ4_XS ? 2
                                               : 4;
    const int shi = s == QuantScheme::Q2_K     ? 16
                    : s == QuantScheme::Q3_K   ? 108
                    : s == QuantScheme::Q6_K   ? 208
                    : s == QuantScheme::IQ4_XS ? 8
                                               : 16;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* blk = w.data() + j * rb + b * bb;
        std::memset(blk, kFills[j % 4], static_cast<size_t>(bb));
        std::memset(blk + slo, kFills[j / 4], static_cast<size_t>(shi - slo));
        const uint16_t one = kael::float_to_half_bits(1.0f), half = kael::float_to_half_bits(0.5f);
        std::memcpy(blk + d, &one, 2);
        if (dmin >= 0) std::memcpy(blk + dmin, &half, 2);
      }
    }
    std::vector<float> want(static_cast<size_t>(m * n));
    base.q8kdot_rows[f](m, n, k, xq.data(), xd.data(), xs.data(), w.data(), rb, nullptr, want.data(), n);
    std::vector<float> wrow(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      base.dequant_row[f](wrow.data(), w.data() + j * rb, k);
      for (int64_t i = 0; i < m; ++i) {
        double exact = 0.0, mag = 0.0;
        for (int64_t t = 0; t < k; ++t) {
          const double p = static_cast<double>(xq[i * k + t]) * wrow[t];
          exact += p;
          mag += std::fabs(p);
        }
        EXPECT_NEAR(want[i * n + j], exact, 8 * std::ldexp(1.0, -24) * mag)
            << kael::quant_scheme_name(s) << " row " << i << " weight row " << j;
      }
    }
    for (const auto& name : kael::vec_tables_runnable()) {
      const kael::VecTable* t = kael::vec_table_named(name);
      for (int64_t rows = 1; rows <= m; ++rows) {
        std::vector<float> c(static_cast<size_t>(rows * n));
        t->q8kdot_rows[f](rows, n, k, xq.data(), xd.data(), xs.data(), w.data(), rb, nullptr, c.data(), n);
        expect_same_bits(c, want.data(), name + " " + kael::quant_scheme_name(s) + " rows " + std::to_string(rows));
      }
    }
  }
}

TEST(VecQuantDotK, OnlyTheSuperBlockFormatsHaveOne) {
  const kael::VecTable& base = kael::vec_base_table();
  for (int f = 0; f < kael::kQuantSchemes; ++f) {
    const auto s = static_cast<QuantScheme>(f);
    const bool super = kael::quant_block_values(s) == kQK;
    EXPECT_EQ(base.q8kdot_rows[f] != nullptr, super) << kael::quant_scheme_name(s);
    if (super) {
      EXPECT_EQ(base.q8dot_rows[f], nullptr) << kael::quant_scheme_name(s);
    }
  }
}

}  // namespace
