// The mixture-of-experts kernels of moe.cpp: moe_route against the decomposition built here from
// the primitive kernels (amax, sub, exp, sum, div, sort; bit for bit, NOTE [moe_route bits]) and a
// double-precision softmax, its tie order and nan rows; expert_linear against double loops for
// each weight path (contiguous along C, the transposed view, odd strides, bfloat16), against the
// decomposition's matmul bit for bit, a row batched equal to the row alone, and the errors (a
// kael::Error, nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "half.h"
#include "kernels.h"

namespace {

using kael::DType;
using kael::View;

template <class T>
std::vector<T> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(g));
  return v;
}

// A view over data with the given shape and strides (in elements).
View strided(void* data, DType d, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides) {
  View v = kael::contiguous_view(data, d, shape);
  int i = 0;
  for (int64_t s : strides) v.strides[i++] = s;
  return v;
}

template <class T>
constexpr DType dt() {
  return kael::dtype_of<T>();
}

// -- moe_route ------------------------------------------------------------------------------

// softmax_decomp + topk_decomp (+ the normalisation) of kael/ops/_moe_fused.py, on the primitives.
template <class C>
void route_decomposed(std::vector<C>& w, std::vector<int64_t>& ex, std::vector<C> logits, int64_t t, int64_t e,
                      int64_t k, bool normalize) {
  std::vector<C> m(t), d(t * e), p(t * e), s(t), sorted(t * e), ws(t);
  std::vector<int64_t> idx(t * e);
  const View lv = kael::contiguous_view(logits.data(), dt<C>(), {t, e});
  const View mv = kael::contiguous_view(m.data(), dt<C>(), {t, 1}),
             sv = kael::contiguous_view(s.data(), dt<C>(), {t, 1});
  const View dv = kael::contiguous_view(d.data(), dt<C>(), {t, e}),
             pv = kael::contiguous_view(p.data(), dt<C>(), {t, e});
  kael::reduce(kael::ReduceOp::Amax, mv, lv, {1});
  kael::binary(kael::BinaryOp::Sub, dv, lv, strided(m.data(), dt<C>(), {t, e}, {1, 0}));
  kael::unary(kael::UnaryOp::Exp, pv, dv);
  kael::reduce(kael::ReduceOp::Sum, sv, pv, {1});
  kael::binary(kael::BinaryOp::Div, dv, pv, strided(s.data(), dt<C>(), {t, e}, {1, 0}));
  kael::sort(kael::contiguous_view(sorted.data(), dt<C>(), {t, e}),
             kael::contiguous_view(idx.data(), DType::Int64, {t, e}), dv, 1, true);
  w.assign(t * k, C(0));
  ex.assign(t * k, 0);
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      w[r * k + j] = sorted[r * e + j];
      ex[r * k + j] = idx[r * e + j];
    }
  }
  if (normalize) {
    const View wv = kael::contiguous_view(w.data(), dt<C>(), {t, k});
    kael::reduce(kael::ReduceOp::Sum, kael::contiguous_view(ws.data(), dt<C>(), {t, 1}), wv, {1});
    kael::binary(kael::BinaryOp::Div, wv, wv, strided(ws.data(), dt<C>(), {t, k}, {1, 0}));
  }
}

template <class C>
void route_equals_decomposition() {
  uint32_t seed = 1;
  for (int64_t e : {1, 3, 8, 17, 64, 128}) {
    for (int64_t t : {1, 3, 9}) {
      for (int64_t k : {int64_t{1}, std::min<int64_t>(2, e), std::min<int64_t>(8, e), e}) {
        for (bool normalize : {false, true}) {
          const auto logits = randn<C>(static_cast<size_t>(t * e), seed++, 3.0);
          std::vector<C> w(t * k, C(-7)), want_w;
          std::vector<int64_t> ex(t * k, -7), want_ex;
          kael::moe_route(kael::contiguous_view(w.data(), dt<C>(), {t, k}),
                          kael::contiguous_view(ex.data(), DType::Int64, {t, k}),
                          kael::contiguous_view(const_cast<C*>(logits.data()), dt<C>(), {t, e}), k, normalize);
          route_decomposed<C>(want_w, want_ex, logits, t, e, k, normalize);
          EXPECT_EQ(ex, want_ex) << "e=" << e << " t=" << t << " k=" << k;
          EXPECT_EQ(std::memcmp(w.data(), want_w.data(), w.size() * sizeof(C)), 0)
              << "e=" << e << " t=" << t << " k=" << k << " normalize=" << normalize;
          for (int64_t r = 0; r < t; ++r) {  // and a float64 softmax
            double mx = -HUGE_VAL, s = 0;
            for (int64_t j = 0; j < e; ++j) mx = std::max(mx, static_cast<double>(logits[r * e + j]));
            for (int64_t j = 0; j < e; ++j) s += std::exp(static_cast<double>(logits[r * e + j]) - mx);
            double ks = 0;
            for (int64_t j = 0; j < k; ++j) ks += std::exp(static_cast<double>(logits[r * e + ex[r * k + j]]) - mx) / s;
            for (int64_t j = 0; j < k; ++j) {
              double want = std::exp(static_cast<double>(logits[r * e + ex[r * k + j]]) - mx) / s;
              if (normalize) want /= ks;
              EXPECT_NEAR(w[r * k + j], want, (sizeof(C) == 4 ? 2e-6 : 1e-14) * want + 1e-30);
              if (j) {
                EXPECT_GE(w[r * k + j - 1], w[r * k + j]);
              }
            }
          }
        }
      }
    }
  }
}

TEST(MoeRoute, Float32EqualsTheDecompositionBitForBit) {
  route_equals_decomposition<float>();
}

TEST(MoeRoute, Float64EqualsTheDecompositionBitForBit) {
  route_equals_decomposition<double>();
}

TEST(MoeRoute, TiesInIndexOrderNanRowsAndHalfLogits) {
  // row 0: ties (3 at 1, 4 and 6); row 1: a nan (every weight nan, the first k experts); row 2: -inf entries and a tie
  // on top
  const float nan = std::nanf(""), inf = HUGE_VALF;
  std::vector<float> logits = {1, 3, 0, 2, 3, -1, 3, 0, 0, nan, 0, 1, 2, 3, -inf, 5, -inf, 5, -inf, -inf, 5, 0, 1, 1};
  std::vector<float> w(9, -7);
  std::vector<int64_t> ex(9, -7);
  kael::moe_route(kael::contiguous_view(w.data(), DType::Float32, {3, 3}),
                  kael::contiguous_view(ex.data(), DType::Int64, {3, 3}),
                  kael::contiguous_view(logits.data(), DType::Float32, {3, 8}), 3, false);
  EXPECT_EQ(ex, (std::vector<int64_t>{1, 4, 6, 0, 1, 2, 1, 4, 6}));
  EXPECT_EQ(w[0], w[1]);
  EXPECT_EQ(w[1], w[2]);
  for (int j = 3; j < 6; ++j) EXPECT_TRUE(std::isnan(w[j]));
  EXPECT_EQ(w[6], w[7]);
  // bfloat16 logits, transposed: read as float32, weights float32
  std::vector<kael::BFloat16> lb(24);
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < 8; ++j) lb[j * 3 + r] = kael::BFloat16(r == 1 ? static_cast<float>(j) : logits[r * 8 + j]);
  }
  std::vector<float> w2(9, -7);
  std::vector<int64_t> ex2(9, -7);
  kael::moe_route(kael::contiguous_view(w2.data(), DType::Float32, {3, 3}),
                  kael::contiguous_view(ex2.data(), DType::Int64, {3, 3}),
                  strided(lb.data(), DType::BFloat16, {3, 8}, {1, 3}), 3, true);
  EXPECT_EQ(ex2, (std::vector<int64_t>{1, 4, 6, 7, 6, 5, 1, 4, 6}));
  EXPECT_FLOAT_EQ(w2[0] + w2[1] + w2[2], 1.0f);
  const double s = std::exp(0.0) + std::exp(-1.0) + std::exp(-2.0);
  EXPECT_NEAR(w2[3], 1.0 / s, 1e-7);
  EXPECT_NEAR(w2[5], std::exp(-2.0) / s, 1e-7);
}

// -- expert_linear --------------------------------------------------------------------------

// out [T, K, N] = weight[experts[t, j]] @ x[t, j] in double, through the views' strides.
template <class T>
std::vector<double> expert_linear64(const View& x, const View& w, const std::vector<int64_t>& ex) {
  const int64_t t = x.shape[0], kk = x.shape[1], c = x.shape[2], n = w.shape[1];
  std::vector<double> out(t * kk * n);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < kk; ++j) {
      const int64_t e = ex[i * kk + j];
      for (int64_t o = 0; o < n; ++o) {
        double s = 0;
        for (int64_t q = 0; q < c; ++q) {
          s += static_cast<double>(
                   static_cast<float>(x.ptr<T>()[i * x.strides[0] + j * x.strides[1] + q * x.strides[2]])) *
               static_cast<double>(
                   static_cast<float>(w.ptr<T>()[e * w.strides[0] + o * w.strides[1] + q * w.strides[2]]));
        }
        out[(i * kk + j) * n + o] = s;
      }
    }
  }
  return out;
}

std::vector<int64_t> random_ids(size_t n, int64_t e, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int64_t> d(0, e - 1);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

TEST(ExpertLinear, EveryWeightPathMatchesDoubleLoops) {
  const int64_t t = 7, kk = 3, e = 5, n = 37, c = 29;
  const auto ids = random_ids(t * kk, e, 3);
  const View iv = kael::contiguous_view(const_cast<int64_t*>(ids.data()), DType::Int64, {t, kk});
  auto xs = randn<float>(t * kk * c, 1), wsrc = randn<float>(4 * e * n * c, 2);
  const View x = kael::contiguous_view(xs.data(), DType::Float32, {t, kk, c});
  const View xb = strided(xs.data(), DType::Float32, {t, kk, c}, {c, 0, 1});  // every slot reads x[t, 0]
  const View w_kmajor = kael::contiguous_view(wsrc.data(), DType::Float32, {e, n, c});
  const View w_nmajor = strided(wsrc.data(), DType::Float32, {e, n, c}, {n * c, 1, n});  // the backward's transpose
  const View w_odd = strided(wsrc.data(), DType::Float32, {e, n, c}, {4 * n * c, 2 * c, 2});
  for (const View* xv : {&x, &xb}) {
    for (const View* wv : {&w_kmajor, &w_nmajor, &w_odd}) {
      std::vector<float> out(t * kk * n + 1, -7.0f);
      kael::expert_linear(kael::contiguous_view(out.data(), DType::Float32, {t, kk, n}), *xv, *wv, iv);
      const auto want = expert_linear64<float>(*xv, *wv, ids);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << i;
      EXPECT_EQ(out.back(), -7.0f) << "wrote past the end";
    }
  }
  // float64 and bfloat16 (a float32 product, rounded once)
  std::vector<double> x64(xs.begin(), xs.end()), w64(wsrc.begin(), wsrc.begin() + e * n * c), o64(t * kk * n);
  kael::expert_linear(kael::contiguous_view(o64.data(), DType::Float64, {t, kk, n}),
                      kael::contiguous_view(x64.data(), DType::Float64, {t, kk, c}),
                      kael::contiguous_view(w64.data(), DType::Float64, {e, n, c}), iv);
  const auto want64 = expert_linear64<float>(x, w_kmajor, ids);
  for (size_t i = 0; i < o64.size(); ++i) EXPECT_NEAR(o64[i], want64[i], 1e-12 * (1 + std::fabs(want64[i])));
  std::vector<kael::BFloat16> xh(t * kk * c), wh(e * n * c), oh(t * kk * n);
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = kael::BFloat16(xs[i]);
  for (size_t i = 0; i < wh.size(); ++i) wh[i] = kael::BFloat16(wsrc[i]);
  const View xhv = kael::contiguous_view(xh.data(), DType::BFloat16, {t, kk, c});
  const View whv = kael::contiguous_view(wh.data(), DType::BFloat16, {e, n, c});
  kael::expert_linear(kael::contiguous_view(oh.data(), DType::BFloat16, {t, kk, n}), xhv, whv, iv);
  const auto wanth = expert_linear64<kael::BFloat16>(xhv, whv, ids);
  for (size_t i = 0; i < oh.size(); ++i) {
    EXPECT_NEAR(static_cast<float>(oh[i]), wanth[i], std::fabs(wanth[i]) / 128 + 1e-5) << i;
  }
}

// The decomposition's product for one expert: its rows gathered, matmul(rows, W[e]^T) (the view).
template <class T>
std::vector<T> decomposed_rows(const View& x, const View& w, int64_t e, const std::vector<int64_t>& pos) {
  const int64_t m = static_cast<int64_t>(pos.size()), c = x.shape[2], n = w.shape[1], kk = x.shape[1];
  std::vector<T> rows(m * c), out(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t q = 0; q < c; ++q) {
      rows[i * c + q] = x.ptr<T>()[pos[i] / kk * x.strides[0] + pos[i] % kk * x.strides[1] + q * x.strides[2]];
    }
  }
  View wt = strided(w.ptr<T>() + e * w.strides[0], w.dtype, {c, n}, {w.strides[2], w.strides[1]});
  kael::matmul(kael::contiguous_view(out.data(), w.dtype, {m, n}), kael::contiguous_view(rows.data(), w.dtype, {m, c}),
               wt);
  return out;
}

template <class T>
void check_against_matmul(const View& x, const View& w, const std::vector<int64_t>& ids, const std::string& what) {
  const int64_t t = x.shape[0], kk = x.shape[1], n = w.shape[1];
  std::vector<T> out(t * kk * n);
  kael::expert_linear(kael::contiguous_view(out.data(), w.dtype, {t, kk, n}), x, w,
                      kael::contiguous_view(const_cast<int64_t*>(ids.data()), DType::Int64, {t, kk}));
  for (int64_t e = 0; e < w.shape[0]; ++e) {
    std::vector<int64_t> pos;
    for (int64_t a = 0; a < t * kk; ++a) {
      if (ids[a] == e) pos.push_back(a);
    }
    if (pos.empty()) continue;
    if constexpr (sizeof(T) == 2) {  // past 16 rows, matmul's 16-bit path rounds otherwise
      ASSERT_LE(pos.size(), 16u);
    }
    const auto want = decomposed_rows<T>(x, w, e, pos);
    for (size_t i = 0; i < pos.size(); ++i) {
      EXPECT_EQ(std::memcmp(out.data() + pos[i] * n, want.data() + i * n, n * sizeof(T)), 0)
          << what << ": expert " << e << " row " << pos[i];
    }
  }
}

// expert_linear of random x [t, kk, c] through e random experts [n, c] (ids, x and weights drawn from seed,
// seed + 1 and seed + 2) against the decomposition's matmul, bit for bit: float32 (the weight as stored and as
// the backward's transposed view), float64 and, when `halves`, float16.
void check_dtypes_against_matmul(int64_t t, int64_t kk, int64_t e, int64_t n, int64_t c, uint32_t seed, bool halves) {
  const auto ids = random_ids(t * kk, e, seed);
  auto xs = randn<float>(t * kk * c, seed + 1), ws = randn<float>(e * n * c, seed + 2);
  const View x = kael::contiguous_view(xs.data(), DType::Float32, {t, kk, c});
  check_against_matmul<float>(x, kael::contiguous_view(ws.data(), DType::Float32, {e, n, c}), ids, "float32");
  check_against_matmul<float>(x, strided(ws.data(), DType::Float32, {e, n, c}, {n * c, 1, n}), ids, "transposed");
  std::vector<double> x64(xs.begin(), xs.end()), w64(ws.begin(), ws.end());
  check_against_matmul<double>(kael::contiguous_view(x64.data(), DType::Float64, {t, kk, c}),
                               kael::contiguous_view(w64.data(), DType::Float64, {e, n, c}), ids, "float64");
  if (!halves) return;
  std::vector<kael::Half> xh(xs.size()), wh(ws.size());
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = kael::Half(xs[i]);
  for (size_t i = 0; i < wh.size(); ++i) wh[i] = kael::Half(ws[i] / 8);
  check_against_matmul<kael::Half>(kael::contiguous_view(xh.data(), DType::Float16, {t, kk, c}),
                                   kael::contiguous_view(wh.data(), DType::Float16, {e, n, c}), ids, "float16");
}

TEST(ExpertLinear, FewRowsEqualTheDecompositionsMatmulBitForBit) {
  check_dtypes_against_matmul(6, 4, 3, 70, 1100, 5, true);  // c > 1024: the depth-blocked dot products
}

TEST(ExpertLinear, ManyRowsEqualTheDecompositionsMatmulBitForBit) {
  // 120 assignments over 3 experts (about 40 rows each, past the few-row kernels: the GEMM driver, as matmul)
  check_dtypes_against_matmul(30, 4, 3, 70, 300, 15, false);
}

TEST(ExpertLinear, ARowBatchedEqualsTheRowAlone) {
  // 16 tokens, all on expert 1 (one few-row call, a decode batch): each row equals that token run alone
  const int64_t t = 16, kk = 2, e = 3, n = 50, c = 64;
  std::vector<int64_t> ids(t * kk);
  for (int64_t i = 0; i < t; ++i) {
    ids[i * kk] = 1;
    ids[i * kk + 1] = i % 2 == 0 ? 0 : 2;  // expert 1 holds exactly the 16 first slots
  }
  auto xs = randn<float>(t * kk * c, 8), ws = randn<float>(e * n * c, 9);
  for (const bool transposed : {false, true}) {
    const View w = transposed ? strided(ws.data(), DType::Float32, {e, n, c}, {n * c, 1, n})
                              : kael::contiguous_view(ws.data(), DType::Float32, {e, n, c});
    std::vector<float> all(t * kk * n);
    kael::expert_linear(kael::contiguous_view(all.data(), DType::Float32, {t, kk, n}),
                        kael::contiguous_view(xs.data(), DType::Float32, {t, kk, c}), w,
                        kael::contiguous_view(ids.data(), DType::Int64, {t, kk}));
    for (int64_t i = 0; i < t; ++i) {
      std::vector<float> one(kk * n);
      kael::expert_linear(kael::contiguous_view(one.data(), DType::Float32, {1, kk, n}),
                          kael::contiguous_view(xs.data() + i * kk * c, DType::Float32, {1, kk, c}), w,
                          kael::contiguous_view(ids.data() + i * kk, DType::Int64, {1, kk}));
      EXPECT_EQ(std::memcmp(one.data(), all.data() + i * kk * n, one.size() * sizeof(float)), 0)
          << "token " << i << (transposed ? " (transposed)" : "");
    }
  }
}

TEST(ExpertLinear, LongPromptsGoInWaves) {
  // 9000 rows of 4 KiB over 3 experts: more than one wave of gathered rows (kWaveBytes, 32 MiB)
  const int64_t t = 4500, kk = 2, e = 3, n = 5, c = 1024;
  const auto ids = random_ids(t * kk, e, 11);
  auto xs = randn<float>(t * kk * c, 12), ws = randn<float>(e * n * c, 13);
  const View x = kael::contiguous_view(xs.data(), DType::Float32, {t, kk, c});
  const View w = kael::contiguous_view(ws.data(), DType::Float32, {e, n, c});
  std::vector<float> out(t * kk * n);
  kael::expert_linear(kael::contiguous_view(out.data(), DType::Float32, {t, kk, n}), x, w,
                      kael::contiguous_view(const_cast<int64_t*>(ids.data()), DType::Int64, {t, kk}));
  const auto want = expert_linear64<float>(x, w, ids);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-4 * (1 + std::fabs(want[i]))) << i;
  check_against_matmul<float>(x, w, ids, "waves");  // and each expert's rows are matmul's, bit for bit
}

TEST(MoeOps, ErrorsWriteNothing) {
  std::vector<float> x(12, 1.0f), w(60, 1.0f), out(20, 7.0f), lg(8, 0.5f);
  std::vector<int64_t> ids = {0, 3, 4, 1}, ex(4, 7);
  auto expect_error = [&](auto run, kael::ErrorKind kind, const std::string& what) {
    try {
      run();
      FAIL() << "expected: " << what;
    } catch (const kael::Error& err) {
      EXPECT_EQ(err.kind(), kind) << err.what();
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
    for (float v : out) EXPECT_EQ(v, 7.0f);
    for (int64_t v : ex) EXPECT_EQ(v, 7);
  };
  const View o = kael::contiguous_view(out.data(), DType::Float32, {2, 2, 5});
  const View xv = kael::contiguous_view(x.data(), DType::Float32, {2, 2, 3});
  const View wv = kael::contiguous_view(w.data(), DType::Float32, {4, 5, 3});
  const View iv = kael::contiguous_view(ids.data(), DType::Int64, {2, 2});
  expect_error([&] { kael::expert_linear(o, xv, wv, iv); }, kael::ErrorKind::Index,
               "expert_linear: expert 4 at [1, 0] is out of range for 4 experts");
  ids[2] = -1;
  expect_error([&] { kael::expert_linear(o, xv, wv, iv); }, kael::ErrorKind::Index, "expert_linear: expert -1");
  ids[2] = 2;
  expect_error(
      [&] {
        kael::expert_linear(o, xv, kael::contiguous_view(w.data(), DType::Float32, {4, 3, 5}), iv);
      },
      kael::ErrorKind::Shape, "expert_linear: x [2, 2, 3] and out [2, 2, 5] do not fit");
  std::vector<double> w64(w.size());
  expect_error(
      [&] {
        kael::expert_linear(o, xv, kael::contiguous_view(w64.data(), DType::Float64, {4, 5, 3}), iv);
      },
      kael::ErrorKind::DType, "expert_linear: x, weight and out must share a floating-point dtype");
  const View wr = kael::contiguous_view(out.data(), DType::Float32, {2, 2});
  const View er = kael::contiguous_view(ex.data(), DType::Int64, {2, 2});
  const View lv = kael::contiguous_view(lg.data(), DType::Float32, {2, 4});
  expect_error([&] { kael::moe_route(wr, er, lv, 5, false); }, kael::ErrorKind::Shape,
               "moe_route: k=5 must be in [1, 4]");
  expect_error([&] { kael::moe_route(wr, er, lv, 0, false); }, kael::ErrorKind::Shape, "moe_route: k=0");
  expect_error([&] { kael::moe_route(wr, er, lv, 3, false); }, kael::ErrorKind::Shape,
               "moe_route: weights and experts must be [2, 3]");
  expect_error([&] { kael::moe_route(er, er, lv, 2, false); }, kael::ErrorKind::DType,
               "moe_route: weights must be float32 and experts int64");
}

}  // namespace
