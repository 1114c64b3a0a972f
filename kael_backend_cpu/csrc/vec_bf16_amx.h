// The bfloat16 GEMM on AMX tiles (AMX-BF16's tdpbf16ps) for prompts of bf16 weights: the same rounded activations
// and packed weight panels as vdpbf16ps's GEMM (vec_bf16_dot.h), 16 x 16 float32 outputs per tile instruction.
//
// NOTE [AMX bfloat16 GEMM]: C = A . W^T for prompts (more than 16 rows) of bf16 weights in auto mode where the CPU
// has AMX-BF16 and the OS grants this process the tile state (vec_select.cpp: os_amx). A's rows are rounded to
// bfloat16 as for the other bfloat16 kernels (ggml's GGML_FP32_TO_BF16) and padded with +0 to kp (k rounded up to
// 32) values and to a multiple of 16 rows. Each output C[i, j] is one float32 lane of a tile that starts at +0 and
// takes one tdpbf16ps per 32 values of depth, in order (0 .. 31, 32 .. 63, ...), and then the bias. Within one
// instruction Intel defines the sum as the 32 products added in turn, but the hardware does not round as that
// definition reads: on the Sapphire Rapids host measured (a VM; 200 random 16 x 16 x 32 tiles), 86% of the lanes
// equal c + (the exact sum of the 32 products) rounded once, the rest differ by 1 to a few ulps of the result
// both ways, and no order of float32 additions reproduces it. So this path has no bit-exact NumPy model: its tests
// bound its error by that of a float32 sum of the same bfloat16 products (tests/backend_cpu/test_quant_bf16_amx.py)
// and check what does hold exactly: a row's result does not depend on the number of rows, the other rows, the
// column split or the thread count (the tiles of one row see the same inputs in the same order whatever the call),
// and the instruction is deterministic. It differs from vdpbf16ps's GEMM and from the few-row kernels (decode),
// which keep their bit-exact models. The weight panel holds one 32-column strip for the whole depth (kp / 2 value
// pairs x 32 columns, bf16gemm's layout: the first 16 columns of 16 pairs are one B tile, 128 bytes a row), so the
// accumulators stay in tiles from the first value to the last: 32 rows x 32 columns at a time (tiles 0-3), A in
// tiles 4-5, B in 6-7.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

#include "vec_bf16_dot.h"  // bg_pack, kBgNR

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// ldtilecfg's 64-byte operand, palette 1: tiles 0 .. 7 of 16 rows x 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  AmxTileConfig() {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = 16;
    }
  }
};

// 16 or 32 rows of A (bfloat16, kp values apart, from row i0; rows 16 .. 31 when two) times one packed panel (kp / 2
// pairs x 32 columns): the sums over the whole depth into out (32 x 32 float32, row r at out + r * 32).
template <bool kTwo>
__attribute__((target("amx-tile,amx-bf16"))) inline void ba_block(int64_t kp, const uint16_t* a, const uint32_t* panel,
                                                                  float* out) {
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kTwo) {
    _tile_zero(2);
    _tile_zero(3);
  }
  const int64_t rsa = kp * 2;  // bytes between A's rows
  for (int64_t kk = 0; kk < kp; kk += 32) {
    const uint32_t* b = panel + kk / 2 * kBgNR;
    _tile_loadd(6, b, kBgNR * 4);
    _tile_loadd(7, b + 16, kBgNR * 4);
    _tile_loadd(4, a + kk, rsa);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwo) {
      _tile_loadd(5, a + 16 * kp + kk, rsa);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t kLower = int64_t{16} * 32;  // out's row 16
  _tile_stored(0, out, 32 * 4);
  _tile_stored(1, out + 16, 32 * 4);
  if constexpr (kTwo) {
    _tile_stored(2, out + kLower, 32 * 4);
    _tile_stored(3, out + kLower + 16, 32 * 4);
  }
}

// C[i * rsc + j] = A row i . weight row j for i < m, j in [j0, j1) (NOTE [AMX bfloat16 GEMM]; no bias): A's rows
// bfloat16, kp (k rounded up to 32, zero-padded) apart, m rounded up to 16 rows (zero rows); panel: scratch of
// bf16amx_panel_words(k) words.
__attribute__((target("amx-tile,amx-bf16"))) inline void bf16amx_cols(int64_t m, int64_t j0, int64_t j1, int64_t k,
                                                                      const uint16_t* a, const uint8_t* w, int64_t rsw,
                                                                      float* c, int64_t rsc, uint32_t* panel) {
  const int64_t kp = (k + 31) / 32 * 32, mp = (m + 15) / 16 * 16;
  const AmxTileConfig config;
  _tile_loadconfig(&config);
  alignas(64) float out[32 * 32];
  for (int64_t jb = j0; jb < j1; jb += kBgNR) {
    const int cols = static_cast<int>(std::min<int64_t>(kBgNR, j1 - jb));
    bg_pack(w, rsw, k, jb, cols, 0, kp, panel);
    for (int64_t i = 0; i < mp; i += 32) {
      if (i + 16 < mp) {
        ba_block<true>(kp, a + i * kp, panel, out);
      } else {
        ba_block<false>(kp, a + i * kp, panel, out);
      }
      const int64_t rows = std::min<int64_t>(32, m - i);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(c + (i + r) * rsc + jb, out + r * 32, sizeof(float) * cols);
    }
  }
  _tile_release();
}
#endif

// The table's AMX bfloat16 GEMM: on the AVX-512 table where the CPU has AMX-BF16 and the OS grants the tile state
// (os_amx), else none.
inline auto bf16amx_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, const uint16_t*, const uint8_t*, int64_t,
                                         float*, int64_t, uint32_t*) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().amx_bf16 && ::kael::cpu_features().os_amx) return bf16amx_cols;
#endif
  return nullptr;
}
