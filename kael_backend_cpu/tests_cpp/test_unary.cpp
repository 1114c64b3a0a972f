// silu(x) = x / (1 + exp(-x)) against a wider-precision formula: the vector kernel of every
// table (the contiguous float32 path), kael::unary on float32 (contiguous and strided),
// float64, float16 and bfloat16, and the edge values (+-inf, nan, huge, tiny, -0).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "half.h"
#include "kernels.h"
#include "vec.h"

namespace {

using kael::DType;

double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}
long double silu_ld(long double x) {
  return x / (1.0L + std::exp(-x));
}

// float32 inputs covering exp's whole range and past it, plus the edge values.
std::vector<float> f32_inputs() {
  std::vector<float> x;
  for (float v = -110.0f; v < 95.0f; v += 0.0137f) x.push_back(v);
  const float inf = std::numeric_limits<float>::infinity();
  x.insert(x.end(), {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, 17.0f, -17.0f, 200.0f, -200.0f, 1e30f, -1e30f,
                     FLT_MAX, -FLT_MAX, inf, -inf, std::nanf("")});
  return x;
}

// One float32 result of silu(x): nan for nan and -inf (-inf / inf, as PyTorch gives), -0 where
// exp(-x) overflows float32 (x below about -88.72), else within a few ulp of the formula.
void expect_silu_f32(float got, float x, const char* where) {
  if (std::isnan(x) || (std::isinf(x) && x < 0)) {
    EXPECT_TRUE(std::isnan(got)) << where << " silu(" << x << ") = " << got;
    return;
  }
  const double want = silu_d(x);
  if (std::exp(-static_cast<double>(x)) > static_cast<double>(FLT_MAX)) {
    // the true value is below 2.7e-37 in magnitude; float32's exp(-x) is inf
    EXPECT_TRUE(got == 0.0f && std::signbit(got)) << where << " silu(" << x << ") = " << got;
    return;
  }
  if (std::isinf(want)) {
    EXPECT_EQ(got, std::numeric_limits<float>::infinity()) << where << " silu(" << x << ")";
    return;
  }
  EXPECT_NEAR(got, want, 4e-7 * std::fabs(want) + 1.5e-45) << where << " silu(" << x << ")";
  EXPECT_EQ(std::signbit(got), std::signbit(x)) << where << " silu(" << x << ") = " << got;
}

TEST(Silu, VectorKernelOfEveryTable) {
  std::vector<const kael::VecTable*> tables;  // every table this CPU runs (baseline, avx2, avx512)
  for (const auto& name : kael::vec_tables_runnable()) tables.push_back(kael::vec_table_named(name));
  const std::vector<float> x = f32_inputs();
  std::vector<float> y(x.size());
  for (const kael::VecTable* t : tables) {
    ASSERT_NE(t->silu_f32, nullptr) << t->name;
    // every length up to a few vectors: the whole-vector, pair and partial tails
    for (size_t n = 0; n <= 40; ++n) {
      std::vector<float> part(n, -1.0f);
      t->silu_f32(part.data(), x.data() + 7000, static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) expect_silu_f32(part[i], x[7000 + i], t->name);
    }
    t->silu_f32(y.data(), x.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) expect_silu_f32(y[i], x[i], t->name);
  }
}

TEST(Silu, Float32ContiguousAndStrided) {
  const std::vector<float> x = f32_inputs();
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  kael::unary(kael::UnaryOp::Silu, kael::contiguous_view(y.data(), DType::Float32, {n}),
              kael::contiguous_view(const_cast<float*>(x.data()), DType::Float32, {n}));
  for (size_t i = 0; i < x.size(); ++i) expect_silu_f32(y[i], x[i], "contiguous");

  // input every third element, output every other: the scalar loop over strides
  std::vector<float> xs(x.size() * 3, 1234.0f), ys(x.size() * 2, -7.0f);
  for (size_t i = 0; i < x.size(); ++i) xs[3 * i] = x[i];
  kael::View xv = kael::contiguous_view(xs.data(), DType::Float32, {n});
  kael::View yv = kael::contiguous_view(ys.data(), DType::Float32, {n});
  xv.strides[0] = 3;
  yv.strides[0] = 2;
  kael::unary(kael::UnaryOp::Silu, yv, xv);
  for (size_t i = 0; i < x.size(); ++i) {
    expect_silu_f32(ys[2 * i], x[i], "strided");
    EXPECT_EQ(ys[2 * i + 1], -7.0f) << "wrote between the output's elements";
  }

  // a transposed 2-d operand into a contiguous output
  const int64_t r = 37, c = 29;
  std::vector<float> a(static_cast<size_t>(r * c)), out(a.size());
  std::mt19937 g(21);
  std::uniform_real_distribution<float> d(-30.0f, 30.0f);
  for (float& v : a) v = d(g);
  kael::View av = kael::contiguous_view(a.data(), DType::Float32, {r, c});
  kael::unary(kael::UnaryOp::Silu, kael::contiguous_view(out.data(), DType::Float32, {c, r}),
              kael::transpose(av, 0, 1));
  for (int64_t i = 0; i < c; ++i) {
    for (int64_t j = 0; j < r; ++j)
      expect_silu_f32(out[static_cast<size_t>(i * r + j)], a[static_cast<size_t>(j * c + i)], "transposed");
  }
}

TEST(Silu, Float64AgainstLongDouble) {
  std::vector<double> x;
  for (double v = -760.0; v < 720.0; v += 0.37) x.push_back(v);
  const double inf = std::numeric_limits<double>::infinity();
  x.insert(x.end(), {0.0, -0.0, 1e-300, -1e-300, 5e-324, 200.0, -200.0, -745.0, 1e300, -1e300, DBL_MAX, -DBL_MAX});
  const auto n = static_cast<int64_t>(x.size());
  std::vector<double> y(x.size()), ys(x.size() * 2, 9.0);
  kael::unary(kael::UnaryOp::Silu, kael::contiguous_view(y.data(), DType::Float64, {n}),
              kael::contiguous_view(x.data(), DType::Float64, {n}));
  kael::View yv = kael::contiguous_view(ys.data(), DType::Float64, {n});
  yv.strides[0] = 2;
  kael::unary(kael::UnaryOp::Silu, yv, kael::contiguous_view(x.data(), DType::Float64, {n}));
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = silu_ld(x[i]);
    if (std::exp(-x[i]) > DBL_MAX) {  // float64's exp(-x) overflows: -0, as PyTorch gives
      EXPECT_TRUE(y[i] == 0.0 && std::signbit(y[i])) << "silu(" << x[i] << ") = " << y[i];
    } else {
      EXPECT_NEAR(y[i], static_cast<double>(want), 8e-16 * std::fabs(static_cast<double>(want)) + 5e-324)
          << "silu(" << x[i] << ")";
    }
    EXPECT_EQ(ys[2 * i], y[i]) << "strided differs from contiguous at " << x[i];
    EXPECT_EQ(ys[2 * i + 1], 9.0);
  }
  double edge[3] = {inf, -inf, std::nan("")}, out[3] = {};
  kael::unary(kael::UnaryOp::Silu, kael::contiguous_view(out, DType::Float64, {3}),
              kael::contiguous_view(edge, DType::Float64, {3}));
  EXPECT_EQ(out[0], inf);
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_TRUE(std::isnan(out[2]));
}

// float16 and bfloat16 compute in float32 and round once: within one unit of the last
// place of the exact result rounded to the format (2^-10 and 2^-7 relative), or of its
// smallest subnormal.
void check_half(DType dtype, uint16_t (*to_bits)(float), float (*from_bits)(uint16_t), double rel, double tiny) {
  std::vector<uint16_t> x;
  for (float v = -70.0f; v < 70.0f; v += 0.173f) x.push_back(to_bits(v));
  for (float v : {0.0f, -0.0f, 1e-3f, -1e-3f, 60000.0f, -60000.0f}) x.push_back(to_bits(v));
  const uint16_t edge_in[3] = {to_bits(std::numeric_limits<float>::infinity()),
                               to_bits(-std::numeric_limits<float>::infinity()), to_bits(std::nanf(""))};
  x.insert(x.end(), edge_in, edge_in + 3);
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> y(x.size()), ys(x.size() * 2, to_bits(5.0f));
  kael::unary(kael::UnaryOp::Silu, kael::contiguous_view(y.data(), dtype, {n}),
              kael::contiguous_view(x.data(), dtype, {n}));
  kael::View yv = kael::contiguous_view(ys.data(), dtype, {n});
  yv.strides[0] = 2;
  kael::unary(kael::UnaryOp::Silu, yv, kael::contiguous_view(x.data(), dtype, {n}));
  for (size_t i = 0; i + 3 < x.size(); ++i) {
    const float xi = from_bits(x[i]);
    const double want = silu_d(xi);
    const float got = from_bits(y[i]);
    EXPECT_NEAR(got, want, rel * std::fabs(want) + tiny) << kael::dtype_name(dtype) << " silu(" << xi << ")";
    EXPECT_EQ(ys[2 * i], y[i]) << "strided differs from contiguous at " << xi;
    EXPECT_EQ(from_bits(ys[2 * i + 1]), 5.0f);
  }
  const size_t e = x.size() - 3;
  EXPECT_EQ(from_bits(y[e]), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(from_bits(y[e + 1])));
  EXPECT_TRUE(std::isnan(from_bits(y[e + 2])));
}

TEST(Silu, HalfTypesComputeInFloat32) {
  check_half(DType::Float16, kael::float_to_half_bits, kael::half_bits_to_float, 1.0 / 1024, 6e-8);
  check_half(DType::BFloat16, kael::float_to_bf16_bits, kael::bf16_bits_to_float, 1.0 / 128, 1e-40);
}

}  // namespace
