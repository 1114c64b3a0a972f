// The bfloat16 GEMM on AMX tiles (AMX-BF16's tdpbf16ps) for prompts of bf16 weights: the same rounded activations
// as vdpbf16ps's kernels (vec_bf16_dot.h), 16 x 16 float32 outputs per tile instruction, the weights read in place.
//
// NOTE [AMX bfloat16 GEMM]: C = A . W^T for prompts (more than 16 rows) of bf16 weights in auto mode where the CPU
// has AMX-BF16 and the OS grants this process the tile state (vec_select.cpp: os_amx). A's rows are rounded to
// bfloat16 as for the other bfloat16 kernels (ggml's GGML_FP32_TO_BF16), +0 past k. The tiles compute C's
// transpose, so that the weight rows are tdpbf16ps's row-major operand, loaded straight from GGML's layout (16 rows
// x 32 values a tile, the weight's row stride apart: no packing), while the activations are the operand in pairs:
// quant.cpp writes them once per call as bf16amx_pairs' layout (per group of 16 rows, value pair p of row i at word
// p * 16 + i % 16). Each output C[i, j] is one float32 lane of a tile that starts at +0 and takes one tdpbf16ps per
// 32 values of depth, in order (0 .. 31, 32 .. 63, ...; a depth's last partial chunk and a weight's last partial
// 16 rows through a zero-padded copy), and then the bias. Within one instruction Intel defines the sum as the 32
// products added in turn, but the hardware does not round as that definition reads: on the Sapphire Rapids host
// measured (a VM; 200 random 16 x 16 x 32 tiles), 86% of the lanes equal c + (the exact sum of the 32 products)
// rounded once, the rest differ by 1 to a few ulps of the result both ways, and no order of float32 additions
// reproduces it. So this path has no bit-exact NumPy model: its tests bound its error by 8 ulps per 32 values of
// depth of the sum of the products' magnitudes (tests/backend_cpu/test_quant_bf16_amx.py) and check what does hold
// exactly: a row's result does not depend on the number of rows, the other rows, the column split or the thread
// count (each output's tiles see the same inputs in the same order whatever the call), and the instruction is
// deterministic. It differs from vdpbf16ps's GEMM and from the few-row kernels (decode), which keep their bit-exact
// models. A step is 32 weight rows x 32 activation rows (tiles 0-3), the weights in tiles 4-5, the activations in
// 6-7.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

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

// Where a weight tile (16 rows from row j, 32 values from kk) is read: in place when it lies inside the weight
// (rows < n, values < k), else a zero-padded copy of its part inside, in edge (16 x 32 values).
struct AmxWeightTile {
  const uint8_t* ptr;
  int64_t stride;
};

constexpr int64_t kBaTileValues = int64_t{16} * 32;  // a weight tile's values: 16 rows x 32

inline AmxWeightTile ba_weight_tile(const uint8_t* w, int64_t rsw, int64_t n, int64_t k, int64_t j, int64_t kk,
                                    uint16_t* edge) {
  if (j + 16 <= n && kk + 32 <= k) return {w + j * rsw + kk * 2, rsw};
  const int64_t rows = std::min<int64_t>(16, n - j), vals = std::min<int64_t>(32, k - kk);
  std::memset(edge, 0, sizeof(uint16_t) * kBaTileValues);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(edge + r * 32, w + (j + r) * rsw + kk * 2, vals * sizeof(uint16_t));
  return {reinterpret_cast<const uint8_t*>(edge), 64};
}

// Weight rows j .. j + 15 (and j + 16 .. j + 31 when kTwoW) times activation rows i0 .. i0 + 15 (and + 16 .. + 31
// when kTwoX; xp: their pairs, group (i0 / 16) first) over the whole depth: out[r * 32 + t] = C[i0 + t, j + r].
template <bool kTwoW, bool kTwoX>
__attribute__((target("amx-tile,amx-bf16"))) inline void ba_block(int64_t n, int64_t k, const uint8_t* w, int64_t rsw,
                                                                  int64_t j, const uint32_t* xp, int64_t group_words,
                                                                  float* out, uint16_t* edge) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kk = 0; kk < k; kk += 32) {
    const AmxWeightTile w0 = ba_weight_tile(w, rsw, n, k, j, kk, edge);
    _tile_loadd(4, w0.ptr, w0.stride);
    const uint32_t* x = xp + kk / 2 * 16;
    _tile_loadd(6, x, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoX) {
      _tile_loadd(7, x + group_words, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kTwoW) {
      const AmxWeightTile w1 = ba_weight_tile(w, rsw, n, k, j + 16, kk, edge + kBaTileValues);
      _tile_loadd(5, w1.ptr, w1.stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kTwoX) _tile_dpbf16ps(3, 5, 7);
    }
  }
  constexpr int64_t kLower = int64_t{16} * 32;  // out's row 16
  _tile_stored(0, out, 32 * 4);
  if constexpr (kTwoX) _tile_stored(1, out + 16, 32 * 4);
  if constexpr (kTwoW) _tile_stored(2, out + kLower, 32 * 4);
  if constexpr (kTwoW && kTwoX) _tile_stored(3, out + kLower + 16, 32 * 4);
}

// C[i * rsc + j] = A row i . weight row j for i < m, j in [j0, j1) (NOTE [AMX bfloat16 GEMM]; no bias): xp holds
// A's rows as value pairs (bf16amx_pairs' layout: m rounded up to 16 rows, k to 32 values, zero-padded); the
// weight has n rows (rsw bytes apart) of k bfloat16 values; panel: scratch of at least 1024 words.
__attribute__((target("amx-tile,amx-bf16"))) inline void bf16amx_cols(int64_t m, int64_t n, int64_t j0, int64_t j1,
                                                                      int64_t k, const uint32_t* xp, const uint8_t* w,
                                                                      int64_t rsw, float* c, int64_t rsc,
                                                                      uint32_t* panel) {
  const int64_t kp = (k + 31) / 32 * 32, mp = (m + 15) / 16 * 16, group_words = kp / 2 * 16;
  const AmxTileConfig config;
  _tile_loadconfig(&config);
  alignas(64) float out[32 * 32];
  auto* edge = reinterpret_cast<uint16_t*>(panel);  // two 16 x 32-value weight tiles
  for (int64_t jb = j0; jb < j1; jb += 32) {
    const bool two_w = jb + 16 < j1;
    const int64_t cols = std::min<int64_t>(32, j1 - jb);
    for (int64_t i = 0; i < mp; i += 32) {
      const bool two_x = i + 16 < mp;
      const uint32_t* x = xp + i / 16 * group_words;
      if (two_w && two_x) {
        ba_block<true, true>(n, k, w, rsw, jb, x, group_words, out, edge);
      } else if (two_w) {
        ba_block<true, false>(n, k, w, rsw, jb, x, group_words, out, edge);
      } else if (two_x) {
        ba_block<false, true>(n, k, w, rsw, jb, x, group_words, out, edge);
      } else {
        ba_block<false, false>(n, k, w, rsw, jb, x, group_words, out, edge);
      }
      const int64_t rows = std::min<int64_t>(32, m - i);
      for (int64_t t = 0; t < rows; ++t) {
        float* ct = c + (i + t) * rsc + jb;
        for (int64_t r = 0; r < cols; ++r) ct[r] = out[r * 32 + t];
      }
    }
  }
  _tile_release();
}
#endif

// The table's AMX bfloat16 GEMM: on the AVX-512 table where the CPU has AMX-BF16 and the OS grants the tile state
// (os_amx), else none.
inline auto bf16amx_kernel() -> void (*)(int64_t, int64_t, int64_t, int64_t, int64_t, const uint32_t*, const uint8_t*,
                                         int64_t, float*, int64_t, uint32_t*) {
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  if (::kael::cpu_features().amx_bf16 && ::kael::cpu_features().os_amx) return bf16amx_cols;
#endif
  return nullptr;
}
