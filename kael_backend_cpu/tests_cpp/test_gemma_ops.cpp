// The Gemma-family kernels of geglu_softcap.cpp against naive double-precision loops:
// gelu_tanh_mul and softcap on contiguous, strided and in-place float32 operands under every
// vector table, float64, the 16-bit rounding sequences (NOTE [16-bit rounding of the Gemma ops]),
// and the errors (a bad cap, mismatched shapes or dtypes: a kael::Error, nothing written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "half.h"
#include "kernels.h"
#include "vec.h"

namespace {

using kael::DType;
using kael::View;

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// gelu_tanh in double, as g * sigmoid(2u) = g / (1 + exp(-2u)), u = sqrt(2/pi) (g + 0.044715 g^3): the
// same value as 0.5 g (1 + tanh(u)) without its cancellation for g << 0 (there even double loses every digit).
double gelu_u(double g) {
  return 0.7978845608028654 * (g + 0.044715 * g * g * g);
}
double gelu64(double g) {
  return g / (1.0 + std::exp(-2.0 * gelu_u(g)));
}
// The float32 kernels' error bound for gelu at g: exp(-2u) amplifies u's float32 rounding by |2u|.
double gelu_tol(double g) {
  return std::fabs(gelu64(g)) * (2e-6 + 2.4e-7 * std::fabs(gelu_u(g))) + 1e-37;
}

// f(n) for lengths around the chunk (256) and vector widths. The kernels use the table vec() picks
// (KAEL_CPU_ISA); the two vec_math.h rows they call are checked under every table below.
template <class F>
void each_length(F f) {
  for (int64_t n : {0, 1, 3, 7, 8, 9, 17, 64, 255, 256, 257, 1000}) f(n);
}

TEST(GemmaOps, TanhAndGeluRowsOfEveryTable) {
  const auto x = randn(300, 9, 4.0f);
  for (const auto& name : kael::vec_tables_runnable()) {
    const kael::VecTable* t = kael::vec_table_named(name);
    for (int64_t n : {0, 1, 7, 9, 17, 300}) {
      std::vector<float> o1(static_cast<size_t>(n) + 1, -7.0f), o2(o1);
      t->tanh_f32(o1.data(), x.data(), n);
      t->gelu_tanh_f32(o2.data(), x.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_NEAR(o1[i], std::tanh(static_cast<double>(x[i])), 3e-7) << name;
        EXPECT_NEAR(o2[i], gelu64(x[i]), gelu_tol(x[i])) << name;
      }
      EXPECT_EQ(o1[n], -7.0f) << name;
      EXPECT_EQ(o2[n], -7.0f) << name;
    }
  }
}

TEST(GeluTanhMul, Float32ContiguousStridedAndInPlace) {
  const auto g = randn(2000, 1, 3.0f), u = randn(2000, 2);
  each_length([&](int64_t n) {
    std::vector<float> out(static_cast<size_t>(n) + 1, -7.0f);
    kael::gelu_tanh_mul(kael::contiguous_view(out.data(), DType::Float32, {n}),
                        kael::contiguous_view(const_cast<float*>(g.data()), DType::Float32, {n}),
                        kael::contiguous_view(const_cast<float*>(u.data()), DType::Float32, {n}));
    for (int64_t i = 0; i < n; ++i) {
      const double want = gelu64(g[i]) * u[i];
      EXPECT_NEAR(out[i], want, gelu_tol(g[i]) * std::fabs(u[i])) << "n=" << n << " i=" << i;
    }
    EXPECT_EQ(out[n], -7.0f) << "wrote past the end";
    // gate read with a stride of 2, out written with a stride of 2, up in place as out
    std::vector<float> o2(static_cast<size_t>(2 * n) + 1, -7.0f);
    for (int64_t i = 0; i < n; ++i) o2[2 * i] = u[i];
    View gv = kael::contiguous_view(const_cast<float*>(g.data()), DType::Float32, {n});
    gv.strides[0] = 2;
    View ov = kael::contiguous_view(o2.data(), DType::Float32, {n});
    ov.strides[0] = 2;
    kael::gelu_tanh_mul(ov, gv, ov);
    for (int64_t i = 0; i < n; ++i) {
      const double want = gelu64(g[2 * i]) * u[i];
      EXPECT_NEAR(o2[2 * i], want, gelu_tol(g[2 * i]) * std::fabs(u[i])) << "strided n=" << n << " i=" << i;
      EXPECT_EQ(o2[2 * i + 1], -7.0f);
    }
  });
}

TEST(GeluTanhMul, Float64AndHalfRounding) {
  const auto g = randn(300, 3, 3.0f), u = randn(300, 4);
  std::vector<double> g64(g.begin(), g.end()), u64(u.begin(), u.end()), o64(300);
  const int64_t n = 300;
  kael::gelu_tanh_mul(kael::contiguous_view(o64.data(), DType::Float64, {n}),
                      kael::contiguous_view(g64.data(), DType::Float64, {n}),
                      kael::contiguous_view(u64.data(), DType::Float64, {n}));
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(o64[i], gelu64(g64[i]) * u64[i], 1e-15 * (1 + std::fabs(o64[i])));
  // bfloat16: gelu rounded to bfloat16, times up, rounded again; within one bfloat16 ulp of that sequence
  std::vector<kael::BFloat16> gb(300), ub(300), ob(300);
  for (int64_t i = 0; i < n; ++i) {
    gb[i] = kael::BFloat16(g[i]);
    ub[i] = kael::BFloat16(u[i]);
  }
  kael::gelu_tanh_mul(kael::contiguous_view(ob.data(), DType::BFloat16, {n}),
                      kael::contiguous_view(gb.data(), DType::BFloat16, {n}),
                      kael::contiguous_view(ub.data(), DType::BFloat16, {n}));
  int exact = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto act = static_cast<float>(kael::BFloat16(static_cast<float>(gelu64(static_cast<float>(gb[i])))));
    const auto want = static_cast<float>(kael::BFloat16(act * static_cast<float>(ub[i])));
    const auto got = static_cast<float>(ob[i]);
    exact += got == want;
    EXPECT_NEAR(got, want, std::fabs(want) / 64 + 1e-30) << i;
  }
  EXPECT_GE(exact, 295);  // the float32 gelu's last bits move a bfloat16 rounding now and then
}

TEST(Softcap, Float32Float64AndHalfRounding) {
  const auto x = randn(1000, 5, 40.0f);
  for (double cap : {30.0, 50.0, 0.5}) {
    each_length([&](int64_t n) {
      std::vector<float> out(static_cast<size_t>(n) + 1, -7.0f);
      kael::softcap(kael::contiguous_view(out.data(), DType::Float32, {n}),
                    kael::contiguous_view(const_cast<float*>(x.data()), DType::Float32, {n}), cap);
      for (int64_t i = 0; i < n; ++i) {
        const double want = cap * std::tanh(x[i] / cap);
        EXPECT_NEAR(out[i], want, 4e-7 * std::fabs(want) + 1e-30) << "cap=" << cap << " i=" << i;
        EXPECT_LE(std::fabs(out[i]), cap);
      }
      EXPECT_EQ(out[n], -7.0f) << "wrote past the end";
    });
    std::vector<double> x64(x.begin(), x.end());
    kael::softcap(kael::contiguous_view(x64.data(), DType::Float64, {1000}),
                  kael::contiguous_view(x64.data(), DType::Float64, {1000}), cap);  // in place
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x64[i], cap * std::tanh(x[i] / cap), 1e-14 * cap);
    std::vector<kael::Half> xh(1000), oh(1000);
    for (size_t i = 0; i < x.size(); ++i) xh[i] = kael::Half(x[i]);
    kael::softcap(kael::contiguous_view(oh.data(), DType::Float16, {1000}),
                  kael::contiguous_view(xh.data(), DType::Float16, {1000}), cap);
    int exact = 0;
    const auto c = static_cast<float>(cap);
    for (size_t i = 0; i < x.size(); ++i) {  // the three roundings of (x / cap).tanh() * cap
      const auto q = static_cast<float>(kael::Half(static_cast<float>(xh[i]) / c));
      const auto t = static_cast<float>(kael::Half(static_cast<float>(std::tanh(static_cast<double>(q)))));
      const auto want = static_cast<float>(kael::Half(t * c));
      const auto got = static_cast<float>(oh[i]);
      exact += got == want;
      EXPECT_NEAR(got, want, std::fabs(want) / 512 + 1e-7) << i;
    }
    EXPECT_GE(exact, 990) << "cap=" << cap;
  }
}

TEST(GemmaOps, ErrorsWriteNothing) {
  std::vector<float> a(6, 1.0f), out(6, 7.0f);
  std::vector<double> d(6, 1.0);
  auto expect_error = [&](auto run, kael::ErrorKind kind, const std::string& what) {
    try {
      run();
      FAIL() << "expected: " << what;
    } catch (const kael::Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    for (float v : out) EXPECT_EQ(v, 7.0f);
  };
  const View o = kael::contiguous_view(out.data(), DType::Float32, {2, 3});
  const View x = kael::contiguous_view(a.data(), DType::Float32, {2, 3});
  for (double cap : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    expect_error([&] { kael::softcap(o, x, cap); }, kael::ErrorKind::Kael, "softcap: cap must be a positive finite");
  }
  expect_error(
      [&] {
        kael::softcap(o, kael::contiguous_view(a.data(), DType::Float32, {3, 2}), 1.0);
      },
      kael::ErrorKind::Shape, "softcap: x and out must share a shape");
  expect_error(
      [&] {
        kael::gelu_tanh_mul(o, x, kael::contiguous_view(d.data(), DType::Float64, {2, 3}));
      },
      kael::ErrorKind::DType, "gelu_tanh_mul: gate, up and out must share a dtype, got float64 and float32");
  expect_error([&] { kael::gelu_tanh_mul(o, x, kael::contiguous_view(a.data(), DType::Float32, {6})); },
               kael::ErrorKind::Shape, "gelu_tanh_mul: gate, up and out must share a shape");
}

}  // namespace
