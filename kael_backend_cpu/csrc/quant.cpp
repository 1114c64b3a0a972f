// dequantize and quantized_linear: float32 from weights stored in GGML's blocks (quant_formats.h:
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL; the 256-value super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_XS) or as bfloat16 / float16 (the formats of NOTE [weight formats] in kael/quant/_formats.py).
//
// NOTE [quantized linear paths]: out [M, N] = x [M, K] @ dequantize(weight [N, ..]).T + bias.
// * M <= 16 (decode, batched decode, short prompts): dot products of the M rows with each
//   weight row, the weights expanded to float32 in registers (vec_quant.h: qdot_rows) and
//   read from memory once for all M rows; threads split N into contiguous ranges. Each row
//   sums its products in one fixed order (32-value block sums, a super-block's 32-value
//   chunks likewise, added into one vector accumulator, its lanes, the bias last), so a row's
//   result is bit-identical whatever M is.
// * M > 16 (prefill): compute-bound: the packed GEMM (gemm.h: sgemm_packed_b), whose B panels
//   are dequantized straight from the weight rows as they are packed, so the work is a float32
//   GEMM's plus one dequantization of each weight block per depth block and thread (depth
//   blocks are whole blocks: multiples of 256 values for the super-blocks). A row's result
//   here may differ from the few-row path in the last bits (another summation order).
// Dequantized values are exact (d * q fits float32), so only the summation order differs
// from a float64 reference.
//
// NOTE [integer quantized linear]: for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL weights, the integer path
// (KAEL_QUANT_ACTIVATIONS=q8) quantizes each activation row once per call to GGML's Q8_0 blocks, exactly as ggml's CPU
// backend does on x86 (AVX) and ARM (NEON), its quantize_row_q8_0 (per 32 values: amax = max |x|, d = amax / 127 in
// float32, id = amax != 0 ? 127 / amax : 0, q = x * id rounded to nearest, half-way cases to even; the scale kept is d
// rounded to float16, as GGML stores it). ggml's portable reference quantize_row_q8_0_ref (id = 1 / d, roundf: half-way
// away from zero) differs from it at half-way products, which values with few distinct levels (a Q4_0 / Q5_0 token
// table's rows through an RMSNorm of unit weights) hit often: following the reference there took llama.cpp agreement on
// such files from 284 to 267 of 288 top tokens. A block holding an inf or a nan gets scale nan and q = 0, so every dot
// product reading it is nan; one so small that 127 / amax overflows (amax < 127 / FLT_MAX) gets q = 0 (its float16
// scale is 0). Q4_1 / Q5_1 weights also use Q8_1's block sum s = float16(float(sum q) * d), as quantize_row_q8_1 (same
// q and d as Q8_0's). The dot products are
// integer sums per block in the order of NOTE [integer dot order] (vec_quant_dot.h); for Q4_1 / Q5_1 in ggml's own
// order, NOTE [ggml q8_1 dot order] (vec_quant_dot_q81.h). For the super-block formats
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS it quantizes the rows to GGML's Q8_K blocks instead (llama.cpp's vec_dot_type
// for them), exactly as ggml's reference quantize_row_q8_K_ref (per 256 values: max = the first value of largest |x|,
// with its sign; iscale = -127 / max; q = nearest integer of iscale * x, ties to even as ggml's nearest_int, at most
// 127; d = 1 / iscale kept in float32; bsums = the sums of q over each 16 values). An all-zero block gets d = 0 and
// q = 0; one holding an inf or a nan gets d = nan and q = 0 (every dot product reading it is nan; ggml's own result
// there is undefined behaviour); one so small that -127 / max overflows gets q = 0 and d = 1 / iscale, a zero (what
// ggml's bit arithmetic gives). Their dot products follow NOTE [integer K dot order] (vec_quant_dot_k.h): per
// super-block exact int32 sums of the weight's integer scales (and mins against bsums), then float32 scale products.
// KAEL_QUANT_ACTIVATIONS is read at every call: unset (or auto) takes the faster path for the call, f32 the
// float32-activation path (the conformance reference) always, q8 the integer path at every row count.
// * q8: a prompt's rows go through the same kernels in waves of up to 16 rows (each wave reading a thread's slice of
//   the weight rows while it is in cache), so a row's result never depends on how many rows there are, and a
//   prompt's logits are what the same rows decoded one by one give: llama.cpp's arithmetic on its CPU backend, which
//   quantizes activations this way for prompts and decode alike (the agreement tests with llama.cpp use it).
// * auto, prompts: on the AVX-512 table of a CPU with AVX512_VNNI, calls of more than 16 rows with Q8_0 / Q4_0 / Q5_0 /
//   IQ4_NL weights take the integer GEMM of NOTE [integer GEMM] (vec_quant_gemm.h: the same Q8_0 activations, VNNI
//   micro-tiles, one float sum per output in block order; 1.75-2.6x the packed float GEMM on GPT-2's 512-row
//   projections, 1 and 2 threads); its rows do not depend on the prompt's length, and differ from the few-row
//   kernels' in summation order only. The super-block formats (Q2_K .. Q6_K, IQ4_XS) take the integer K GEMM of NOTE
//   [integer K GEMM] on the same tables: Q8_K activations and NOTE [integer K dot order] itself, so a prompt's rows
//   are the bits the few-row kernels give the same rows decoded one by one (Q4_K 1.5x, Q6_K 1.8-2.5x the packed float
//   GEMM on GPT-2's 512-row projections, 1 thread). Elsewhere prompts take the float path as below.
// * auto (the default): the integer path for calls of up to 16 rows (decode, batched decode, speculative
//   verification) for every integer format on the AVX2 and AVX-512 tables, whose SIMD integer kernels measured
//   1.6-2.7x the float few-row kernels there (a GPT-2 Q8_0 file's decode, 1 thread: 1.8x; Q6_K / Q4_K at 1 and 16
//   rows: 1.6-2.7x, benchmarks/quant_int8_linear.py); the float path otherwise: for a 128-row prompt the waves
//   measured 0.69-0.89x the packed float GEMM's speed (GPT-2's c_fc, Q4_0 / Q8_0, 1 and 2 threads;
//   benchmarks/quant_int8_linear.py --rows), and the baseline table's portable integer kernels are slower than its
//   float ones. Rows of up to 16 stay bit-identical batched and alone;
//   a prompt's rows above 16 differ from the same rows decoded one by one by the activation rounding (about
//   |d_x| / 2 per value), as they differed by float32 summation order before.
//
// NOTE [float16 activations]: for f16 weights the same modes choose the float16 path on every table (auto: up to 16
// rows, not on the baseline table): each activation row is rounded to float16 once per call (nearest, ties to even;
// beyond float16's range, +-inf), as llama.cpp's CPU backend does for F16 weights (its vec_dot_type is F16), and the
// products, exact in float32, are summed in the order of NOTE [float16 dot order] (vec_f16_dot.h): the same bits on
// every table. The rounding moves each activation by up to 2^-11 of its magnitude (float16's subnormals below
// 2^-14 by up to 2^-25).
//
// NOTE [bfloat16 activations]: for bf16 weights the same modes choose the bfloat16 path where the table is AVX-512
// and the CPU has AVX512_BF16 (vec().bf16dot_rows; elsewhere bf16 weights always take the float32-activation
// path): each activation row is rounded to bfloat16 once per call as ggml's GGML_FP32_TO_BF16 (nearest, ties to
// even; a nan keeps its upper bits, made quiet), zero-padded to a multiple of 32 values, and the products are
// summed by vdpbf16ps in the order of NOTE [bfloat16 dot order] (vec_bf16_dot.h): what llama.cpp's CPU backend does
// for BF16 weights (its vec_dot_type is BF16), though its own summation order differs. The rounding moves each
// activation by up to 2^-9 of its magnitude; the instruction also reads bfloat16 subnormals as zero and flushes
// float32 results below the normal range to zero. auto takes it for calls of up to 16 rows (GPT-2's lm_head, 1
// thread: 2.5x the float kernel at 1 row, 3.9x at 8 rows, which convert every weight to float32), q8 at every row
// count (waves of 16 rows), f32 never. Rows of up to 16 stay bit-identical batched and alone. Prompts of more than
// 16 rows take, in auto only and where it pays (NOTE [bfloat16 GEMM pays]), the bfloat16 GEMM of NOTE [bfloat16
// GEMM] (vec_bf16_dot.h; 1.7-2x the packed float
// GEMM on GPT-2's 512-row projections, 1 thread), whose rows do not depend on the prompt's length either but differ
// from the few-row kernel's in summation order (as the float GEMM's did from the float few-row kernel).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "buffer.h"
#include "gemm.h"
#include "half.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kFewRows = 16;  // rows up to which the dot-product path runs

int64_t block_bytes(QuantScheme s) {
  return quant_block_bytes(s);
}

bool is_block(QuantScheme s) {
  return quant_is_block(s);
}

// A weight's rows, each contiguous in bytes (copied when the view's last stride is not 1).
struct WeightRows {
  const uint8_t* data = nullptr;
  int64_t row_stride = 0;  // bytes
  Temp copy;
};

// Checks that `w` holds an [n, k] matrix in scheme `s` and returns its rows.
WeightRows weight_rows(const char* op, const View& w, QuantScheme s, int64_t n, int64_t k) {
  const char* name = quant_scheme_name(s);
  KAEL_CHECK(w.ndim == 2, Shape, op, ": weight must be 2-d ([N, row bytes] or [N, K]), got ", w.ndim, " dims");
  int64_t cols = k;
  if (is_block(s)) {
    KAEL_CHECK(w.dtype == DType::UInt8, DType, op, ": a ", name, " weight must be uint8 blocks, got ",
               dtype_name(w.dtype));
    const int64_t qk = quant_block_values(s);
    KAEL_CHECK(k % qk == 0, Shape, op, ": K = ", k, " is not a multiple of the ", name, " block size ", qk);
    cols = k / qk * block_bytes(s);
    KAEL_CHECK(w.shape[0] == n && w.shape[1] == cols, Shape, op, ": a ", name, " weight for [N, K] = [", n, ", ", k,
               "] must be uint8 [", n, ", ", cols, "] (K/", qk, " blocks of ", block_bytes(s), " bytes a row), got [",
               w.shape[0], ", ", w.shape[1], "]");
  } else {
    const DType want = s == QuantScheme::BF16 ? DType::BFloat16 : DType::Float16;
    KAEL_CHECK(w.dtype == want, DType, op, ": a ", name, " weight must be ", dtype_name(want), ", got ",
               dtype_name(w.dtype));
    KAEL_CHECK(w.shape[0] == n && w.shape[1] == k, Shape, op, ": a ", name, " weight for [N, K] = [", n, ", ", k,
               "] must be [", n, ", ", k, "], got [", w.shape[0], ", ", w.shape[1], "]");
  }
  WeightRows r;
  const View* v = &w;
  if (cols > 1 && w.strides[1] != 1) {
    r.copy = to_contiguous(w, w.dtype);
    v = &r.copy.view;
  }
  r.data = v->ptr<uint8_t>();
  r.row_stride = (n > 1 ? v->strides[0] : cols) * itemsize(w.dtype);
  return r;
}

// Leading dims of v collapse to one row dim? Its stride in *rs (0 for a 1-d view).
bool rows_stride(const View& v, int64_t* rs) {
  const int nd = v.ndim;
  if (nd == 1) {
    *rs = 0;
    return true;
  }
  for (int d = 0; d < nd - 2; ++d) {
    if (v.shape[d] != 1 && v.strides[d] != v.strides[d + 1] * v.shape[d + 1]) return false;
  }
  *rs = v.strides[nd - 2];
  return true;
}

// KAEL_QUANT_ACTIVATIONS, read at every call (NOTE [integer quantized linear]).
enum class ActMode { Auto, F32, Q8 };
ActMode activation_mode() {
  const char* mode = std::getenv("KAEL_QUANT_ACTIVATIONS");
  if (mode == nullptr || *mode == '\0' || std::strcmp(mode, "auto") == 0) return ActMode::Auto;
  if (std::strcmp(mode, "f32") == 0) return ActMode::F32;
  KAEL_CHECK(std::strcmp(mode, "q8") == 0, Kael,
             "quantized_linear: KAEL_QUANT_ACTIVATIONS must be 'auto', 'f32' or 'q8' (or unset: auto), got '", mode,
             "'");
  return ActMode::Q8;
}

// The integer path (or, for bf16, the bfloat16 few-row kernel) is taken for an m-row call (NOTE [integer quantized
// linear], NOTE [bfloat16 activations])?
bool use_int8_path(QuantScheme s, int64_t m, ActMode mode) {
  const int f = static_cast<int>(s);
  const bool kernel = vec().q8dot_rows[f] != nullptr || vec().q8kdot_rows[f] != nullptr ||
                      (s == QuantScheme::BF16 && vec().bf16dot_rows != nullptr) ||
                      (s == QuantScheme::F16 && vec().f16dot_rows != nullptr);
  if (mode == ActMode::F32) return false;
  if (mode == ActMode::Q8) return kernel;  // every row count (waves of kFewRows rows)
  // auto: the faster path. The integer kernels with SIMD (every integer format on the AVX2 and AVX-512 tables)
  // and vdpbf16ps (bf16) beat the float few-row kernels at up to kFewRows rows; above, the packed float GEMM
  // beats the waves (bf16 there takes the bfloat16 GEMM: use_bf16_gemm).
  return kernel && m <= kFewRows && std::strcmp(vec().name, "baseline") != 0;
}

// A prompt (more than kFewRows rows) takes the integer GEMM (NOTE [integer GEMM] in vec_quant_gemm.h)? auto only.
bool use_int8_gemm(QuantScheme s, int64_t m, ActMode mode) {
  const int f = static_cast<int>(s);
  return m > kFewRows && mode == ActMode::Auto &&
         (vec().int8gemm_cols[f] != nullptr || vec().int8kgemm_cols[f] != nullptr);
}

// vdpbf16ps's issue rate over vfmadd231ps's at which auto takes the bfloat16 GEMM (NOTE [bfloat16 GEMM pays]).
constexpr double kBf16GemmMinRatio = 0.375;

// KAEL_BF16_GEMM, read at every call: "1" takes the bfloat16 GEMM wherever the table has it, "0" never; unset (or
// empty): where it pays on this CPU (measured once per table, NOTE [bfloat16 GEMM pays]).
bool bf16_gemm_wanted() {
  const char* v = std::getenv("KAEL_BF16_GEMM");
  if (v != nullptr && *v != '\0') {
    KAEL_CHECK(std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0, Kael,
               "quantized_linear: KAEL_BF16_GEMM must be '0' or '1' (or unset: where it pays), got '", v, "'");
    return v[0] == '1';
  }
  return bf16_gemm_pays();
}

// A bf16 prompt (more than kFewRows rows) takes a bfloat16 GEMM (NOTE [AMX bfloat16 GEMM] in vec_bf16_amx.h where the
// table has it, else NOTE [bfloat16 GEMM] in vec_bf16_dot.h)? auto only.
bool use_bf16_gemm(QuantScheme s, int64_t m, ActMode mode) {
  // (the variable is checked on every table: a bad value is refused where the GEMM is absent too)
  return s == QuantScheme::BF16 && m > kFewRows && mode == ActMode::Auto && bf16_gemm_wanted() &&
         (vec().bf16amx_cols != nullptr || vec().bf16gemm_cols != nullptr);
}

// v rounded to the nearest integer, ties to even, for |v| < 2^22: what std::nearbyint gives under the default
// rounding mode, without its call (glibc saves and restores the floating-point environment around it, which made
// quantizing a 512-row prompt's activations cost as much as half of the GEMM after it). Adding 1.5 * 2^23 puts
// v's integer part in the float's last bit (the addition rounds ties to even), and subtracting it is exact. This
// file is built with -ffp-contract=off, so v's own product is rounded before the addition, as before.
inline float rint_small(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

constexpr uint32_t kFloatMaxBits = 0x7F7FFFFFu;  // FLT_MAX's bits: |x|'s bits above it are an inf or a nan

// The largest of x[0..n)'s magnitudes as float bits (the sign cleared): for floats of one sign the bits order as the
// values do, an inf's and a nan's above every finite one; an integer maximum, which the compiler vectorizes (a float
// one it may not, for nan's sake), where each element used to wait on the previous one's comparison.
inline uint32_t abs_bits_max(const float* x, int n) {
  uint32_t top = 0;
  for (int j = 0; j < n; ++j) {
    uint32_t u;
    std::memcpy(&u, x + j, 4);
    u &= 0x7FFFFFFFu;
    top = u > top ? u : top;
  }
  return top;
}

// Row x[0..k) as GGML's Q8_0 blocks: q[0..k), the k / 32 float16-rounded scales d[0..k/32) and
// Q8_1's sums d[k/32 + b] = float16(float(sum q) * unrounded d) (NOTE [integer quantized linear]).
void quantize_row_q8(const float* x, int64_t k, int8_t* q, float* d) {
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    const uint32_t top = abs_bits_max(xb, 32);
    if (top > kFloatMaxBits) {  // an inf or a nan
      std::memset(q + b * 32, 0, 32);
      d[b] = d[nb + b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float amax;
    std::memcpy(&amax, &top, 4);
    const float db = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    if (id <= std::numeric_limits<float>::max()) {  // then |x * id| <= 127 (within a rounding)
      for (int j = 0; j < 32; ++j) {
        const auto qi = static_cast<int32_t>(rint_small(xb[j] * id));
        q[b * 32 + j] = static_cast<int8_t>(qi);
        sum += qi;
      }
    } else {  // 127 / amax overflowed (amax < 127 / FLT_MAX: d's float16 is 0): q = 0 (ggml's conversion of inf /
              // nan is undefined)
      std::memset(q + b * 32, 0, 32);
    }
    d[b] = half_bits_to_float(float_to_half_bits(db));
    d[nb + b] = half_bits_to_float(float_to_half_bits(static_cast<float>(sum) * db));
  }
}

// Row x[0..k) as GGML's Q8_K super-blocks (NOTE [integer quantized linear]): q[0..k), the k / 256
// float32 scales d[0..k/256) and the k / 16 sums of 16 q each, s[0..k/16).
void quantize_row_q8k(const float* x, int64_t k, int8_t* q, float* d, int16_t* s) {
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + b * 256;
    int8_t* qb = q + b * 256;
    const uint32_t top = abs_bits_max(xb, 256);
    const bool finite = top <= kFloatMaxBits;
    float amax, max = 0.0f;  // the first value of largest magnitude, with its sign
    std::memcpy(&amax, &top, 4);
    if (finite && top != 0) {
      for (int j = 0; j < 256; ++j) {
        if (std::fabs(xb[j]) == amax) {
          max = xb[j];
          break;
        }
      }
    }
    const float iscale = -127.0f / max;
    if (!finite || amax == 0.0f || std::isinf(iscale)) {
      // inf / nan: d = nan (every dot product reading the block is nan); all zero: d = 0; so small that
      // -127 / max overflows: d = 1 / iscale, a zero of either sign (ggml's bit arithmetic gives these q = 0 too)
      std::memset(qb, 0, 256);
      std::memset(s + b * 16, 0, 16 * sizeof(int16_t));
      d[b] = !finite ? std::numeric_limits<float>::quiet_NaN() : amax == 0.0f ? 0.0f : 1.0f / iscale;
      continue;
    }
    for (int j = 0; j < 256; ++j) {
      // |iscale * x| <= 127 (+ its rounding): nearest, ties to even (ggml's nearest_int), at most 127
      const float v = rint_small(iscale * xb[j]);
      qb[j] = static_cast<int8_t>(static_cast<int32_t>(v < 127.0f ? v : 127.0f));
    }
    for (int g = 0; g < 16; ++g) {
      int32_t sum = 0;
      for (int l = 0; l < 16; ++l) sum += qb[16 * g + l];
      s[b * 16 + g] = static_cast<int16_t>(sum);
    }
    d[b] = 1.0f / iscale;
  }
}

// c[i * rsc + j] (+)= bias[j] for the m x n block.
void add_bias(float* c, int64_t rsc, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * rsc;
    for (int64_t j = 0; j < n; ++j) ci[j] += bias[j];
  }
}

// quantize(row i) for each of m rows of k values (threads split the rows): the activations quantized (or rounded)
// once per call, the first pass of int8_passes and gemm_passes.
template <class Quantize>
void rows_pass(int64_t m, int64_t k, const Quantize& quantize) {
  parallel_for(0, m, std::max<int64_t>(1, 65536 / k), [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) quantize(i);
  });
}

// The integer path's two passes over m rows of x: quantize(row i) for each row (rows_pass), then
// wave(i0, rows, j0, j1) for waves of up to kFewRows rows starting at row i0 against weight rows
// j0..j1 (threads split N; a thread's slice of weight rows stays in cache across the waves).
template <class Quantize, class Wave>
void int8_passes(int64_t m, int64_t n, int64_t k, const Quantize& quantize, const Wave& wave) {
  rows_pass(m, k, quantize);
  parallel_for(0, n, std::max<int64_t>(1, 32768 / (std::min(m, kFewRows) * k)), [&](int64_t j0, int64_t j1) {
    for (int64_t i0 = 0; i0 < m; i0 += kFewRows) wave(i0, std::min(kFewRows, m - i0), j0, j1);
  });
}

// The GEMM paths' two passes over m rows of x (NOTE [bfloat16 GEMM], [integer GEMM], [integer K GEMM]):
// quantize(row i) for each row (rows_pass), then panels(j0, j1, scratch) for output columns j0..j1 in whole
// 32-column panels (threads split them; scratch: scratch_bytes of the thread's own), then the bias of those columns
// into c (rsc apart).
template <class Quantize, class Panels>
void gemm_passes(int64_t m, int64_t n, int64_t k, size_t scratch_bytes, const float* bias, float* c, int64_t rsc,
                 const Quantize& quantize, const Panels& panels) {
  rows_pass(m, k, quantize);
  parallel_for(0, (n + 31) / 32, 1, [&](int64_t p0, int64_t p1) {
    const int64_t j0 = p0 * 32, j1 = std::min(n, p1 * 32);
    Buffer scratch(scratch_bytes);
    panels(j0, j1, scratch);
    if (bias != nullptr) add_bias(c + j0, rsc, m, j1 - j0, bias + j0);
  });
}

// out rows = the m rows of x through the integer path: the rows quantized once (Q8_K for the
// super-block formats, the table's q8kdot_rows; Q8_0 / Q8_1 for the others, q8dot_rows), then the
// table's integer dot products in int8_passes' waves.
void linear_int8(QuantScheme s, int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                 const float* bias, float* c, int64_t rsc) {
  const auto out = [&](int64_t i0, int64_t j0) { return c + i0 * rsc + j0; };
  const auto bias_at = [&](int64_t j0) { return bias == nullptr ? nullptr : bias + j0; };
  Buffer xq(static_cast<size_t>(m * k));
  auto* q = xq.get<int8_t>();
  if (const auto kdots = vec().q8kdot_rows[static_cast<int>(s)]; kdots != nullptr) {
    const int64_t nb = k / 256, ns = k / 16;
    Buffer xd(static_cast<size_t>(m * nb) * sizeof(float));
    Buffer xs(static_cast<size_t>(m * ns) * sizeof(int16_t));
    auto* d = xd.get<float>();
    auto* bs = xs.get<int16_t>();
    int8_passes(
        m, n, k, [&](int64_t i) { quantize_row_q8k(x + i * rsx, k, q + i * k, d + i * nb, bs + i * ns); },
        [&](int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
          kdots(rows, j1 - j0, k, q + i0 * k, d + i0 * nb, bs + i0 * ns, w.data + j0 * w.row_stride, w.row_stride,
                bias_at(j0), out(i0, j0), rsc);
        });
    return;
  }
  const int64_t nb = k / 32;
  Buffer xd(static_cast<size_t>(2 * m * nb) * sizeof(float));
  auto* d = xd.get<float>();
  const auto dots = vec().q8dot_rows[static_cast<int>(s)];
  int8_passes(
      m, n, k, [&](int64_t i) { quantize_row_q8(x + i * rsx, k, q + i * k, d + i * 2 * nb); },
      [&](int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
        dots(rows, j1 - j0, k, q + i0 * k, d + i0 * 2 * nb, w.data + j0 * w.row_stride, w.row_stride, bias_at(j0),
             out(i0, j0), rsc);
      });
}

// quantize_row_q8 of row x[0..k) plus its k / 32 int32 block sums of q into xs (the integer GEMM's and the
// repacked kernels' offset corrections).
void quantize_row_q8_sums(const float* x, int64_t k, int8_t* q, float* d, int32_t* xs) {
  quantize_row_q8(x, k, q, d);
  for (int64_t b = 0; b < k / 32; ++b) {
    int32_t sum = 0;
    for (int t = 0; t < 32; ++t) sum += q[b * 32 + t];
    xs[b] = sum;
  }
}

// KAEL_REPACK, read at every call: anything but "0" (or unset) lets a call read a repacked copy it is given.
bool repack_enabled() {
  const char* v = std::getenv("KAEL_REPACK");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// Weight rows a repacked slab interleaves (vec_quant_packed.h's kPackRows, NOTE [repacked rows]).
constexpr int64_t kPackSlab = 16;

// linear_int8 for rows of which pw holds a repacked copy (NOTE [repacked rows]; the table has
// q8dot_packed): the m <= kFewRows rows quantized once, then the whole slabs (threads split them) through the
// repacked kernel and the rows after them (GGML's layout in pw too) through q8dot_rows; the same bits as
// linear_int8 on the GGML rows.
void linear_int8_packed(QuantScheme s, int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const uint8_t* pw,
                        int64_t rsw, const float* bias, float* c, int64_t rsc) {
  const int64_t slabs = n / kPackSlab, j0 = slabs * kPackSlab;
  // slabs(s0, s1) for the whole slabs (threads split them) with their bias, then tail(j0) for the rows after them
  const auto passes = [&](const auto& run_slabs, const auto& tail) {
    parallel_for(0, slabs, std::max<int64_t>(1, 32768 / (m * kPackSlab * rsw)), [&](int64_t s0, int64_t s1) {
      run_slabs(s0, s1);
      if (bias != nullptr) add_bias(c + s0 * kPackSlab, rsc, m, (s1 - s0) * kPackSlab, bias + s0 * kPackSlab);
    });
    if (j0 < n) tail(bias == nullptr ? nullptr : bias + j0);
  };
  if (const auto kpacked = vec().q8kdot_packed[static_cast<int>(s)]; kpacked != nullptr) {  // Q8_K activations
    const int64_t nb = k / 256, ns = k / 16;
    Buffer xq(static_cast<size_t>(m * k)), xd(static_cast<size_t>(m * nb) * sizeof(float)),
        xsb(static_cast<size_t>(m * ns) * sizeof(int16_t));
    auto* q = xq.get<int8_t>();
    auto* d = xd.get<float>();
    auto* bs = xsb.get<int16_t>();
    for (int64_t i = 0; i < m; ++i) quantize_row_q8k(x + i * rsx, k, q + i * k, d + i * nb, bs + i * ns);
    passes([&](int64_t s0, int64_t s1) { kpacked(m, s0, s1, k, q, d, bs, pw, rsw, c, rsc); },
           [&](const float* tb) {
             vec().q8kdot_rows[static_cast<int>(s)](m, n - j0, k, q, d, bs, pw + j0 * rsw, rsw, tb, c + j0, rsc);
           });
    return;
  }
  const int64_t nb = k / 32;
  Buffer xq(static_cast<size_t>(m * k)), xd(static_cast<size_t>(2 * m * nb) * sizeof(float)),
      xsb(static_cast<size_t>(m * nb) * sizeof(int32_t));
  auto* q = xq.get<int8_t>();
  auto* d = xd.get<float>();
  auto* xs = xsb.get<int32_t>();
  for (int64_t i = 0; i < m; ++i) quantize_row_q8_sums(x + i * rsx, k, q + i * k, d + i * 2 * nb, xs + i * nb);
  const auto packed = vec().q8dot_packed[static_cast<int>(s)];
  passes([&](int64_t s0, int64_t s1) { packed(m, s0, s1, k, q, d, xs, pw, rsw, c, rsc); },
         [&](const float* tb) {
           vec().q8dot_rows[static_cast<int>(s)](m, n - j0, k, q, d, pw + j0 * rsw, rsw, tb, c + j0, rsc);
         });
}

// x rounded to bfloat16 (NOTE [bfloat16 activations]): nearest, ties to even; a nan keeps its upper bits with the
// quiet bit set. Its bits.
uint16_t bf16_round_bits(float x) {
  const uint32_t u = f32_bits(x);
  return static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? (u >> 16) | 64u
                                                               : (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Row x[0..k) rounded to bfloat16 as ggml's GGML_FP32_TO_BF16 (nearest, ties to even; a nan keeps its
// upper bits, made quiet) into xb[0..kp), zero-padded to kp (NOTE [bfloat16 activations]).
void round_row_bf16(const float* x, int64_t k, int64_t kp, uint16_t* xb) {
  for (int64_t j = 0; j < k; ++j) xb[j] = bf16_round_bits(x[j]);
  std::fill(xb + k, xb + kp, uint16_t{0});
}

// Row x[0..k) rounded to float16 and widened back (exact) into xr[0..kp), zero-padded to kp (NOTE [float16
// activations]).
void round_row_f16(const float* x, int64_t k, int64_t kp, float* xr) {
  for (int64_t j = 0; j < k; ++j) xr[j] = half_bits_to_float(float_to_half_bits(x[j]));
  std::fill(xr + k, xr + kp, 0.0f);
}

// out rows = the m rows of x through a rounded-activation path: each row rounded once by round (to T, kp = k
// rounded up to 32 values apart, zero-padded), then the table's few-row kernel dots in int8_passes' waves.
template <class T, class Round, class Dots>
void linear_rounded(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                    const float* bias, float* c, int64_t rsc, Round round, Dots dots) {
  const int64_t kp = (k + 31) / 32 * 32;
  Buffer xbuf(static_cast<size_t>(m * kp) * sizeof(T));
  auto* xr = xbuf.get<T>();
  int8_passes(
      m, n, k, [&](int64_t i) { round(x + i * rsx, k, kp, xr + i * kp); },
      [&](int64_t i0, int64_t rows, int64_t j0, int64_t j1) {
        dots(rows, j1 - j0, k, xr + i0 * kp, w.data + j0 * w.row_stride, w.row_stride,
             bias == nullptr ? nullptr : bias + j0, c + i0 * rsc + j0, rsc);
      });
}

// The float16 path: rows rounded to float16 (kept as float32 values), the table's f16dot_rows.
void linear_f16(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w, const float* bias,
                float* c, int64_t rsc) {
  linear_rounded<float>(m, n, k, x, rsx, w, bias, c, rsc, round_row_f16, vec().f16dot_rows);
}

// The bfloat16 path: rows rounded to bfloat16, the table's vdpbf16ps dot products (bf16dot_rows).
void linear_bf16(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w, const float* bias,
                 float* c, int64_t rsc) {
  linear_rounded<uint16_t>(m, n, k, x, rsx, w, bias, c, rsc, round_row_bf16, vec().bf16dot_rows);
}

// out rows = the m rows of x through the bfloat16 GEMM (NOTE [bfloat16 GEMM]): the rows rounded to bfloat16 once,
// threads splitting the columns in whole 32-column panels, then the bias.
void linear_bf16_gemm(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                      const float* bias, float* c, int64_t rsc) {
  const int64_t kp = (k + 31) / 32 * 32;
  Buffer xbuf(static_cast<size_t>(m * kp) * sizeof(uint16_t));
  auto* xb = xbuf.get<uint16_t>();
  const auto gemm = vec().bf16gemm_cols;
  gemm_passes(
      m, n, k, static_cast<size_t>(kBf16GemmPanelWords) * sizeof(uint32_t), bias, c, rsc,
      [&](int64_t i) { round_row_bf16(x + i * rsx, k, kp, xb + i * kp); },
      [&](int64_t j0, int64_t j1, const Buffer& panel) {
        gemm(m, j0, j1, k, xb, w.data, w.row_stride, c, rsc, panel.get<uint32_t>());
      });
}

// Row i of x (k values; null: a padding row of +0) rounded to bfloat16 into the AMX GEMM's pair layout (NOTE [AMX
// bfloat16 GEMM]): per group of 16 rows (group i / 16 at i / 16 * kp / 2 * 16 words), value pair p of row i (its
// values 2p, 2p + 1 as one 32-bit word, the first in the low half) at word p * 16 + i % 16; pairs past k +0.
void bf16amx_pairs(const float* x, int64_t k, int64_t kp, int64_t i, uint32_t* xp) {
  uint32_t* row = xp + i / 16 * (kp / 2 * 16) + i % 16;
  for (int64_t p = 0; p < kp / 2; ++p) {
    const int64_t v = 2 * p;
    const uint32_t lo = x != nullptr && v < k ? bf16_round_bits(x[v]) : 0u;
    const uint32_t hi = x != nullptr && v + 1 < k ? bf16_round_bits(x[v + 1]) : 0u;
    row[p * 16] = lo | (hi << 16);
  }
}

// out rows = the m rows of x through the AMX bfloat16 GEMM (NOTE [AMX bfloat16 GEMM]): the rows rounded to bfloat16
// once into its pair layout (m rounded up to 16 rows, the rows past m +0), threads splitting the columns in whole
// 32-column strips, then the bias.
void linear_bf16_amx(int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                     const float* bias, float* c, int64_t rsc) {
  const int64_t kp = (k + 31) / 32 * 32, mp = (m + 15) / 16 * 16;
  Buffer xbuf(static_cast<size_t>(mp * kp / 2) * sizeof(uint32_t));
  auto* xp = xbuf.get<uint32_t>();
  for (int64_t i = m; i < mp; ++i) bf16amx_pairs(nullptr, k, kp, i, xp);
  const auto gemm = vec().bf16amx_cols;
  gemm_passes(
      m, n, k, size_t{1024} * sizeof(uint32_t), bias, c, rsc,
      [&](int64_t i) { bf16amx_pairs(x + i * rsx, k, kp, i, xp); },
      [&](int64_t j0, int64_t j1, const Buffer& panel) {
        gemm(m, n, j0, j1, k, xp, w.data, w.row_stride, c, rsc, panel.get<uint32_t>());
      });
}

// out rows = the m rows of x through the integer GEMM (NOTE [integer GEMM]): the rows quantized to Q8_0 blocks once
// (with their int32 block sums), threads splitting the columns in whole 32-column panels, then the bias.
void linear_int8_gemm(QuantScheme s, int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                      const float* bias, float* c, int64_t rsc) {
  if (const auto kgemm = vec().int8kgemm_cols[static_cast<int>(s)]; kgemm != nullptr) {
    const int64_t nb = k / 256, ns = k / 16;
    Buffer xqb(static_cast<size_t>(m * k));
    Buffer xdb(static_cast<size_t>(m * nb) * sizeof(float));
    Buffer xsb(static_cast<size_t>(m * ns) * sizeof(int16_t));
    auto* q = xqb.get<int8_t>();
    auto* d = xdb.get<float>();
    auto* bs = xsb.get<int16_t>();
    gemm_passes(
        m, n, k, static_cast<size_t>(2 * kInt8GemmPanelBytes), bias, c, rsc,
        [&](int64_t i) { quantize_row_q8k(x + i * rsx, k, q + i * k, d + i * nb, bs + i * ns); },
        [&](int64_t j0, int64_t j1, const Buffer& panel) {
          kgemm(m, j0, j1, k, q, d, bs, w.data, w.row_stride, c, rsc, panel.get<uint8_t>());
        });
    return;
  }
  const int64_t nb = k / 32;
  Buffer xqb(static_cast<size_t>(m * k));
  Buffer xdb(static_cast<size_t>(2 * m * nb) * sizeof(float));
  Buffer xsb(static_cast<size_t>(m * nb) * sizeof(int32_t));
  auto* q = xqb.get<int8_t>();
  auto* d = xdb.get<float>();
  auto* xs = xsb.get<int32_t>();
  const auto gemm = vec().int8gemm_cols[static_cast<int>(s)];
  gemm_passes(
      m, n, k, static_cast<size_t>(kInt8GemmPanelBytes), bias, c, rsc,
      [&](int64_t i) { quantize_row_q8_sums(x + i * rsx, k, q + i * k, d + i * 2 * nb, xs + i * nb); },
      [&](int64_t j0, int64_t j1, const Buffer& panel) {
        gemm(m, j0, j1, k, q, d, xs, w.data, w.row_stride, c, rsc, panel.get<uint8_t>());
      });
}

// The M > 16 path: the packed GEMM with B's panels dequantized straight from the weight rows
// (nr rows at a time into a small scratch, then transposed into the panel), so x is packed as
// often as for a float32 weight and the dequantized weights never leave the cache.
void linear_packed(QuantScheme s, int64_t m, int64_t n, int64_t k, const float* x, int64_t rsx, const WeightRows& w,
                   const float* bias, float* c, int64_t rsc) {
  const auto dequant = vec().dequant_row[static_cast<int>(s)];
  const auto pack_b = vec().sgemm.pack_b;
  const int64_t nr = sgemm_nr();
  const PackBFn pack = [&](int64_t k0, int64_t kc, int64_t n0, int64_t nc, float* bp) {
    Buffer scratch(static_cast<size_t>(nr * kc) * sizeof(float));
    float* rows = scratch.get<float>();
    // block schemes: k0 is a multiple of the block (k_align below); 16-bit schemes: 2 bytes a value
    const int64_t offset = k0 / quant_block_values(s) * block_bytes(s);
    for (int64_t p = 0; p < nc; p += nr) {
      const int64_t cols = std::min(nr, nc - p);
      for (int64_t r = 0; r < cols; ++r) dequant(rows + r * kc, w.data + (n0 + p + r) * w.row_stride + offset, kc);
      pack_b(kc, cols, rows, 1, kc, bp + p * kc);  // B[kk, j] = rows[j * kc + kk]
    }
  };
  sgemm_packed_b(m, n, k, x, rsx, 1, quant_block_values(s), pack, c, rsc);
  if (bias != nullptr) {
    parallel_for(0, m, std::max<int64_t>(1, 65536 / n),
                 [&](int64_t r0, int64_t r1) { add_bias(c + r0 * rsc, rsc, r1 - r0, n, bias); });
  }
}

// The rows of a repacked copy of weight (pack_quantized's out): contiguous uint8 of weight's shape.
const uint8_t* packed_rows(const char* op, const View& packed, const View& weight) {
  KAEL_CHECK(packed.dtype == DType::UInt8 && packed.ndim == 2 && packed.shape[0] == weight.shape[0] &&
                 packed.shape[1] == weight.shape[1] && packed.is_contiguous(),
             Shape, op, ": packed must be a contiguous uint8 copy of weight's [", weight.shape[0], ", ",
             weight.shape[1], "], got ", dtype_name(packed.dtype), " with ", packed.ndim, " dims");
  return packed.ptr<uint8_t>();
}

}  // namespace

const char* quant_scheme_name(QuantScheme s) {
#define KAEL_QF_NAME_CASE(e, name, qk, bytes) \
  case QuantScheme::e:                        \
    return name;
  switch (s) { KAEL_QUANT_FORMATS(KAEL_QF_NAME_CASE) }
#undef KAEL_QF_NAME_CASE
  return "?";
}

double bf16_issue_ratio() {
  // per table (KAEL_CPU_ISA may select another in a later process only, but vec() is the one source)
  static const double ratio = vec().bf16_issue_ratio != nullptr ? vec().bf16_issue_ratio() : 0.0;
  return ratio;
}

bool bf16_gemm_pays() {
  // AMX: 16 x 16 x 32 products an instruction, 16 times vdpbf16ps's work or more on the CPUs that have it
  return vec().bf16amx_cols != nullptr || (vec().bf16gemm_cols != nullptr && bf16_issue_ratio() >= kBf16GemmMinRatio);
}

const char* bf16_gemm_kernel() {
  if (vec().bf16amx_cols != nullptr) return "amx";
  return vec().bf16gemm_cols != nullptr ? "vdpbf16ps" : "none";
}

bool packable(QuantScheme scheme) {
  const int f = static_cast<int>(scheme);
  return vec().q8dot_packed[f] != nullptr || vec().q8kdot_packed[f] != nullptr;
}

namespace {

// Q6_K's six-bit integer u = q + 32 of value i (0..255) of the super-block at blk (GGML's ql / qh layout).
int q6k_u(const uint8_t* blk, int64_t i) {
  const int64_t h = i / 128, quarter = (i % 128) / 32, l = i % 32;
  const uint8_t lo = blk[h * 64 + l + (quarter & 1) * 32];
  const int nib = quarter >= 2 ? lo >> 4 : lo & 15;
  return nib | (((blk[128 + h * 32 + l] >> (2 * quarter)) & 3) << 4);
}

// Super-block b of the 16 rows at w (rsw bytes apart) into a slab's super-block db (NOTE [repacked rows]).
void pack_q6k_block(const uint8_t* w, int64_t rsw, int64_t b, uint8_t* db) {
  for (int64_t r = 0; r < kPackSlab; ++r) {
    const uint8_t* blk = w + r * rsw + b * 210;
    std::memcpy(db + 2 * r, blk + 208, 2);
    for (int64_t g = 0; g < 16; ++g) {
      db[32 + g * 16 + r] = blk[192 + g];
      uint8_t* q = db + 32 + 256 + g * 192 + r * 4;
      for (int e = 0; e < 4; ++e) {
        const int u0 = q6k_u(blk, 16 * g + e), u1 = q6k_u(blk, 16 * g + 4 + e);
        const int u2 = q6k_u(blk, 16 * g + 8 + e), u3 = q6k_u(blk, 16 * g + 12 + e);
        q[e] = static_cast<uint8_t>((u0 & 15) | ((u1 & 15) << 4));
        q[64 + e] = static_cast<uint8_t>((u2 & 15) | ((u3 & 15) << 4));
        q[128 + e] = static_cast<uint8_t>((u0 >> 4) | ((u1 >> 4) << 2) | ((u2 >> 4) << 4) | ((u3 >> 4) << 6));
      }
    }
  }
}

// Q4_K's super-block b of the 16 rows at w into a slab's super-block db (pk_q4k_slab_row's layout).
void pack_q4k_block(const uint8_t* w, int64_t rsw, int64_t b, uint8_t* db) {
  for (int64_t r = 0; r < kPackSlab; ++r) {
    const uint8_t* blk = w + r * rsw + b * 144;
    std::memcpy(db + 2 * r, blk, 2);
    std::memcpy(db + 32 + 2 * r, blk + 2, 2);
    for (int t = 0; t < 12; ++t) db[64 + 16 * t + r] = blk[4 + t];
    // value v (0..255): qs[32 (v / 64) + v % 32], the high nibble when (v / 32) is odd
    const auto u = [&](int v) { return (blk[16 + 32 * (v / 64) + v % 32] >> (4 * ((v / 32) % 2))) & 15; };
    for (int i = 0; i < 32; ++i) {
      for (int e = 0; e < 4; ++e)
        db[256 + i * 64 + r * 4 + e] = static_cast<uint8_t>(u(4 * i + e) | (u(128 + 4 * i + e) << 4));
    }
  }
}

// Q5_0's block b of the 16 rows at w (rsw bytes apart) into a slab's block db (NOTE [repacked rows]): the scales,
// the fifth bits rearranged (bit 2c of byte i: value 4c + i's; bit 2c + 1: value 16 + 4c + i's), the nibbles as
// Q4_0's.
void pack_q5_0_block(const uint8_t* w, int64_t rsw, int64_t b, uint8_t* db) {
  for (int64_t r = 0; r < kPackSlab; ++r) {
    const uint8_t* blk = w + r * rsw + b * 22;
    std::memcpy(db + 2 * r, blk, 2);
    uint32_t qh;
    std::memcpy(&qh, blk + 2, 4);  // bit j: value j's fifth bit (little-endian, as GGML writes it)
    for (int i = 0; i < 4; ++i) {
      uint32_t byte = 0;
      for (int c = 0; c < 4; ++c) {
        byte |= ((qh >> (4 * c + i)) & 1U) << (2 * c);
        byte |= ((qh >> (16 + 4 * c + i)) & 1U) << (2 * c + 1);
      }
      db[32 + r * 4 + i] = static_cast<uint8_t>(byte);
    }
    for (int64_t c = 0; c < 4; ++c) std::memcpy(db + 96 + c * 64 + r * 4, blk + 6 + 4 * c, 4);
  }
}

}  // namespace

void pack_quantized(const View& out, const View& weight, QuantScheme scheme) {
  const char* op = "pack_quantized";
  KAEL_CHECK(packable(scheme), Kael, op, ": the ", vec().name, " table has no kernel for repacked ",
             quant_scheme_name(scheme), " rows (q8_0, q4_0, q5_0, iq4_nl, q4_k and q6_k with AVX512_VNNI)");
  KAEL_CHECK(weight.ndim == 2 && weight.dtype == DType::UInt8 && weight.is_contiguous(), Shape, op,
             ": weight must be contiguous uint8 [N, row bytes], got ", dtype_name(weight.dtype), " with ", weight.ndim,
             " dims");
  const int64_t bytes = block_bytes(scheme), rsw = weight.shape[1], n = weight.shape[0];
  KAEL_CHECK(rsw % bytes == 0, Shape, op, ": a ", quant_scheme_name(scheme), " row is whole blocks of ", bytes,
             " bytes, got ", rsw);
  const uint8_t* w = weight.ptr<uint8_t>();
  auto* o = const_cast<uint8_t*>(packed_rows(op, out, weight));
  const int64_t nb = rsw / bytes, slabs = n / kPackSlab, chunks = (bytes - 2) / 4;
  const uint8_t flip = scheme == QuantScheme::Q8_0 ? 0x80 : 0;  // q8_0's q as q + 128 (NOTE [repacked rows])
  // the formats whose slab blocks are not plain 4-byte chunks of GGML's integers have a block packer of their own
  void (*pack_block)(const uint8_t*, int64_t, int64_t, uint8_t*) = scheme == QuantScheme::Q6_K   ? pack_q6k_block
                                                                   : scheme == QuantScheme::Q4_K ? pack_q4k_block
                                                                   : scheme == QuantScheme::Q5_0 ? pack_q5_0_block
                                                                                                 : nullptr;
  parallel_for(0, slabs, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t sl = s0; sl < s1; ++sl) {
      uint8_t* dst = o + sl * kPackSlab * rsw;
      if (pack_block != nullptr) {
        for (int64_t b = 0; b < nb; ++b) pack_block(w + sl * kPackSlab * rsw, rsw, b, dst + b * kPackSlab * bytes);
        continue;
      }
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* db = dst + b * kPackSlab * bytes;
        for (int64_t r = 0; r < kPackSlab; ++r) {
          const uint8_t* blk = w + (sl * kPackSlab + r) * rsw + b * bytes;
          std::memcpy(db + 2 * r, blk, 2);
          for (int64_t c = 0; c < chunks; ++c) {
            for (int e = 0; e < 4; ++e) db[32 + c * 64 + r * 4 + e] = blk[2 + 4 * c + e] ^ flip;
          }
        }
      }
    }
  });
  const int64_t j0 = slabs * kPackSlab;  // the rows after the last whole slab keep GGML's layout
  if (j0 < n) std::memcpy(o + j0 * rsw, w + j0 * rsw, static_cast<size_t>((n - j0) * rsw));
}

void dequantize(const View& out, const View& weight, QuantScheme scheme) {
  KAEL_CHECK(out.ndim == 2, Shape, "dequantize: out must be float32 [N, K], got ", out.ndim, " dims");
  KAEL_CHECK(out.dtype == DType::Float32, DType, "dequantize: out must be float32, got ", dtype_name(out.dtype));
  const int64_t n = out.shape[0], k = out.shape[1];
  WeightRows w = weight_rows("dequantize", weight, scheme, n, k);
  if (out.numel() == 0) return;
  const auto dequant = vec().dequant_row[static_cast<int>(scheme)];
  const bool contiguous_rows = k == 1 || out.strides[1] == 1;
  auto* o = out.ptr<float>();
  parallel_for(0, n, std::max<int64_t>(1, 32768 / k), [&](int64_t r0, int64_t r1) {
    Buffer row;
    if (!contiguous_rows) row = Buffer(static_cast<size_t>(k) * sizeof(float));
    for (int64_t r = r0; r < r1; ++r) {
      float* dst = o + r * out.strides[0];
      if (contiguous_rows) {
        dequant(dst, w.data + r * w.row_stride, k);
      } else {
        auto* tmp = row.get<float>();
        dequant(tmp, w.data + r * w.row_stride, k);
        for (int64_t j = 0; j < k; ++j) dst[j * out.strides[1]] = tmp[j];
      }
    }
  });
}

void quantized_linear(const View& out, const View& x, const View& weight, const View* bias, QuantScheme scheme,
                      const View* packed) {
  const char* op = "quantized_linear";
  KAEL_CHECK(x.ndim >= 1, Shape, op, ": x must have at least 1 dim ([.., K])");
  KAEL_CHECK(x.dtype == DType::Float32 && out.dtype == DType::Float32, DType, op, ": x and out must be float32, got x ",
             dtype_name(x.dtype), ", out ", dtype_name(out.dtype));
  KAEL_CHECK(out.ndim == x.ndim, Shape, op, ": out [.., N] must have x's ", x.ndim, " dims, got ", out.ndim);
  for (int d = 0; d + 1 < x.ndim; ++d) {
    KAEL_CHECK(out.shape[d] == x.shape[d], Shape, op, ": out's leading dims must be x's: dim ", d, " is ", out.shape[d],
               ", x has ", x.shape[d]);
  }
  const int64_t k = x.shape[x.ndim - 1], n = out.shape[out.ndim - 1];
  WeightRows w = weight_rows(op, weight, scheme, n, k);
  if (bias != nullptr) {
    KAEL_CHECK(bias->dtype == DType::Float32, DType, op, ": bias must be float32, got ", dtype_name(bias->dtype));
    KAEL_CHECK(bias->ndim == 1 && bias->shape[0] == n, Shape, op, ": bias must be [", n, "] (N), got ", bias->ndim,
               " dims", bias->ndim == 1 ? detail::cat(" [", bias->shape[0], "]") : std::string());
  }
  if (out.numel() == 0) return;
  const int64_t m = out.numel() / n;

  int64_t rsx = 0, rso = 0;
  Temp xt, ot, bt;
  const View* xv = &x;
  const View* ov = &out;
  if (!rows_stride(x, &rsx) || (k > 1 && x.strides[x.ndim - 1] != 1)) {
    xt = to_contiguous(x, DType::Float32);
    xv = &xt.view;
    rsx = k;
  }
  if (!rows_stride(out, &rso) || (n > 1 && out.strides[out.ndim - 1] != 1)) {
    ot = make_temp(DType::Float32, out.shape, out.ndim);
    ov = &ot.view;
    rso = n;
  }
  const float* bp = nullptr;
  if (bias != nullptr) {
    bp = bias->ptr<float>();
    if (n > 1 && bias->strides[0] != 1) {
      bt = to_contiguous(*bias, DType::Float32);
      bp = bt.view.ptr<float>();
    }
  }
  const float* xp = xv->ptr<float>();
  float* c = ov->ptr<float>();
  if (k == 0) {  // an empty sum: out = bias (or 0)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * rso + j] = bp != nullptr ? bp[j] : 0.0f;
    }
  } else if (const ActMode mode = activation_mode(); use_bf16_gemm(scheme, m, mode)) {
    if (vec().bf16amx_cols != nullptr) {
      linear_bf16_amx(m, n, k, xp, rsx, w, bp, c, rso);
    } else {
      linear_bf16_gemm(m, n, k, xp, rsx, w, bp, c, rso);
    }
  } else if (use_int8_gemm(scheme, m, mode)) {
    linear_int8_gemm(scheme, m, n, k, xp, rsx, w, bp, c, rso);
  } else if (use_int8_path(scheme, m, mode)) {
    if (packed != nullptr && m <= kFewRows && packable(scheme) && repack_enabled()) {
      linear_int8_packed(scheme, m, n, k, xp, rsx, packed_rows(op, *packed, weight), packed->shape[1], bp, c, rso);
    } else if (scheme == QuantScheme::BF16) {
      linear_bf16(m, n, k, xp, rsx, w, bp, c, rso);
    } else if (scheme == QuantScheme::F16) {
      linear_f16(m, n, k, xp, rsx, w, bp, c, rso);
    } else {
      linear_int8(scheme, m, n, k, xp, rsx, w, bp, c, rso);
    }
  } else if (m <= kFewRows) {
    const auto dots = vec().qdot_rows[static_cast<int>(scheme)];
    parallel_for(0, n, std::max<int64_t>(1, 32768 / (m * k)), [&](int64_t j0, int64_t j1) {
      Buffer row;  // a weight row expanded to float32, read by every group of four rows of x
      if (m > 1) row = Buffer(static_cast<size_t>(qdot_scratch_floats(k)) * sizeof(float));
      dots(m, j1 - j0, k, xp, rsx, w.data + j0 * w.row_stride, w.row_stride, bp == nullptr ? nullptr : bp + j0, c + j0,
           rso, row.get<float>());
    });
  } else {
    linear_packed(scheme, m, n, k, xp, rsx, w, bp, c, rso);
  }
  if (ov != &out) copy(out, *ov);
}

}  // namespace kael
