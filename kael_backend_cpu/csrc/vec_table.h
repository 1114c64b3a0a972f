// The table of vectorised inner kernels for one instruction set (NOTE [runtime dispatch] in
// vec.h): every kernel family, written once with GCC/Clang vector extensions, and make_table,
// which fills a VecTable with them. The including file (vec_base.cpp, vec_avx2.cpp) defines
// KAEL_VBYTES (vector width in bytes), KAEL_MR_F/KAEL_NV_F/KAEL_MC_F and KAEL_MR_D/KAEL_NV_D/
// KAEL_MC_D (GEMM micro-tile rows, vectors per row and row block; optionally KAEL_KC_F/KAEL_NC_F
// and KAEL_KC_D/KAEL_NC_D, the depth and column blocks, 256 and 4080 by default) and opens a namespace of its
// own, after including <algorithm>, <cmath>, <cstdint>, <cstring>, <limits>, <type_traits>,
// <vector>, <immintrin.h> (x86) and vec.h. This file and the vec_*.h headers below have no
// other includes: they are pasted inside that namespace, once per instruction set.

#include "vec_arith.h"        // add/sub/mul/div loops
#include "vec_bf16_amx.h"     // the bfloat16 GEMM on AMX tiles (AMX-BF16)
#include "vec_bf16_dot.h"     // the bfloat16 path: bfloat16 activations . bf16 weight rows (AVX512_BF16)
#include "vec_core.h"         // vector types, loads/stores, splat, horizontal sums
#include "vec_f16_dot.h"      // the float16 path: float16 activations . f16 weight rows
#include "vec_gemm_packed.h"  // GEMM micro-kernel and panel packing
#include "vec_gemm_rows.h"    // few-row GEMM kernels (rows_nmajor, rows_kmajor)
#include "vec_llama.h"        // rms_norm (sum of squares, scaling), silu_mul and rope rows
#include "vec_math.h"         // exp, tanh, sigmoid, silu, gelu: vector functions and their elementwise loops
#include "vec_quant.h"        // weight formats (and vec_quant_ints.h, vec_quant_k.h): rows and few-row dot products
#include "vec_quant_dot.h"    // the integer path: Q8_0 activations . 32-value block weight rows
#include "vec_quant_dot_k.h"  // the integer path: Q8_K activations . K-quant / IQ4_XS weight rows
#include "vec_quant_dot_k_simd.h"  // its AVX2 / VNNI kernels and q8kdot_kernel, the table's pick
#include "vec_quant_gemm.h"        // the integer GEMM for prompts (AVX-512 VNNI)
#include "vec_quant_packed.h"      // the integer path on repacked rows (AVX-512 VNNI)
#include "vec_rows.h"              // sum, max, softmax, log_softmax, layer_norm rows; axpy
#include "vec_tiles.h"             // the quantized_linear kernels' row tiles and panel edges

#ifndef KAEL_KC_F
#define KAEL_KC_F 256
#endif
#ifndef KAEL_NC_F
#define KAEL_NC_F 4080
#endif
#ifndef KAEL_KC_D
#define KAEL_KC_D 256
#endif
#ifndef KAEL_NC_D
#define KAEL_NC_D 4080
#endif
static_assert(KAEL_MC_F % KAEL_MR_F == 0 && KAEL_NC_F % (KAEL_NV_F * V<float>::L) == 0, "float GEMM blocks");
static_assert(KAEL_MC_D % KAEL_MR_D == 0 && KAEL_NC_D % (KAEL_NV_D * V<double>::L) == 0, "double GEMM blocks");

template <class T, int MR, int NV>
GemmKernels<T> gemm_kernels(int64_t mc, int64_t kc, int64_t nc) {
  GemmKernels<T> g;
  g.mr = MR;
  g.nr = NV * V<T>::L;
  g.mc = mc;
  g.kc = kc;
  g.nc = nc;
  g.kernel = ukernel<T, MR, NV>;
  g.pack_a = pack_a<T, MR>;
  g.pack_b = pack_b<T, NV * V<T>::L>;
  g.rows_nmajor = rows_nmajor<T>;
  g.rows_kmajor = rows_kmajor<T>;
  return g;
}

// The integer path's entries of format F (a row of KAEL_QUANT_FORMATS, QK values a block), so that every integer
// format of the list has them: the 32-value block formats take Q8_0 activations (q8dot_rows) and, those without an
// offset m (kQdMin: not q4_1 / q5_1), the integer GEMM (int8gemm_cols); the 256-value super-blocks take Q8_K
// activations (q8kdot_rows, int8kgemm_cols); the 16-bit formats have none (their own bf16 / f16 entries).
template <int F, int64_t QK>
void set_integer_kernels(VecTable& t) {
  static_assert(QK == 1 || QK == 32 || QK == 256, "a format of another block size: which integer kernels?");
  if constexpr (QK == 32) {
    t.q8dot_rows[F] = q8dot_kernel<F>();
    if constexpr (!kQdMin<F>) t.int8gemm_cols[F] = int8gemm_kernel<F>();
    t.q8dot_packed[F] = q8dot_packed_kernel<F>();
  } else if constexpr (QK == 256) {
    t.q8kdot_rows[F] = q8kdot_kernel<F>();
    t.int8kgemm_cols[F] = int8kgemm_kernel<F>();
    t.q8kdot_packed[F] = q8kdot_packed_kernel<F>();
  }
}

VecTable make_table(const char* name) {
  VecTable t;
  t.name = name;
  t.sgemm = gemm_kernels<float, KAEL_MR_F, KAEL_NV_F>(KAEL_MC_F, KAEL_KC_F, KAEL_NC_F);
  t.dgemm = gemm_kernels<double, KAEL_MR_D, KAEL_NV_D>(KAEL_MC_D, KAEL_KC_D, KAEL_NC_D);
  t.exp_f32 = exp_f32;
  t.tanh_f32 = tanh_f32;
  t.sigmoid_f32 = sigmoid_f32;
  t.silu_f32 = silu_f32;
  t.gelu_tanh_f32 = gelu_tanh_f32;
  t.gelu_tanh_bwd_f32 = gelu_tanh_bwd_f32;
  t.sum_f32 = sum_f32;
  t.max_f32 = max_f32;
  t.sum_exp_f32 = sum_exp_f32;
  t.softmax_f32 = softmax_f32;
  t.log_softmax_f32 = log_softmax_f32;
  t.layer_norm_f32 = layer_norm_f32;
  t.axpy_f32 = axpy_f32;
  t.arith_f32 = arith_f32;
  t.sumsq_f32 = sumsq_f32;
  t.scale_mul_f32 = scale_mul_f32;
  t.silu_mul_f32 = silu_mul_f32;
  t.rope_f32 = rope_f32;
#define KAEL_QF_KERNELS(e, name, qk, bytes)                                                                        \
  t.dequant_row[static_cast<int>(::kael::QuantScheme::e)] = dequant_row<static_cast<int>(::kael::QuantScheme::e)>; \
  t.qdot_rows[static_cast<int>(::kael::QuantScheme::e)] = qdot_rows<static_cast<int>(::kael::QuantScheme::e)>;     \
  set_integer_kernels<static_cast<int>(::kael::QuantScheme::e), qk>(t);
  KAEL_QUANT_FORMATS(KAEL_QF_KERNELS)
#undef KAEL_QF_KERNELS
  t.bf16dot_rows = bf16dot_kernel();
  t.f16dot_rows = f16dot_rows;
  t.bf16gemm_cols = bf16gemm_kernel();
  t.bf16amx_cols = bf16amx_kernel();
  t.bf16_issue_ratio = bf16_issue_kernel();
  return t;
}
