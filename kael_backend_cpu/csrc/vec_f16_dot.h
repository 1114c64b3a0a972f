// The float16 path of quantized_linear for f16 weights (NOTE [float16 activations] in quant.cpp): activation rows
// rounded to float16 (given here as float32 values, exact), times float16 weight rows widened by F16C.
//
// NOTE [float16 dot order]: every product of two float16 values is exact in float32 (11 + 11 significant bits, no
// underflow: 2^-48 is normal), so only the additions round. A row of K values is read in chunks of 32 (the last one
// zero-padded: the activation rows are padded with +0 to a multiple of 32, the weight's missing values read as +0);
// value 32c + l of chunk c goes into lane l of accumulator a0 (l < 16) or lane l - 16 of a1, each lane one float32
// sum from +0 in chunk order. Then s = a0 + a1 lane by lane, the 16 lanes summed as a tree: s[l] + s[l + 8] (l < 8),
// then l + 4, l + 2, l + 1; then the bias. Every table computes exactly this (16 lanes as one, two or four
// vectors; a fused multiply-add gives the same bits as the exact product's add), so a row's result is the same on
// every table and whatever the number of rows or threads.
// Pasted inside the per-ISA namespace by vec_table.h: no includes but its vec_*.h siblings.
#pragma once

#include "vec_quant.h"  // load_16bit, kQPrefetch
#include "vec_tiles.h"  // tile_rows

// NOTE [float16 prefetch]: the weight row is prefetched kQPrefetch bytes ahead into every cache level (locality
// 3), not non-temporally as the integer kernels do (locality 0). On a 2-core Xeon with a 300 MiB L3 the
// non-temporal hint held this kernel to 10 GB/s on GPT-2's 77 MB float16 head at 1 thread, against 34 GB/s with
// locality 3 (and 23 with no software prefetch); from DRAM (a 614 MB matrix) 9 against 16 GB/s. The integer and
// bfloat16 kernels measured the same either way there.
constexpr int64_t kHdLanes = 16;
constexpr int kHdVecs = static_cast<int>(kHdLanes / V<float>::L);  // vectors a 16-lane accumulator takes
static_assert(kHdLanes % V<float>::L == 0, "16 lanes in whole vectors");

// MR activation rows (x: float16 values as float32, kp = k rounded up to 32 apart, zero-padded) against one float16
// weight row w of k values: out[r * rso] = the dot products (no bias).
template <int MR>
inline void hd_tile_body(int64_t k, int64_t kp, const float* x, const uint8_t* w, float* out, int64_t rso) {
  constexpr int64_t L = V<float>::L;
  vf a0[MR][kHdVecs], a1[MR][kHdVecs];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < kHdVecs; ++v) a0[r][v] = a1[r][v] = vf{};
  }
  const auto chunk = [&](const uint8_t* wc, int64_t t) {
    vf w0[kHdVecs], w1[kHdVecs];
    for (int v = 0; v < kHdVecs; ++v) {
      w0[v] = load_16bit<3>(wc + v * L * 2);
      w1[v] = load_16bit<3>(wc + (kHdLanes + v * L) * 2);
    }
    for (int r = 0; r < MR; ++r) {
      const float* xr = x + r * kp + t;
      for (int v = 0; v < kHdVecs; ++v) {
        a0[r][v] += w0[v] * load(xr + v * L);
        a1[r][v] += w1[v] * load(xr + kHdLanes + v * L);
      }
    }
  };
  int64_t t = 0;
  for (; t + 32 <= k; t += 32) {
    __builtin_prefetch(w + t * 2 + kQPrefetch, 0, 3);  // NOTE [float16 prefetch]
    chunk(w + t * 2, t);
  }
  if (t < k) {  // the last values, zero-padded to a chunk
    alignas(64) uint8_t tail[64] = {};
    std::memcpy(tail, w + t * 2, static_cast<size_t>(k - t) * 2);
    chunk(tail, t);
  }
  for (int r = 0; r < MR; ++r) {
    alignas(64) float s[kHdLanes];
    for (int v = 0; v < kHdVecs; ++v) store(s + v * L, a0[r][v] + a1[r][v]);
    for (int64_t half = kHdLanes / 2; half >= 1; half /= 2) {
      for (int64_t l = 0; l < half; ++l) s[l] = s[l] + s[l + half];
    }
    out[r * rso] = s[0];
  }
}

// hd_tile_body kept out of line (as GCC left it when f16dot_rows called each count directly): inlined through
// tile_rows' lambdas, all four in one function measured 5-8% slower at 8 and 16 rows.
template <int MR>
__attribute__((noinline)) void hd_tile(int64_t k, int64_t kp, const float* x, const uint8_t* w, float* out,
                                       int64_t rso) {
  hd_tile_body<MR>(k, kp, x, w, out, rso);
}

// c[i * rsc + j] = activation row i (x + i * kp: float16 values as float32, kp = k rounded up to 32, zero-padded) .
// float16 weight row j (w + j * rsw bytes, k values) (+ bias[j]) for i < m <= 16, j < n; rows in tiles of up to
// four share each weight row's loads.
inline void f16dot_rows(int64_t m, int64_t n, int64_t k, const float* x, const uint8_t* w, int64_t rsw,
                        const float* bias, float* c, int64_t rsc) {
  const int64_t kp = (k + 31) / 32 * 32;
  if (m == 1) {  // one row (a decode step): the tile inlined into the loop over the weight rows, no call per row
    for (int64_t j = 0; j < n; ++j) {
      hd_tile_body<1>(k, kp, x, w + j * rsw, c + j, rsc);
      if (bias != nullptr) c[j] += bias[j];
    }
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = w + j * rsw;
    tile_rows<4, 3, 2, 1>(
        m, [&](auto rows, int64_t i) { hd_tile<decltype(rows)::value>(k, kp, x + i * kp, row, c + i * rsc + j, rsc); });
    if (bias != nullptr) {
      for (int64_t r = 0; r < m; ++r) c[r * rsc + j] += bias[j];
    }
  }
}
