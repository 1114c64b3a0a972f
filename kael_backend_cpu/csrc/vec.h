// The table of vectorised inner kernels, one per instruction set.
//
// NOTE [runtime dispatch]: the vector kernels are written once, by family
// (vec_core.h: types and loads; vec_math.h: exp/tanh/sigmoid/silu/gelu; vec_rows.h:
// softmax/layer_norm rows; vec_llama.h: rms_norm/silu_mul/rope rows; vec_arith.h: add/sub/mul/div; vec_gemm_packed.h
// and vec_gemm_rows.h: matrix products), gathered into a table by vec_table.h, and compiled three times, each inside a
// namespace of its own: by vec_base.cpp for the baseline target (SSE2 on x86-64, NEON on arm64; table "baseline"), by
// vec_avx2.cpp with -mavx2 -mfma (table "avx2", 32-byte vectors) and by vec_avx512.cpp with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq (table "avx512", 64-byte vectors). vec_select.cpp reads CPUID and XGETBV once and picks the
// widest table whose instructions the CPU has and whose registers the OS saves (vec_table_requires names them);
// KAEL_CPU_ISA=baseline|avx2|avx512 (base: baseline) forces one, and a name it does not know or a table this CPU cannot
// run makes every vector kernel throw a BackendError saying so (never an illegal instruction). The default build never
// uses -march=native, so a wheel runs on any x86-64.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "quant_formats.h"

namespace kael {

// The scratch qdot_rows needs for m > 1 rows: three weight rows expanded to float32 and their
// block scales (vec_quant.h: kQRows).
constexpr int64_t qdot_scratch_floats(int64_t k) {
  return 3 * (k + k / 32);
}

// The scratch bf16gemm_cols needs: one packed panel of 128 value pairs x 32 columns (vec_bf16_dot.h: kBgKC, kBgNR).
constexpr int64_t kBf16GemmPanelWords = 4096;

// The scratch int8gemm_cols needs: one packed panel of 16 blocks x 32 columns (vec_quant_gemm.h: kIgBlocks, kIgNR).
constexpr int64_t kInt8GemmPanelBytes = int64_t{16} * (8 * 32 * 4 + 32 * 4);

// Matrix-multiply building blocks for element type T (float or double).
template <class T>
struct GemmKernels {
  int mr = 0, nr = 0;              // micro-tile
  int64_t mc = 0, kc = 0, nc = 0;  // cache blocks (mc % mr == 0, nc % nr == 0)
  // C[m x n] (+)= Ap[kc x mr panel] * Bp[kc x nr panel]; m <= mr, n <= nr
  void (*kernel)(int64_t kc, const T* ap, const T* bp, T* c, int64_t rsc, int64_t csc, int m, int n,
                 bool accumulate) = nullptr;
  // Pack rows [0, mc) x cols [0, kc) of A into mr-row panels (zero padded).
  void (*pack_a)(int64_t mc, int64_t kc, const T* a, int64_t rsa, int64_t csa, T* ap) = nullptr;
  // Pack rows [0, kc) x cols [0, nc) of B into nr-column panels (zero padded).
  void (*pack_b)(int64_t kc, int64_t nc, const T* b, int64_t rsb, int64_t csb, T* bp) = nullptr;
  // Few rows, B contiguous along n (csb == 1), C contiguous along n (csc == 1):
  // C[M x N] (+)= A[M x K] B[K x N], B streamed once per call.
  void (*rows_nmajor)(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb,
                      T* c, int64_t rsc, bool accumulate) = nullptr;
  // Few rows, A and B contiguous along k (csa == 1, rsb == 1): dot products.
  void (*rows_kmajor)(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb, T* c,
                      int64_t rsc, int64_t csc, bool accumulate) = nullptr;
};

struct VecTable {
  const char* name = "";
  GemmKernels<float> sgemm;
  GemmKernels<double> dgemm;
  // contiguous float32 elementwise
  void (*exp_f32)(float* out, const float* x, int64_t n) = nullptr;
  void (*tanh_f32)(float* out, const float* x, int64_t n) = nullptr;
  void (*sigmoid_f32)(float* out, const float* x, int64_t n) = nullptr;
  void (*silu_f32)(float* out, const float* x, int64_t n) = nullptr;  // x / (1 + exp(-x))
  void (*gelu_tanh_f32)(float* out, const float* x, int64_t n) = nullptr;
  void (*gelu_tanh_bwd_f32)(float* grad_in, const float* grad_out, const float* x, int64_t n) = nullptr;
  // contiguous float32 rows
  double (*sum_f32)(const float* x, int64_t n) = nullptr;
  float (*max_f32)(const float* x, int64_t n) = nullptr;                    // ignores nan
  double (*sum_exp_f32)(const float* x, float shift, int64_t n) = nullptr;  // sum exp(x - shift)
  void (*softmax_f32)(float* out, const float* x, int64_t n) = nullptr;
  void (*log_softmax_f32)(float* out, const float* x, int64_t n) = nullptr;
  // out = (x - mean) * rstd * w + b (w, b may be null); returns mean and rstd
  void (*layer_norm_f32)(float* out, const float* x, const float* w, const float* b, int64_t n, float eps, float* mean,
                         float* rstd) = nullptr;
  // y[i] += a * x[i]
  void (*axpy_f32)(float* y, float a, const float* x, int64_t n) = nullptr;
  // out = a (op) b for op 0..3 = add, sub, mul, div; sa/sb are 0 (broadcast) or 1.
  // Large outputs are written with non-temporal stores (no read-for-ownership).
  void (*arith_f32)(int op, float* out, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) = nullptr;
  // Llama-family rows (vec_llama.h): sum of x[i]^2; out = (x * r) * w (w may be null);
  // out = silu(gate) * up; rotate-half over n pairs: o1 = x1 c - x2 s, o2 = x2 c + x1 s
  double (*sumsq_f32)(const float* x, int64_t n) = nullptr;
  void (*scale_mul_f32)(float* out, const float* x, float r, const float* w, int64_t n) = nullptr;
  void (*silu_mul_f32)(float* out, const float* gate, const float* up, int64_t n) = nullptr;
  void (*rope_f32)(float* o1, float* o2, const float* x1, const float* x2, const float* c, const float* s,
                   int64_t n) = nullptr;
  // Weight formats (vec_quant.h), indexed by QuantScheme (kernels.h): out[0..k) = one weight row as float32
  void (*dequant_row[kQuantSchemes])(float* out, const uint8_t* row, int64_t k) = {};
  // c[i * rsc + j] = x row i . weight row j (+ bias[j]), i < m, j < n, weight rows rsw bytes apart; row: scratch of
  // qdot_scratch_floats(k) floats (m > 1)
  void (*qdot_rows[kQuantSchemes])(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const uint8_t* w,
                                   int64_t rsw, const float* bias, float* c, int64_t rsc, float* row) = {};
  // The integer path (vec_quant_dot.h; q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, else null): c[i * rsc + j] = Q8_0
  // activation row i (xq
  // + i * k int8, k / 32 scales then k / 32 sums at xd + i * 2 * (k / 32)) . weight row j (+ bias[j]), i < m <= 16,
  // j < n
  void (*q8dot_rows[kQuantSchemes])(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd,
                                    const uint8_t* w, int64_t rsw, const float* bias, float* c, int64_t rsc) = {};
  // The integer path on repacked rows (vec_quant_packed.h, NOTE [repacked rows]; q8_0, q4_0, q5_0, iq4_nl on the
  // AVX-512 table of a CPU with AVX512_VNNI, else null): c[i * rsc + j] = Q8_0 activation row i (as q8dot_rows' xq, xd;
  // xs: its k / 32 int32 block sums of q) . weight row j, i < m <= 16, 16 s0 <= j < 16 s1, slab s at pw + 16 s rsw (no
  // bias)
  void (*q8dot_packed[kQuantSchemes])(int64_t m, int64_t s0, int64_t s1, int64_t k, const int8_t* xq, const float* xd,
                                      const int32_t* xs, const uint8_t* pw, int64_t rsw, float* c, int64_t rsc) = {};
  // Its super-block twin (q6_k; Q8_K activation rows as q8kdot_rows' xq, xd, xs)
  void (*q8kdot_packed[kQuantSchemes])(int64_t m, int64_t s0, int64_t s1, int64_t k, const int8_t* xq, const float* xd,
                                       const int16_t* xs, const uint8_t* pw, int64_t rsw, float* c, int64_t rsc) = {};
  // The integer path for the super-blocks (vec_quant_dot_k.h; q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, else null):
  // c[i * rsc + j] = Q8_K activation row i (xq + i * k int8, its k / 256 scales at xd + i * (k / 256), its k / 16
  // bsums at xs + i * (k / 16)) . weight row j (+ bias[j]), i < m <= 16, j < n
  void (*q8kdot_rows[kQuantSchemes])(int64_t m, int64_t n, int64_t k, const int8_t* xq, const float* xd,
                                     const int16_t* xs, const uint8_t* w, int64_t rsw, const float* bias, float* c,
                                     int64_t rsc) = {};
  // The bfloat16 path for bf16 weights (vec_bf16_dot.h; null unless the table is AVX-512 and the CPU has
  // AVX512_BF16): c[i * rsc + j] = bfloat16 activation row i (xb + i * kp, kp = k rounded up to 32, zero-padded) .
  // bfloat16 weight row j (w + j * rsw bytes) (+ bias[j]), i < m <= 16, j < n
  void (*bf16dot_rows)(int64_t m, int64_t n, int64_t k, const uint16_t* xb, const uint8_t* w, int64_t rsw,
                       const float* bias, float* c, int64_t rsc) = nullptr;
  // The float16 path for f16 weights (vec_f16_dot.h; every table): c[i * rsc + j] = activation row i (x + i * kp:
  // float16 values as float32, kp = k rounded up to 32, zero-padded) . float16 weight row j (+ bias[j]), i < m <= 16
  void (*f16dot_rows)(int64_t m, int64_t n, int64_t k, const float* x, const uint8_t* w, int64_t rsw, const float* bias,
                      float* c, int64_t rsc) = nullptr;
  // Its GEMM for prompts (NOTE [bfloat16 GEMM]; null with bf16dot_rows): c[i * rsc + j] = bfloat16 row i of a (kp
  // apart, as xb) . weight row j, i < m, j0 <= j < j1 (no bias); panel: scratch of bf16gemm_panel_words() words
  void (*bf16gemm_cols)(int64_t m, int64_t j0, int64_t j1, int64_t k, const uint16_t* a, const uint8_t* w, int64_t rsw,
                        float* c, int64_t rsc, uint32_t* panel) = nullptr;
  // The AMX bfloat16 GEMM (vec_bf16_amx.h, NOTE [AMX bfloat16 GEMM]; the AVX-512 table where the CPU has AMX-BF16
  // and os_amx, else null): c[i * rsc + j] = bfloat16 row i of A (xp: quant.cpp's bf16amx_pairs layout) . weight
  // row j (n rows of k bfloat16 values, rsw bytes apart), i < m, j0 <= j < j1 (no bias); panel: 1024 words
  void (*bf16amx_cols)(int64_t m, int64_t n, int64_t j0, int64_t j1, int64_t k, const uint32_t* xp, const uint8_t* w,
                       int64_t rsw, float* c, int64_t rsc, uint32_t* panel) = nullptr;
  // With it: vdpbf16ps's instructions per second over vfmadd231ps's on this CPU (NOTE [bfloat16 GEMM pays]), measured
  // at each call (a fraction of a millisecond)
  double (*bf16_issue_ratio)() = nullptr;
  // The integer GEMM for prompts (vec_quant_gemm.h, NOTE [integer GEMM]; q8_0, q4_0, q5_0, iq4_nl on the AVX-512
  // table of a CPU with AVX512_VNNI, else null): c[i * rsc + j] = Q8_0 activation row i (as q8dot_rows' xq, xd; xs:
  // its k / 32 int32 block sums of q) . weight row j, i < m, j0 <= j < j1 (no bias); panel: kInt8GemmPanelBytes
  void (*int8gemm_cols[kQuantSchemes])(int64_t m, int64_t j0, int64_t j1, int64_t k, const int8_t* xq, const float* xd,
                                       const int32_t* xs, const uint8_t* w, int64_t rsw, float* c, int64_t rsc,
                                       uint8_t* panel) = {};
  // Its super-block twin (NOTE [integer K GEMM]; q2_k .. q6_k, iq4_xs): Q8_K activation rows as q8kdot_rows' xq, xd,
  // xs; panel: 2 * kInt8GemmPanelBytes
  void (*int8kgemm_cols[kQuantSchemes])(int64_t m, int64_t j0, int64_t j1, int64_t k, const int8_t* xq, const float* xd,
                                        const int16_t* xs, const uint8_t* w, int64_t rsw, float* c, int64_t rsc,
                                        uint8_t* panel) = {};
};

// The table the kernels use: chosen at the first call (NOTE [runtime dispatch]); throws
// kael::Error (BackendError) when KAEL_CPU_ISA names an unknown table or one this CPU cannot run.
const VecTable& vec();
// The portable table and, when compiled in (else nullptr), the AVX2 and AVX-512 ones. Only
// call a table's kernels when vec_table_missing(name) is empty.
const VecTable& vec_base_table();
const VecTable* vec_avx2_table();
const VecTable* vec_avx512_table();

// What CPUID and XGETBV report: the instruction sets and whether the OS saves the YMM
// (os_avx) and opmask/ZMM (os_avx512) register state across context switches.
struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX-BF16 with AMX-TILE
  bool os_avx = false, os_avx512 = false;
  bool os_amx = false;  // the OS saves the tile state and granted it to this process (Linux: arch_prctl)
};
const CpuFeatures& cpu_features();
// (name, present) for every field of CpuFeatures, in declaration order.
std::vector<std::pair<std::string, bool>> cpu_feature_list();
// The tables compiled into this build, widest first ("avx512", "avx2", "baseline").
std::vector<std::string> vec_tables_compiled();
// The features (cpu_feature_list names) table `name` needs; empty for baseline.
std::vector<std::string> vec_table_requires(const std::string& name);
// Why this process cannot run table `name`: "" when it can, else "not compiled in" or the
// features it lacks. An unknown name is reported as such.
std::string vec_table_missing(const std::string& name);
// The tables this CPU can run, widest first.
std::vector<std::string> vec_tables_runnable();
// The compiled-in table called `name` ("base" is "baseline"), or nullptr.
const VecTable* vec_table_named(const std::string& name);

}  // namespace kael
