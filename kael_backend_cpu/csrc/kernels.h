// Every kernel the backend exports, output-first like the op catalogue
// (kael/_ops.py). Operands arrive promoted and broadcast (stride 0) by the
// frontend; kernels honour any non-negative strides, write only their outputs and
// throw kael::Error (never abort) on bad input. No pybind11 here: bindings.cpp
// turns Python tensors into Views and calls these with the GIL released.
#pragma once

#include <cstdint>
#include <vector>

#include "quant_formats.h"
#include "view.h"

namespace kael {

// A Python bool/int/float attribute.
struct Scalar {
  enum Kind { Bool, Int, Float } kind = Int;
  int64_t i = 0;
  double f = 0.0;
  [[nodiscard]] double as_double() const { return kind == Float ? f : static_cast<double>(i); }
};

// -- copy.cpp: copy/cast, fill, arange, where ----------------------------------------
void copy(const View& out, const View& a);  // strided copy, cast to out.dtype
void fill(const View& out, Scalar value);
void arange(const View& out, Scalar start, Scalar step);  // out[i] = start + i * step
void where(const View& out, const View& cond, const View& a, const View& b);

// -- unary.cpp / binary.cpp: elementwise -------------------------------------------------
enum class UnaryOp {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Abs,
  Sin,
  Cos,
  Sigmoid,
  Silu,  // x * sigmoid(x), computed as x / (1 + exp(-x)); a fused op of the catalogue
  Erf,
  Log1p,
  Expm1,
  Floor,
  Ceil,
  Round,
  Sign,
  LogicalNot,
};
enum class BinaryOp {
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Maximum,
  Minimum,
  Remainder,
  FloorDivide,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
};
void unary(UnaryOp op, const View& out, const View& a);                   // logical_not: out bool
void binary(BinaryOp op, const View& out, const View& a, const View& b);  // comparisons: out bool

// -- reduce.cpp -------------------------------------------------------------------------
enum class ReduceOp { Sum, Prod, Amax, Amin, Argmax, Argmin, Any, All };
// out has a's shape with the reduced dims set to 1; argmax/argmin take one dim.
void reduce(ReduceOp op, const View& out, const View& a, const std::vector<int>& dims);

// -- matmul.cpp -------------------------------------------------------------------------
void matmul(const View& out, const View& a, const View& b);  // [*B, M, N] = [*B, M, K] @ [*B, K, N]
// out [.., O] = x [.., I] @ weight[O, I]^T (+ bias[O])
void linear(const View& out, const View& x, const View& weight, const View* bias);

// -- indexing.cpp ------------------------------------------------------------------------
void gather(const View& out, const View& a, const View& index, int dim);
void index_select(const View& out, const View& a, const View& index, int dim);
void index_add(const View& out, const View& index, const View& src, int dim);    // in place
void scatter_add(const View& out, const View& index, const View& src, int dim);  // in place
void cat(const View& out, const std::vector<View>& parts, int dim);
void nonzero(const View& out, const View& mask);  // out int64 [n, mask.ndim]
void sort(const View& values, const View& indices, const View& a, int dim, bool descending);  // stable
void topk(const View& values, const View& indices, const View& x, int64_t k);                 // last dim, largest first
void embedding(const View& out, const View& weight, const View& ids);                         // out [*ids, D]

// -- nn.cpp: fused ops -------------------------------------------------------------------
void gelu(const View& out, const View& x, bool tanh_approx);
void gelu_backward(const View& grad_in, const View& grad_out, const View& x, bool tanh_approx);
void softmax(const View& out, const View& x, int dim);
void log_softmax(const View& out, const View& x, int dim);
// Normalise over the last dim; mean/rstd have x's shape without it.
void layer_norm(const View& out, const View& mean, const View& rstd, const View& x, const View* weight,
                const View* bias, double eps);
void layer_norm_backward(const View& dx, const View* dweight, const View* dbias, const View& grad, const View& x,
                         const View& mean, const View& rstd, const View* weight);
// losses [N] = -log_softmax(logits [N, C])[target] (0 where target == ignore_index)
void cross_entropy(const View& losses, const View& logits, const View& target, int64_t ignore_index,
                   double label_smoothing);
void adamw_step(const View& param, const View& grad, const View& exp_avg, const View& exp_avg_sq, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t step);

// -- rms_norm.cpp, rope.cpp, silu_mul.cpp: the Llama-family fused ops ---------------------
// rstd [x.shape[:-1]] float32/64 = 1 / sqrt(mean(x^2) + eps) over the last dim;
// out = (x * rstd rounded to x.dtype) * weight[D] (weight may be null).
void rms_norm(const View& out, const View& rstd, const View& x, const View* weight, double eps);
// Rotate-half rotary embedding: x/out [B,H,T,D], cos/sin [P, D/2], positions int64 [B,T].
void rope(const View& out, const View& x, const View& cos, const View& sin, const View& positions);
// out = silu(gate) * up, all the same shape and dtype.
void silu_mul(const View& out, const View& gate, const View& up);

// -- geglu_softcap.cpp: the Gemma-family fused ops (NOTE [16-bit rounding of the Gemma ops]) ---
// out = gelu_tanh(gate) * up, all the same shape and dtype;
// gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
void gelu_tanh_mul(const View& out, const View& gate, const View& up);
// out = cap * tanh(x / cap), same shape and dtype; cap positive and finite (else a kael::Error).
void softcap(const View& out, const View& x, double cap);

// -- moe.cpp: the mixture-of-experts fused ops (NOTE [moe_route bits], NOTE [expert_linear grouping]) --
// Top-k routing of logits [T, E] (any float dtype): p = softmax over E in float32 (float64 for
// float64 logits); experts int64 [T, k] the k largest p, largest first, ties in index order;
// weights [T, k] (float32, float64 for float64 logits) p at those experts, divided by their sum
// when normalize. 1 <= k <= E (else a kael::Error).
void moe_route(const View& weights, const View& experts, const View& logits, int64_t k, bool normalize);
// out [T, K, N] = weight[experts[t, j]] [N, C] @ x[t, j] [C] for every (t, j); x [T, K, C] (any
// strides, stride 0 over K included), weight [E, N, C] (any strides), out of their dtype; experts
// int64 [T, K] in [0, E) (checked before anything is written: an IndexError otherwise).
void expert_linear(const View& out, const View& x, const View& weight, const View& experts);

// -- attention.cpp -----------------------------------------------------------------------
// q [B,H,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv] -> out [B,H,Tq,Dv], H % Hkv == 0 and query head
// h reading kv head h / (H / Hkv) (grouped-query attention); causal aligns the last query
// with key Tk-1 (a KV cache); lengths int64 [B] limits the keys each batch row sees; window > 0
// (causal only) a sliding window: the query at position p sees keys p-window+1 .. p (NOTE [attention window]).
void attention(const View& out, const View& q, const View& k, const View& v, double scale, bool causal,
               const View* lengths, int64_t window = 0);

// -- paged_attention.cpp (NOTE [paged attention tasks]) -----------------------------------
// Causal attention of q [B,H,T,D] over a paged KV cache [NB,2,Hkv,S,D] (block n's keys at [n,0],
// values at [n,1]): position p of row b is slot p % S of block block_table[b, p / S] (integer
// [B,M]), query t of row b sees positions 0 .. lengths[b]-T+t (lengths integer [B], T <=
// lengths[b] <= M*S, every block id in use in [0, NB): checked, a kael::Error otherwise).
// out [B,H,T,D]; H % Hkv == 0 as attention; window > 0 a sliding window as attention's.
void paged_attention(const View& out, const View& q, const View& cache, const View& block_table, const View& lengths,
                     double scale, int64_t window = 0);

// -- quant.cpp: weight formats (NOTE [quantized linear paths]) ---------------------------
// The formats of quant_formats.h (GGML blocks as uint8 [N, K/QK*B]; bfloat16 / float16 [N, K]);
// QuantScheme's order indexes VecTable::dequant_row and qdot_rows.
const char* quant_scheme_name(QuantScheme s);  // "q8_0", "q4_0", "bf16", ...
// out float32 [N, K] = the values of weight
void dequantize(const View& out, const View& weight, QuantScheme scheme);
// out [.., N] = x [.., K] @ dequantize(weight).T (+ bias [N]); float32, accumulated in float32. packed: a copy of
// weight that pack_quantized repacked (NOTE [repacked rows]), which calls of up to 16 rows on the integer path read
// instead (the same bits); null: none
void quantized_linear(const View& out, const View& x, const View& weight, const View* bias, QuantScheme scheme,
                      const View* packed = nullptr);
// Whether this CPU's table has a kernel for repacked rows of scheme (q8_0, q4_0, q5_0, iq4_nl, q4_k, q6_k with
// AVX512_VNNI).
bool packable(QuantScheme scheme);
// NOTE [bfloat16 GEMM pays] (vec_bf16_dot.h): vdpbf16ps's issue rate over vfmadd231ps's (0 where the table has no
// bfloat16 GEMM), and whether auto mode takes a bfloat16 GEMM for prompts (KAEL_BF16_GEMM unset): AMX where present,
// else vdpbf16ps by that ratio
double bf16_issue_ratio();
bool bf16_gemm_pays();
// The bfloat16 GEMM auto mode takes for bf16 prompts where it pays: "amx" (NOTE [AMX bfloat16 GEMM]), "vdpbf16ps"
// (NOTE [bfloat16 GEMM]) or "none"
const char* bf16_gemm_kernel();
// out = weight's rows repacked 16 at a time (NOTE [repacked rows]); weight and out contiguous uint8 [N, row bytes]
// of scheme, which must be packable.
void pack_quantized(const View& out, const View& weight, QuantScheme scheme);

}  // namespace kael
