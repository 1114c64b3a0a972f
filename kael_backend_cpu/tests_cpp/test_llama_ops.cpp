// The Llama-family kernels against naive double-precision loops: the vec_llama.h rows of
// every vector table (sumsq, scale_mul, silu_mul, rope), rms_norm on strided rows, rope with
// out-of-range positions (a kael::Error, nothing written), and grouped-query attention
// equal bit for bit to attention on repeated K/V.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"
#include "vec.h"

namespace {

using kael::DType;
using kael::View;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<const kael::VecTable*> tables() {
  std::vector<const kael::VecTable*> t;  // every table this CPU runs (baseline, avx2, avx512)
  for (const auto& name : kael::vec_tables_runnable()) t.push_back(kael::vec_table_named(name));
  return t;
}

TEST(VecLlama, RowsOfEveryTable) {
  const auto x = randn(300, 1), y = randn(300, 2), w = randn(300, 3), z = randn(300, 4);
  for (const kael::VecTable* t : tables()) {
    for (int64_t n : {0, 1, 3, 7, 8, 9, 17, 64, 255, 300}) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
      EXPECT_NEAR(t->sumsq_f32(x.data(), n), ss, 1e-12 * (ss + 1)) << t->name << " n=" << n;
      std::vector<float> out(static_cast<size_t>(n) + 1, -7.0f), o2(static_cast<size_t>(n) + 1, -7.0f);
      t->scale_mul_f32(out.data(), x.data(), 0.75f, w.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], (x[i] * 0.75f) * w[i]) << t->name;  // two roundings
      EXPECT_EQ(out[n], -7.0f) << t->name << ": wrote past the row";
      t->silu_mul_f32(out.data(), x.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[i] / (1.0 + std::exp(-static_cast<double>(x[i]))) * y[i];
        EXPECT_NEAR(out[i], want, 6e-7 * std::fabs(want) + 1e-30) << t->name;
      }
      EXPECT_EQ(out[n], -7.0f) << t->name << ": wrote past the row";
      t->rope_f32(out.data(), o2.data(), x.data(), y.data(), w.data(), z.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double a = x[i], b = y[i], c = w[i], s = z[i];
        EXPECT_NEAR(out[i], a * c - b * s, 1e-6 * (std::fabs(a * c) + std::fabs(b * s))) << t->name;
        EXPECT_NEAR(o2[i], b * c + a * s, 1e-6 * (std::fabs(b * c) + std::fabs(a * s))) << t->name;
      }
      EXPECT_EQ(o2[n], -7.0f) << t->name << ": wrote past the row";
    }
  }
}

TEST(RmsNorm, StridedRowsMatchNaive) {
  // x [3, 50] viewed with a row stride of 64 and an element stride of 1; out transposed
  const int64_t rows = 3, n = 50;
  auto xs = randn(static_cast<size_t>(rows * 64), 5);
  const auto w = randn(static_cast<size_t>(n), 6);
  std::vector<float> out(static_cast<size_t>(rows * n)), rstd(rows);
  View x = kael::contiguous_view(xs.data(), DType::Float32, {rows, n});
  x.strides[0] = 64;
  View o = kael::contiguous_view(out.data(), DType::Float32, {rows, n});
  o.strides[0] = 1;
  o.strides[1] = rows;
  const View wv = kael::contiguous_view(const_cast<float*>(w.data()), DType::Float32, {n});
  kael::rms_norm(o, kael::contiguous_view(rstd.data(), DType::Float32, {rows}), x, &wv, 1e-6);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xs[r * 64 + i]) * xs[r * 64 + i];
    const double want_r = 1.0 / std::sqrt(ss / n + 1e-6);
    EXPECT_NEAR(rstd[r], want_r, 2e-7 * want_r);
    for (int64_t i = 0; i < n; ++i) {
      const double want = xs[r * 64 + i] * want_r * w[i];
      EXPECT_NEAR(out[i * rows + r], want, 1e-6 * std::fabs(want) + 1e-7);
    }
  }
}

TEST(Rope, OutOfRangePositionThrowsAndWritesNothing) {
  std::vector<float> x(16, 1.0f), out(16, 7.0f), cs(8, 0.5f);
  std::vector<int64_t> pos = {0, 4};  // tables of 2 positions
  try {
    kael::rope(kael::contiguous_view(out.data(), DType::Float32, {1, 1, 2, 8}),
               kael::contiguous_view(x.data(), DType::Float32, {1, 1, 2, 8}),
               kael::contiguous_view(cs.data(), DType::Float32, {2, 4}),
               kael::contiguous_view(cs.data(), DType::Float32, {2, 4}),
               kael::contiguous_view(pos.data(), DType::Int64, {1, 2}));
    FAIL() << "expected an index error";
  } catch (const kael::Error& e) {
    EXPECT_EQ(e.kind(), kael::ErrorKind::Index);
    EXPECT_NE(std::string(e.what()).find("rope: positions[0, 1] = 4 is out of range for tables of 2"),
              std::string::npos)
        << e.what();
  }
  for (float v : out) EXPECT_EQ(v, 7.0f);
}

TEST(Attention, GroupedQueryEqualsRepeatedKv) {
  // H = 20 query heads over Hkv = 2 (groups of 10) and over Hkv = 1 (a group of 20: split
  // into 16 + 4 rows), one query (decode) and three queries, each against repeated K/V
  const int64_t nh = 20, tk = 29, d = 16;
  for (int64_t nkv : {1, 2, 4}) {
    for (int64_t tq : {1, 3}) {
      const int64_t g = nh / nkv;
      const auto q = randn(static_cast<size_t>(nh * tq * d), 7);
      auto k = randn(static_cast<size_t>(nkv * tk * d), 8), v = randn(static_cast<size_t>(nkv * tk * d), 9);
      std::vector<float> kr(static_cast<size_t>(nh * tk * d)), vr(kr.size());
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t i = 0; i < tk * d; ++i) {
          kr[h * tk * d + i] = k[(h / g) * tk * d + i];
          vr[h * tk * d + i] = v[(h / g) * tk * d + i];
        }
      }
      std::vector<float> o1(static_cast<size_t>(nh * tq * d)), o2(o1.size());
      auto run = [&](std::vector<float>& o, float* kp, float* vp, int64_t hk) {
        kael::attention(kael::contiguous_view(o.data(), DType::Float32, {1, nh, tq, d}),
                        kael::contiguous_view(const_cast<float*>(q.data()), DType::Float32, {1, nh, tq, d}),
                        kael::contiguous_view(kp, DType::Float32, {1, hk, tk, d}),
                        kael::contiguous_view(vp, DType::Float32, {1, hk, tk, d}), 0.25, true, nullptr);
      };
      run(o1, k.data(), v.data(), nkv);
      run(o2, kr.data(), vr.data(), nh);
      for (size_t i = 0; i < o1.size(); ++i) ASSERT_EQ(o1[i], o2[i]) << "Hkv=" << nkv << " tq=" << tq << " @" << i;
    }
  }
}

}  // namespace
