// The weight-format kernels (vec_quant.h, quant.cpp) against naive loops written from the block
// layout: dequant_row of every vector table equal bit for bit to the decoded values, qdot_rows
// within a float32 summation bound of the double-precision dot products and the same bits
// for a row whatever the row count, and quantize-shaped bad input thrown as kael::Error.
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
using kael::View;

std::vector<const kael::VecTable*> tables() {
  std::vector<const kael::VecTable*> t;  // every table this CPU runs
  for (const auto& name : kael::vec_tables_runnable()) t.push_back(kael::vec_table_named(name));
  return t;
}

constexpr int kBlockBytes[2] = {34, 18};

int64_t row_bytes(int f, int64_t k) {
  return f < 2 ? k / 32 * kBlockBytes[f] : 2 * k;
}

// Random rows in format f: block formats get random bytes with finite, modest scales.
std::vector<uint8_t> random_rows(int f, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint8_t> r(static_cast<size_t>(n * row_bytes(f, k)));
  for (auto& b : r) b = static_cast<uint8_t>(byte(g));
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* row = r.data() + i * row_bytes(f, k);
    if (f < 2) {
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint16_t s = kael::float_to_half_bits(0.01f + 0.05f * std::fabs(d(g)));
        std::memcpy(row + b * kBlockBytes[f], &s, 2);
      }
    } else {
      for (int64_t t = 0; t < k; ++t) {
        const float v = d(g);
        const uint16_t h = f == 2 ? kael::float_to_bf16_bits(v) : kael::float_to_half_bits(v);
        std::memcpy(row + 2 * t, &h, 2);
      }
    }
  }
  return r;
}

// The naive decoder: value t of a row of format f.
double value(int f, const uint8_t* row, int64_t t) {
  uint16_t h = 0;
  if (f >= 2) {
    std::memcpy(&h, row + 2 * t, 2);
    return f == 2 ? kael::bf16_bits_to_float(h) : kael::half_bits_to_float(h);
  }
  const uint8_t* blk = row + t / 32 * kBlockBytes[f];
  std::memcpy(&h, blk, 2);
  const double d = kael::half_bits_to_float(h);
  const int64_t i = t % 32;
  if (f == 0) return d * static_cast<int8_t>(blk[2 + i]);
  return d * (i < 16 ? (blk[2 + i] & 15) - 8 : (blk[2 + i - 16] >> 4) - 8);
}

TEST(VecQuant, DequantRowExactOnEveryTable) {
  for (const kael::VecTable* t : tables()) {
    for (int f = 0; f < 4; ++f) {
      for (int64_t k : {32, 64, 96, 4096, 1, 7, 33, 100}) {
        if (f < 2 && k % 32 != 0) continue;
        const auto rows = random_rows(f, 3, k, static_cast<uint32_t>(int64_t{f} * 1000 + k));
        std::vector<float> out(static_cast<size_t>(k) + 1, -7.0f);
        for (int64_t r = 0; r < 3; ++r) {
          const uint8_t* row = rows.data() + r * row_bytes(f, k);
          t->dequant_row[f](out.data(), row, k);
          for (int64_t i = 0; i < k; ++i) {
            ASSERT_EQ(out[i], static_cast<float>(value(f, row, i))) << t->name << " f=" << f << " k=" << k;
          }
          EXPECT_EQ(out[k], -7.0f) << t->name << ": wrote past the row";
        }
      }
    }
  }
}

TEST(VecQuant, RowDotsBoundedAndIndependentOfRowCount) {
  for (const kael::VecTable* t : tables()) {
    for (int f = 0; f < 4; ++f) {
      for (int64_t k : {32, 96, 768, 100}) {
        if (f < 2 && k % 32 != 0) continue;
        const int64_t n = 11, m = 16;
        const auto w = random_rows(f, n, k, static_cast<uint32_t>(int64_t{7} * f + k));
        std::mt19937 g(static_cast<uint32_t>(k));
        std::normal_distribution<float> d(0.0f, 1.0f);
        std::vector<float> x(static_cast<size_t>(m * k)), bias(n),
            scratch(static_cast<size_t>(kael::qdot_scratch_floats(k)));
        for (auto& v : x) v = d(g);
        for (auto& v : bias) v = d(g);
        std::vector<float> alone(static_cast<size_t>(m * n));
        for (int64_t i = 0; i < m; ++i) {
          t->qdot_rows[f](1, n, k, x.data() + i * k, k, w.data(), row_bytes(f, k), bias.data(), alone.data() + i * n, n,
                          nullptr);
          for (int64_t j = 0; j < n; ++j) {
            double exact = bias[j], mag = std::fabs(bias[j]);
            for (int64_t tt = 0; tt < k; ++tt) {
              const double p = x[i * k + tt] * value(f, w.data() + j * row_bytes(f, k), tt);
              exact += p;
              mag += std::fabs(p);
            }
            const int64_t height = k / 32 + 66;  // the kernels' summation depth, rounded up
            const double tol = 1.01 * static_cast<double>(height) * std::ldexp(1.0, -24) * mag;
            EXPECT_NEAR(alone[i * n + j], exact, tol) << t->name << " f=" << f << " k=" << k;
          }
        }
        for (int64_t rows = 2; rows <= m; ++rows) {
          std::vector<float> c(static_cast<size_t>(rows * n));
          t->qdot_rows[f](rows, n, k, x.data(), k, w.data(), row_bytes(f, k), bias.data(), c.data(), n, scratch.data());
          for (int64_t e = 0; e < rows * n; ++e) {
            ASSERT_EQ(c[e], alone[e]) << t->name << " f=" << f << " k=" << k << " rows=" << rows;
          }
        }
      }
    }
  }
}

TEST(QuantKernels, BadInputThrows) {
  std::vector<uint8_t> w(size_t{3} * 68);
  std::vector<float> x(size_t{2} * 64), out(size_t{2} * 3);
  const View wv = kael::contiguous_view(w.data(), DType::UInt8, {3, 68});
  const View xv = kael::contiguous_view(x.data(), DType::Float32, {2, 64});
  const View ov = kael::contiguous_view(out.data(), DType::Float32, {2, 3});
  EXPECT_NO_THROW(kael::quantized_linear(ov, xv, wv, nullptr, kael::QuantScheme::Q8_0));
  EXPECT_THROW(kael::quantized_linear(ov, xv, wv, nullptr, kael::QuantScheme::Q4_0), kael::Error);  // 68 != 36
  EXPECT_THROW(kael::quantized_linear(ov, xv, wv, nullptr, kael::QuantScheme::BF16), kael::Error);  // uint8
  const View x33 = kael::contiguous_view(x.data(), DType::Float32, {2, 33});
  EXPECT_THROW(kael::quantized_linear(ov, x33, wv, nullptr, kael::QuantScheme::Q8_0), kael::Error);
  std::vector<float> d(size_t{3} * 64);
  EXPECT_NO_THROW(
      kael::dequantize(kael::contiguous_view(d.data(), DType::Float32, {3, 64}), wv, kael::QuantScheme::Q8_0));
  EXPECT_THROW(kael::dequantize(kael::contiguous_view(d.data(), DType::Float32, {2, 64}), wv, kael::QuantScheme::Q8_0),
               kael::Error);
}

}  // namespace
