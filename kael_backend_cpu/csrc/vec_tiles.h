// What the micro-tile kernels of quantized_linear share (vec_bf16_dot.h, vec_f16_dot.h, vec_quant_gemm.h): the walk
// over a call's rows in tiles of a few fixed row counts, and the masked columns of a 32-column panel's edge.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

// tile(std::integral_constant<int, R>{}, i) for rows i .. i + R - 1 of m rows, the tile row counts R taken from RS
// in the order given (largest first, the last 1): as many tiles of each as fit in the rows left, then the next. A
// kernel templated on its row count is so instantiated once per count, and every row belongs to exactly one tile.
template <int... RS, class Tile>
inline void tile_rows(int64_t m, const Tile& tile) {
  constexpr int kRows[] = {RS...};
  static_assert(kRows[sizeof...(RS) - 1] == 1, "the last tile is one row: every row is covered");
  int64_t i = 0;
  const auto tiles_of = [&](auto rows) {
    for (; i + decltype(rows)::value <= m; i += decltype(rows)::value) tile(rows, i);
  };
  (tiles_of(std::integral_constant<int, RS>{}), ...);
}

#if KAEL_VBYTES == 64 && defined(__AVX512F__)
// The first cols (1 .. 32) columns of a 32-column panel of C, two vectors of 16 float32 lanes: a row's masked load
// (+0 instead on the panel's first depth block) and store, so the columns past cols are neither read nor written.
struct PanelEdge {
  __mmask16 m0, m1;  // the columns cols covers of lanes 0 .. 15 and 16 .. 31

  explicit PanelEdge(int cols)
      : m0(cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1)),
        m1(cols >= 32   ? 0xFFFF
           : cols <= 16 ? 0
                        : static_cast<__mmask16>((1u << (cols - 16)) - 1)) {}

  // acc = the row's sums so far at c (first: +0)
  void load(const float* c, bool first, __m512 (&acc)[2]) const {
    acc[0] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, c);
    acc[1] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, c + 16);
  }

  void store(float* c, const __m512 (&acc)[2]) const {
    _mm512_mask_storeu_ps(c, m0, acc[0]);
    _mm512_mask_storeu_ps(c + 16, m1, acc[1]);
  }
};
#endif
