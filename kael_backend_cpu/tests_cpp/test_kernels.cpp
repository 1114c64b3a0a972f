// Kernels against naive double-precision loops: gemm (every path, both vector
// tables), elementwise with broadcasting and casts, reductions, softmax, layer_norm,
// attention, sort/topk, and errors thrown as kael::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gemm.h"
#include "half.h"
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

View view2(float* p, int64_t r, int64_t c, int64_t rs, int64_t cs) {
  View v = kael::contiguous_view(p, DType::Float32, {r, c});
  v.strides[0] = rs;
  v.strides[1] = cs;
  return v;
}

// ---- gemm ---------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb, tc;  // operands stored transposed
};

class Gemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(Gemm, MatchesNaive) {
  const GemmCase g = GetParam();
  const auto a = randn(static_cast<size_t>(g.m * g.k), 1), b = randn(static_cast<size_t>(g.k * g.n), 2);
  std::vector<float> c(static_cast<size_t>(g.m * g.n), 7.0f);
  // A is m x k: row-major (rs=k, cs=1) or stored transposed (rs=1, cs=m)
  const int64_t rsa = g.ta ? 1 : g.k, csa = g.ta ? g.m : 1;
  const int64_t rsb = g.tb ? 1 : g.n, csb = g.tb ? g.k : 1;
  const int64_t rsc = g.tc ? 1 : g.n, csc = g.tc ? g.m : 1;
  for (bool acc : {false, true}) {
    std::vector<float> before = c;
    kael::gemm<float>(g.m, g.n, g.k, a.data(), rsa, csa, b.data(), rsb, csb, c.data(), rsc, csc, acc);
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double want = acc ? before[static_cast<size_t>(i * rsc + j * csc)] : 0.0;
        for (int64_t kk = 0; kk < g.k; ++kk) {
          want += static_cast<double>(a[static_cast<size_t>(i * rsa + kk * csa)]) *
                  b[static_cast<size_t>(kk * rsb + j * csb)];
        }
        ASSERT_NEAR(c[static_cast<size_t>(i * rsc + j * csc)], want,
                    1e-4 * (1 + std::fabs(want)) + 1e-4 * std::sqrt(g.k))
            << "i=" << i << " j=" << j << " acc=" << acc;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Gemm,
    ::testing::Values(GemmCase{1, 1, 1, false, false, false}, GemmCase{1, 300, 77, false, false, false},
                      GemmCase{1, 300, 77, false, true, false}, GemmCase{5, 129, 64, false, false, false},
                      GemmCase{5, 129, 64, true, true, false}, GemmCase{16, 70, 33, false, true, false},
                      GemmCase{300, 3, 40, false, false, false}, GemmCase{300, 3, 40, true, true, true},
                      GemmCase{67, 45, 513, false, false, false}, GemmCase{67, 45, 513, true, false, true},
                      GemmCase{150, 290, 300, false, true, false}, GemmCase{33, 1, 20, false, false, false},
                      GemmCase{40, 50, 0, false, false, false}));

TEST(GemmDouble, MatchesNaive) {
  const int64_t m = 37, n = 29, k = 300;
  std::vector<double> a(static_cast<size_t>(m * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
  std::mt19937 g(3);
  std::uniform_real_distribution<double> d(-1, 1);
  for (auto& x : a) x = d(g);
  for (auto& x : b) x = d(g);
  kael::gemm<double>(m, n, k, a.data(), k, 1, b.data(), 1, k, c.data(), n, 1, false);  // B stored transposed
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        want += a[static_cast<size_t>(i * k + kk)] * b[static_cast<size_t>(j * k + kk)];
      ASSERT_NEAR(c[static_cast<size_t>(i * n + j)], want, 1e-12 * k);
    }
  }
}

// Every table's building blocks agree with a naive product.
TEST(VecTables, MicroKernelsAndRowKernels) {
  std::vector<const kael::VecTable*> tables;  // every table this CPU runs (baseline, avx2, avx512)
  for (const auto& name : kael::vec_tables_runnable()) tables.push_back(kael::vec_table_named(name));
  for (const kael::VecTable* t : tables) {
    const auto& g = t->sgemm;
    const int64_t kc = 37, m = g.mr, n = g.nr;
    const auto a = randn(static_cast<size_t>(m * kc), 4), b = randn(static_cast<size_t>(kc * n), 5);
    std::vector<float> ap(static_cast<size_t>(m * kc)), bp(static_cast<size_t>(kc * n)), c(static_cast<size_t>(m * n));
    g.pack_a(m, kc, a.data(), kc, 1, ap.data());
    g.pack_b(kc, n, b.data(), n, 1, bp.data());
    g.kernel(kc, ap.data(), bp.data(), c.data(), n, 1, static_cast<int>(m), static_cast<int>(n), false);
    std::vector<float> r(static_cast<size_t>(3 * 70)), rk(static_cast<size_t>(3 * 70));
    const auto b2 = randn(static_cast<size_t>(kc * 70), 6);
    g.rows_nmajor(3, 70, kc, a.data(), kc, 1, b2.data(), 70, r.data(), 70, false);
    std::vector<float> b2t(b2.size());  // the same B stored transposed, for the dot kernels
    for (int64_t kk = 0; kk < kc; ++kk) {
      for (int64_t j = 0; j < 70; ++j) b2t[static_cast<size_t>(j * kc + kk)] = b2[static_cast<size_t>(kk * 70 + j)];
    }
    g.rows_kmajor(3, 70, kc, a.data(), kc, b2t.data(), kc, rk.data(), 70, 1, false);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double want = 0;
        for (int64_t kk = 0; kk < kc; ++kk)
          want += double(a[static_cast<size_t>(i * kc + kk)]) * b[static_cast<size_t>(kk * n + j)];
        ASSERT_NEAR(c[static_cast<size_t>(i * n + j)], want, 1e-4) << t->name;
      }
    }
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t j = 0; j < 70; ++j) {
        double want = 0;
        for (int64_t kk = 0; kk < kc; ++kk)
          want += double(a[static_cast<size_t>(i * kc + kk)]) * b2[static_cast<size_t>(kk * 70 + j)];
        ASSERT_NEAR(r[static_cast<size_t>(i * 70 + j)], want, 1e-4) << t->name;
        ASSERT_NEAR(rk[static_cast<size_t>(i * 70 + j)], want, 1e-4) << t->name;
      }
    }
  }
}

TEST(VecTables, TranscendentalsAreAccurate) {
  std::vector<const kael::VecTable*> tables;  // every table this CPU runs (baseline, avx2, avx512)
  for (const auto& name : kael::vec_tables_runnable()) tables.push_back(kael::vec_table_named(name));
  std::vector<float> x;
  for (float v = -110.0f; v < 95.0f; v += 0.0137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, inf, -inf, std::nanf("")});
  std::vector<float> e(x.size()), th(x.size()), sg(x.size());
  for (const kael::VecTable* t : tables) {
    t->exp_f32(e.data(), x.data(), static_cast<int64_t>(x.size()));
    t->tanh_f32(th.data(), x.data(), static_cast<int64_t>(x.size()));
    t->sigmoid_f32(sg.data(), x.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double xe = std::exp(static_cast<double>(x[i])), xt = std::tanh(static_cast<double>(x[i]));
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(e[i]) && std::isnan(th[i])) << t->name;
        continue;
      }
      if (std::isinf(xe) || xe > 3.4e38) {
        EXPECT_TRUE(std::isinf(e[i])) << x[i];
      } else {
        EXPECT_NEAR(e[i], xe, 3e-7 * xe + 1e-44) << t->name << " exp(" << x[i] << ")";
      }
      EXPECT_NEAR(th[i], xt, 3e-7 * std::fabs(xt) + 1e-38) << t->name << " tanh(" << x[i] << ")";
      const double xs = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
      EXPECT_NEAR(sg[i], xs, 3e-7 * xs + 1e-38) << t->name << " sigmoid(" << x[i] << ")";
    }
  }
}

// ---- elementwise, casts, reductions ------------------------------------------------

TEST(Elementwise, BroadcastAddAndTransposedOperand) {
  const int64_t r = 70, c = 90;
  auto a = randn(static_cast<size_t>(r * c), 7), row = randn(static_cast<size_t>(c), 8);
  std::vector<float> out(static_cast<size_t>(r * c)), out2(out.size());
  View o = kael::contiguous_view(out.data(), DType::Float32, {r, c});
  View av = kael::contiguous_view(a.data(), DType::Float32, {r, c});
  View bv = view2(row.data(), r, c, 0, 1);  // row broadcast along dim 0
  kael::binary(kael::BinaryOp::Add, o, av, bv);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      ASSERT_EQ(out[static_cast<size_t>(i * c + j)], a[static_cast<size_t>(i * c + j)] + row[static_cast<size_t>(j)]);
    }
  }
  // a square transposed operand: out = x + x^T
  const int64_t n = 130;
  auto x = randn(static_cast<size_t>(n * n), 9);
  std::vector<float> s(static_cast<size_t>(n * n));
  View sv = kael::contiguous_view(s.data(), DType::Float32, {n, n});
  View xv = kael::contiguous_view(x.data(), DType::Float32, {n, n});
  kael::binary(kael::BinaryOp::Add, sv, xv, kael::transpose(xv, 0, 1));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(s[static_cast<size_t>(i * n + j)],
                x[static_cast<size_t>(i * n + j)] + x[static_cast<size_t>(j * n + i)]);
    }
  }
}

TEST(Elementwise, IntegerSemanticsLikeNumPy) {
  std::vector<int32_t> a = {7, -7, 7, -7, INT32_MIN, 5}, b = {2, 2, -2, -2, -1, 3}, q(6), r(6);
  View av = kael::contiguous_view(a.data(), DType::Int32, {6}), bv = kael::contiguous_view(b.data(), DType::Int32, {6});
  kael::binary(kael::BinaryOp::FloorDivide, kael::contiguous_view(q.data(), DType::Int32, {6}), av, bv);
  kael::binary(kael::BinaryOp::Remainder, kael::contiguous_view(r.data(), DType::Int32, {6}), av, bv);
  EXPECT_EQ(q, (std::vector<int32_t>{3, -4, -4, 3, INT32_MIN, 1}));
  EXPECT_EQ(r, (std::vector<int32_t>{1, 1, -1, -1, 0, 2}));
  std::vector<int32_t> zero = {1, 0, 1, 1, 1, 1};
  try {
    kael::binary(kael::BinaryOp::Remainder, kael::contiguous_view(r.data(), DType::Int32, {6}), av,
                 kael::contiguous_view(zero.data(), DType::Int32, {6}));
    FAIL() << "expected a division-by-zero error";
  } catch (const kael::Error& e) {
    EXPECT_EQ(e.kind(), kael::ErrorKind::ZeroDivision);
  }
}

TEST(Copy, CastsRoundLikeNumPy) {
  const std::vector<float> src = {1.0f, 65504.0f, 65520.0f, 1e-8f, -2.5f, 0.1f};
  std::vector<uint16_t> h(src.size()), bf(src.size());
  View s = kael::contiguous_view(const_cast<float*>(src.data()), DType::Float32, {6});
  kael::copy(kael::contiguous_view(h.data(), DType::Float16, {6}), s);
  kael::copy(kael::contiguous_view(bf.data(), DType::BFloat16, {6}), s);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0x7BFF);
  EXPECT_EQ(h[2], 0x7C00);  // rounds up to inf
  EXPECT_EQ(h[3], 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(h[4], 0xC100);
  EXPECT_EQ(h[5], 0x2E66);
  EXPECT_EQ(bf[0], 0x3F80);
  EXPECT_EQ(bf[5], 0x3DCD);
  std::vector<float> back(6);
  kael::copy(kael::contiguous_view(back.data(), DType::Float32, {6}),
             kael::contiguous_view(h.data(), DType::Float16, {6}));
  EXPECT_EQ(back[4], -2.5f);
  EXPECT_TRUE(std::isinf(back[2]));
}

TEST(Reduce, SumOverEveryDimSetMatchesNaive) {
  const int64_t d0 = 6, d1 = 50, d2 = 33;
  auto x = randn(static_cast<size_t>(d0 * d1 * d2), 10);
  View xv = kael::contiguous_view(x.data(), DType::Float32, {d0, d1, d2});
  for (int mask = 1; mask < 8; ++mask) {
    std::vector<int> dims;
    int64_t shape[3] = {d0, d1, d2};
    for (int d = 0; d < 3; ++d) {
      if (mask & (1 << d)) {
        dims.push_back(d);
        shape[d] = 1;
      }
    }
    std::vector<float> out(static_cast<size_t>(shape[0] * shape[1] * shape[2]));
    kael::reduce(kael::ReduceOp::Sum, kael::contiguous_view(out.data(), DType::Float32, shape, 3), xv, dims);
    std::vector<double> want(out.size(), 0.0);
    for (int64_t i = 0; i < d0; ++i) {
      for (int64_t j = 0; j < d1; ++j) {
        for (int64_t k = 0; k < d2; ++k) {
          const int64_t oi = (mask & 1) ? 0 : i, oj = (mask & 2) ? 0 : j, ok = (mask & 4) ? 0 : k;
          want[static_cast<size_t>((oi * shape[1] + oj) * shape[2] + ok)] +=
              x[static_cast<size_t>((i * d1 + j) * d2 + k)];
        }
      }
    }
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-4) << "mask " << mask;
  }
}

TEST(Reduce, ArgmaxFindsTheFirstExtremumAndNan) {
  std::vector<float> x = {1, 5, 5, 2, 3, std::nanf(""), 9, std::nanf("")};
  int64_t out[2] = {};
  View xv = kael::contiguous_view(x.data(), DType::Float32, {2, 4});
  kael::reduce(kael::ReduceOp::Argmax, kael::contiguous_view(out, DType::Int64, {2, 1}), xv, {1});
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 1);
  float mx[2] = {};
  kael::reduce(kael::ReduceOp::Amax, kael::contiguous_view(mx, DType::Float32, {2, 1}), xv, {1});
  EXPECT_EQ(mx[0], 5.0f);
  EXPECT_TRUE(std::isnan(mx[1]));
}

// ---- fused ops -----------------------------------------------------------------------

TEST(Fused, SoftmaxAndLayerNormRows) {
  const int64_t rows = 9, n = 77;
  auto x = randn(static_cast<size_t>(rows * n), 11);
  std::vector<float> y(x.size()), ln(x.size()), mean(rows), rstd(rows);
  View xv = kael::contiguous_view(x.data(), DType::Float32, {rows, n});
  kael::softmax(kael::contiguous_view(y.data(), DType::Float32, {rows, n}), xv, 1);
  kael::layer_norm(kael::contiguous_view(ln.data(), DType::Float32, {rows, n}),
                   kael::contiguous_view(mean.data(), DType::Float32, {rows}),
                   kael::contiguous_view(rstd.data(), DType::Float32, {rows}), xv, nullptr, nullptr, 1e-5);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -1e30, s = 0, mu = 0, var = 0;
    for (int64_t j = 0; j < n; ++j) m = std::max<double>(m, x[static_cast<size_t>(r * n + j)]);
    for (int64_t j = 0; j < n; ++j) s += std::exp(x[static_cast<size_t>(r * n + j)] - m);
    for (int64_t j = 0; j < n; ++j) mu += x[static_cast<size_t>(r * n + j)];
    mu /= n;
    for (int64_t j = 0; j < n; ++j)
      var += (x[static_cast<size_t>(r * n + j)] - mu) * (x[static_cast<size_t>(r * n + j)] - mu);
    var /= n;
    for (int64_t j = 0; j < n; ++j) {
      const double xv2 = x[static_cast<size_t>(r * n + j)];
      ASSERT_NEAR(y[static_cast<size_t>(r * n + j)], std::exp(xv2 - m) / s, 1e-6);
      ASSERT_NEAR(ln[static_cast<size_t>(r * n + j)], (xv2 - mu) / std::sqrt(var + 1e-5), 1e-5);
    }
    ASSERT_NEAR(mean[static_cast<size_t>(r)], mu, 1e-6);
  }
}

TEST(Fused, CausalAttentionWithACacheAndLengths) {
  const int64_t B = 2, H = 3, Tq = 4, Tk = 9, D = 8;
  auto q = randn(static_cast<size_t>(B * H * Tq * D), 12), k = randn(static_cast<size_t>(B * H * Tk * D), 13),
       v = randn(static_cast<size_t>(B * H * Tk * D), 14);
  std::vector<float> out(static_cast<size_t>(B * H * Tq * D));
  int64_t lens[2] = {9, 6};
  const double scale = 0.3;
  kael::View lv = kael::contiguous_view(lens, DType::Int64, {B});
  kael::attention(kael::contiguous_view(out.data(), DType::Float32, {B, H, Tq, D}),
                  kael::contiguous_view(q.data(), DType::Float32, {B, H, Tq, D}),
                  kael::contiguous_view(k.data(), DType::Float32, {B, H, Tk, D}),
                  kael::contiguous_view(v.data(), DType::Float32, {B, H, Tk, D}), scale, true, &lv);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t valid = std::min<int64_t>(lens[b], i + (Tk - Tq) + 1);
        std::vector<double> p(static_cast<size_t>(valid));
        double m = -1e30, s = 0;
        for (int64_t j = 0; j < valid; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += double(q[static_cast<size_t>(((b * H + h) * Tq + i) * D + d)]) *
                   k[static_cast<size_t>(((b * H + h) * Tk + j) * D + d)];
          }
          p[static_cast<size_t>(j)] = dot * scale;
          m = std::max(m, p[static_cast<size_t>(j)]);
        }
        for (auto& e : p) s += (e = std::exp(e - m));
        for (int64_t d = 0; d < D; ++d) {
          double want = 0;
          for (int64_t j = 0; j < valid; ++j)
            want += p[static_cast<size_t>(j)] / s * v[static_cast<size_t>(((b * H + h) * Tk + j) * D + d)];
          ASSERT_NEAR(out[static_cast<size_t>(((b * H + h) * Tq + i) * D + d)], want, 1e-5);
        }
      }
    }
  }
}

TEST(Indexing, StableSortAndTopk) {
  std::vector<float> x = {3, 1, std::nanf(""), 3, 2, 1};
  std::vector<float> vals(6), top(3);
  std::vector<int64_t> idx(6), tidx(3);
  View xv = kael::contiguous_view(x.data(), DType::Float32, {6});
  kael::sort(kael::contiguous_view(vals.data(), DType::Float32, {6}),
             kael::contiguous_view(idx.data(), DType::Int64, {6}), xv, 0, false);
  EXPECT_EQ(idx, (std::vector<int64_t>{1, 5, 4, 0, 3, 2}));
  kael::sort(kael::contiguous_view(vals.data(), DType::Float32, {6}),
             kael::contiguous_view(idx.data(), DType::Int64, {6}), xv, 0, true);
  EXPECT_EQ(idx, (std::vector<int64_t>{2, 0, 3, 4, 1, 5}));
  kael::topk(kael::contiguous_view(top.data(), DType::Float32, {3}),
             kael::contiguous_view(tidx.data(), DType::Int64, {3}), xv, 3);
  EXPECT_EQ(tidx, (std::vector<int64_t>{2, 0, 3}));
}

TEST(Errors, BadIndicesThrowKaelErrors) {
  std::vector<float> w(12, 1.0f), out(6);
  std::vector<int64_t> ids = {0, 4};
  try {
    kael::embedding(kael::contiguous_view(out.data(), DType::Float32, {2, 3}),
                    kael::contiguous_view(w.data(), DType::Float32, {4, 3}),
                    kael::contiguous_view(ids.data(), DType::Int64, {2}));
    FAIL() << "expected an index error";
  } catch (const kael::Error& e) {
    EXPECT_EQ(e.kind(), kael::ErrorKind::Index);
    EXPECT_NE(std::string(e.what()).find("embedding"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("indexing.cpp:"), std::string::npos);
  }
}

}  // namespace
