// The weight formats of the dequantize / quantized_linear ops, declared once (GGML's
// type_traits habit): X(enum name, scheme string, values per block, bytes per block). The list
// yields the QuantScheme enum (kernels.h), the names and sizes (quant.cpp), the bindings'
// parser and its error message (bindings.cpp) and the kernel tables (vec_table.h: the enum's
// value is the kernel's template argument F in vec_quant.h). Block formats are GGML's blocks
// in GGUF order, stored as uint8 [N, K / values * bytes]; the 16-bit ones (values 1) are
// bfloat16 / float16 [N, K] tensors; the K-quants and IQ4_XS are 256-value super-blocks
// (vec_quant_k.h). Adding a format: a row here, its block in vec_quant.h (load_block) or
// vec_quant_k.h (kq_chunk), its tests.
#pragma once

#include <cstdint>

// clang-format off
#define KAEL_QUANT_FORMATS(X)         \
  X(Q8_0, "q8_0", 32, 34)         \
  X(Q4_0, "q4_0", 32, 18)         \
  X(BF16, "bf16", 1, 2)           \
  X(F16, "f16", 1, 2)             \
  X(Q4_1, "q4_1", 32, 20)         \
  X(Q5_0, "q5_0", 32, 22)         \
  X(Q5_1, "q5_1", 32, 24)         \
  X(IQ4_NL, "iq4_nl", 32, 18)     \
  X(Q2_K, "q2_k", 256, 84)        \
  X(Q3_K, "q3_k", 256, 110)       \
  X(Q4_K, "q4_k", 256, 144)       \
  X(Q5_K, "q5_k", 256, 176)       \
  X(Q6_K, "q6_k", 256, 210)       \
  X(IQ4_XS, "iq4_xs", 256, 136)
// clang-format on

namespace kael {

#define KAEL_QF_ENUM(e, name, qk, bytes) e,
enum class QuantScheme { KAEL_QUANT_FORMATS(KAEL_QF_ENUM) };
#undef KAEL_QF_ENUM

#define KAEL_QF_COUNT(e, name, qk, bytes) +1
constexpr int kQuantSchemes = 0 KAEL_QUANT_FORMATS(KAEL_QF_COUNT);
#undef KAEL_QF_COUNT

// The names, "q8_0", "q4_0", "bf16", ..., in the list's order, joined by ", " (for messages).
#define KAEL_QF_NAME(e, name, qk, bytes) "'" name "', "
constexpr const char kQuantSchemeNames[] = KAEL_QUANT_FORMATS(KAEL_QF_NAME);
#undef KAEL_QF_NAME

// Values per block (1 for the 16-bit formats) and bytes per block, as tables indexed by the
// enum's value (a switch over the list would have identical branches: bugprone-branch-clone).
#define KAEL_QF_VALUES(e, name, qk, bytes) qk,
constexpr int64_t kQuantBlockValues[kQuantSchemes] = {KAEL_QUANT_FORMATS(KAEL_QF_VALUES)};
#undef KAEL_QF_VALUES
#define KAEL_QF_BYTES(e, name, qk, bytes) bytes,
constexpr int64_t kQuantBlockBytes[kQuantSchemes] = {KAEL_QUANT_FORMATS(KAEL_QF_BYTES)};
#undef KAEL_QF_BYTES
constexpr int64_t quant_block_values(QuantScheme s) {
  return kQuantBlockValues[static_cast<int>(s)];
}
constexpr int64_t quant_block_bytes(QuantScheme s) {
  return kQuantBlockBytes[static_cast<int>(s)];
}
// A format of GGML blocks (uint8 storage), not bfloat16 / float16.
constexpr bool quant_is_block(QuantScheme s) {
  return quant_block_values(s) > 1;
}

}  // namespace kael
