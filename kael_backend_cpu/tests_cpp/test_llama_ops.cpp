// The Llama-family kernels against naive double-precision loops: the vec_llama.h rows of
// every vector table (sumsq, scale_mul, silu_mul, rope), rms_norm on strided rows, rope with
// out-of-range positions (a kael::Error, nothing written), grouped-query attention
// equal bit for bit to attention on repeated K/V, and paged attention equal bit for bit to
// causal attention on each row's gathered keys (bad block ids and lengths: a kael::Error).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
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
      for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);  // float squares (ggml's)
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

// A paged pool [nb, 2, hkv, s, d] holding each row's positions at shuffled block ids; row b's
// gathered keys/values [hkv, len, d] from it.
struct Paged {
  int64_t nb, hkv, s, d, m;
  std::vector<float> pool;
  std::vector<int64_t> table, lengths;
  [[nodiscard]] std::vector<float> gathered(int64_t b, int64_t part) const {
    const int64_t len = lengths[static_cast<size_t>(b)];
    std::vector<float> out(static_cast<size_t>(hkv * len * d));
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t p = 0; p < len; ++p) {
        const int64_t id = table[static_cast<size_t>(b * m + p / s)];
        for (int64_t c = 0; c < d; ++c) {
          out[static_cast<size_t>((h * len + p) * d + c)] =
              pool[static_cast<size_t>((((id * 2 + part) * hkv + h) * s + p % s) * d + c)];
        }
      }
    }
    return out;
  }
};

Paged make_paged(int64_t hkv, int64_t s, int64_t d, const std::vector<int64_t>& lengths, uint32_t seed) {
  Paged p{0, hkv, s, d, 0, {}, {}, lengths};
  for (int64_t len : lengths) p.m = std::max(p.m, (len + s - 1) / s + 1);
  for (int64_t len : lengths) p.nb += (len + s - 1) / s;
  p.nb += 2;
  // ids shuffled by a stride coprime to nb (a permutation), so a row's blocks are neither in order nor adjacent
  int64_t step = 7;
  while (std::gcd(step, p.nb) != 1) step += 2;
  std::vector<int64_t> ids(static_cast<size_t>(p.nb));
  for (int64_t i = 0; i < p.nb; ++i) ids[static_cast<size_t>(i)] = (i * step + 3) % p.nb;
  p.table.assign(lengths.size() * static_cast<size_t>(p.m), -1);
  size_t at = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    for (int64_t j = 0; j < (lengths[b] + s - 1) / s; ++j) p.table[b * static_cast<size_t>(p.m) + j] = ids[at++];
  }
  p.pool = randn(static_cast<size_t>(p.nb * 2 * hkv * s * d), seed);
  return p;
}

TEST(PagedAttention, EqualsCausalAttentionOnTheGatheredKeys) {
  // decode and prefill shapes, grouped and not, block sizes 1, 3 and 16, over every row
  struct Case {
    int64_t nh, hkv, tq, s, d;
    std::vector<int64_t> lengths;
  };
  const std::vector<Case> cases = {
      {4, 4, 1, 16, 8, {1, 17, 40}}, {8, 2, 1, 3, 16, {5, 9}}, {6, 3, 4, 3, 16, {4, 11, 7}},
      {4, 1, 16, 16, 8, {16, 33}},   {2, 2, 3, 1, 5, {3, 8}},  {4, 2, 1, 4, 1, {6, 2}},
  };
  for (const Case& c : cases) {
    const auto nb = static_cast<int64_t>(c.lengths.size());
    Paged p = make_paged(c.hkv, c.s, c.d, c.lengths, 21);
    const auto q = randn(static_cast<size_t>(nb * c.nh * c.tq * c.d), 22);
    std::vector<float> out(q.size(), 7.0f);
    kael::paged_attention(kael::contiguous_view(out.data(), DType::Float32, {nb, c.nh, c.tq, c.d}),
                          kael::contiguous_view(const_cast<float*>(q.data()), DType::Float32, {nb, c.nh, c.tq, c.d}),
                          kael::contiguous_view(p.pool.data(), DType::Float32, {p.nb, 2, c.hkv, c.s, c.d}),
                          kael::contiguous_view(p.table.data(), DType::Int64, {nb, p.m}),
                          kael::contiguous_view(p.lengths.data(), DType::Int64, {nb}), 0.3);
    const int64_t row = c.nh * c.tq * c.d;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t len = c.lengths[static_cast<size_t>(b)];
      auto k = p.gathered(b, 0), v = p.gathered(b, 1);
      std::vector<float> want(static_cast<size_t>(row));
      kael::attention(
          kael::contiguous_view(want.data(), DType::Float32, {1, c.nh, c.tq, c.d}),
          kael::contiguous_view(const_cast<float*>(q.data()) + b * row, DType::Float32, {1, c.nh, c.tq, c.d}),
          kael::contiguous_view(k.data(), DType::Float32, {1, c.hkv, len, c.d}),
          kael::contiguous_view(v.data(), DType::Float32, {1, c.hkv, len, c.d}), 0.3, true, nullptr);
      for (int64_t i = 0; i < row; ++i) {
        ASSERT_EQ(out[static_cast<size_t>(b * row + i)], want[static_cast<size_t>(i)])
            << "H=" << c.nh << " Hkv=" << c.hkv << " T=" << c.tq << " S=" << c.s << " row " << b << " @" << i;
      }
    }
  }
}

TEST(PagedAttention, BadBlockIdsAndLengthsThrow) {
  Paged p = make_paged(2, 4, 8, {5, 3}, 23);
  const auto q = randn(static_cast<size_t>(2 * 2 * 1 * 8), 24);
  std::vector<float> out(q.size(), 7.0f);
  auto run = [&]() {
    kael::paged_attention(kael::contiguous_view(out.data(), DType::Float32, {2, 2, 1, 8}),
                          kael::contiguous_view(const_cast<float*>(q.data()), DType::Float32, {2, 2, 1, 8}),
                          kael::contiguous_view(p.pool.data(), DType::Float32, {p.nb, 2, 2, 4, 8}),
                          kael::contiguous_view(p.table.data(), DType::Int64, {2, p.m}),
                          kael::contiguous_view(p.lengths.data(), DType::Int64, {2}), 0.5);
  };
  auto expect = [&](kael::ErrorKind kind, const std::string& text) {
    try {
      run();
      FAIL() << "expected an error: " << text;
    } catch (const kael::Error& e) {
      EXPECT_EQ(e.kind(), kind);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  p.table[1] = p.nb;  // row 0's second block (in use: 5 positions of 4)
  expect(kael::ErrorKind::Index, "paged_attention: block_table[0, 1] = ");
  p.table[1] = -1;
  expect(kael::ErrorKind::Index, "is not a block of the cache's");
  p.table[1] = 0;
  p.lengths[1] = 0;  // below T = 1
  expect(kael::ErrorKind::Shape, "paged_attention: lengths[1] = 0 is out of range");
  p.lengths[1] = p.m * 4 + 1;
  expect(kael::ErrorKind::Shape, "lengths[1] = ");
  for (float v : out) EXPECT_EQ(v, 7.0f);  // nothing written
}

}  // namespace
