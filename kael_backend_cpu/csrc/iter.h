// Strided iteration over N same-shaped operands: the loop every elementwise kernel uses.
//
// NOTE [strided loops]: build_loop() drops size-1 dims, orders the dims so that the
// output's smallest stride is innermost, and coalesces neighbouring dims that are
// contiguous with each other in every operand (a contiguous tensor becomes one long
// run). for_each() then calls an inner function f(ptrs, byte_strides, n) on 1-D runs,
// split across the thread pool. When an input's layout disagrees with the output's
// (a transposed operand), the last two dims are walked in 64x64 tiles so both stay in
// cache. Inner functions pick their contiguous fast paths from the byte strides.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "thread_pool.h"
#include "view.h"

namespace kael {

template <int N>
struct StridedLoop {
  int ndim = 1;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // bytes
  char* base[N] = {};
};

template <int N>
StridedLoop<N> build_loop(const View* const (&ops)[N]) {
  StridedLoop<N> L;
  const View& out = *ops[0];
  for (int k = 0; k < N; ++k) L.base[k] = ops[k]->data;
  L.numel = out.numel();
  int dims[kMaxDims];
  int nd = 0;
  for (int d = 0; d < out.ndim; ++d) {
    if (out.shape[d] != 1) dims[nd++] = d;
  }
  // stable insertion sort: output strides descending (innermost = smallest stride)
  for (int i = 1; i < nd; ++i) {
    const int d = dims[i];
    int j = i - 1;
    while (j >= 0 && out.strides[dims[j]] < out.strides[d]) {
      dims[j + 1] = dims[j];
      --j;
    }
    dims[j + 1] = d;
  }
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    const int d = dims[i];
    if (m > 0) {
      bool mergeable = true;  // previous (outer) dim m-1 folds into d?
      for (int k = 0; k < N && mergeable; ++k) {
        const int64_t is = ops[k]->elsize();
        mergeable = L.strides[k][m - 1] == ops[k]->strides[d] * is * out.shape[d];
      }
      if (mergeable) {
        L.shape[m - 1] *= out.shape[d];
        for (int k = 0; k < N; ++k) L.strides[k][m - 1] = ops[k]->strides[d] * ops[k]->elsize();
        continue;
      }
    }
    L.shape[m] = out.shape[d];
    for (int k = 0; k < N; ++k) L.strides[k][m] = ops[k]->strides[d] * ops[k]->elsize();
    ++m;
  }
  if (m == 0) {
    L.shape[0] = 1;
    for (int k = 0; k < N; ++k) L.strides[k][0] = 0;
    m = 1;
  }
  L.ndim = m;
  return L;
}

// Run f over the linear index range [b, e) of the loop, one inner run at a time.
template <int N, class F>
void run_range(const StridedLoop<N>& L, int64_t b, int64_t e, F& f) {
  const int nd = L.ndim;
  const int64_t inner = L.shape[nd - 1];
  int64_t idx[kMaxDims];
  int64_t rem = b;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % L.shape[d];
    rem /= L.shape[d];
  }
  char* p[N];
  int64_t s[N];
  for (int k = 0; k < N; ++k) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[d] * L.strides[k][d];
    p[k] = L.base[k] + off;
    s[k] = L.strides[k][nd - 1];
  }
  int64_t pos = b;
  while (pos < e) {
    const int64_t n = std::min(inner - idx[nd - 1], e - pos);
    f(static_cast<char* const*>(p), static_cast<const int64_t*>(s), n);
    pos += n;
    if (pos >= e) break;
    idx[nd - 1] += n;
    for (int k = 0; k < N; ++k) p[k] += n * s[k];
    for (int d = nd - 1; d > 0 && idx[d] == L.shape[d]; --d) {
      idx[d] = 0;
      ++idx[d - 1];
      for (int k = 0; k < N; ++k) p[k] += L.strides[k][d - 1] - L.shape[d] * L.strides[k][d];
    }
  }
}

// Whether some operand walks the last two dims against the output's order.
template <int N>
bool wants_tiles(const StridedLoop<N>& L) {
  const int nd = L.ndim;
  if (nd < 2 || L.shape[nd - 1] < 16 || L.shape[nd - 2] < 16) return false;
  for (int k = 1; k < N; ++k) {
    const int64_t inner = L.strides[k][nd - 1];
    const int64_t outer = L.strides[k][nd - 2];
    if (inner > 64 && outer < inner) return true;
  }
  return false;
}

constexpr int64_t kTile = 64;

// The tiled walk: tiles of kTile x kTile over the last two dims.
template <int N, class F>
void run_tiles(const StridedLoop<N>& L, int64_t t0, int64_t t1, F& f) {
  const int nd = L.ndim;
  const int64_t rows = L.shape[nd - 2], cols = L.shape[nd - 1];
  const int64_t tr = (rows + kTile - 1) / kTile, tc = (cols + kTile - 1) / kTile;
  int64_t s[N];
  for (int k = 0; k < N; ++k) s[k] = L.strides[k][nd - 1];
  for (int64_t t = t0; t < t1; ++t) {
    int64_t rem = t;
    const int64_t jc = rem % tc;
    rem /= tc;
    const int64_t jr = rem % tr;
    rem /= tr;
    char* p[N];
    for (int k = 0; k < N; ++k) {
      int64_t off = 0;
      int64_t r = rem;
      for (int d = nd - 3; d >= 0; --d) {
        off += (r % L.shape[d]) * L.strides[k][d];
        r /= L.shape[d];
      }
      p[k] = L.base[k] + off + jr * kTile * L.strides[k][nd - 2] + jc * kTile * s[k];
    }
    const int64_t nr = std::min(kTile, rows - jr * kTile), nc = std::min(kTile, cols - jc * kTile);
    for (int64_t r = 0; r < nr; ++r) {
      f(static_cast<char* const*>(p), static_cast<const int64_t*>(s), nc);
      for (int k = 0; k < N; ++k) p[k] += L.strides[k][nd - 2];
    }
  }
}

// Call f(char* const* ptrs, const int64_t* byte_strides, int64_t n) over every
// element of the loop, in parallel chunks of at least `grain` elements.
template <int N, class F>
void for_each(const StridedLoop<N>& L, int64_t grain, F&& f) {
  if (L.numel == 0) return;
  if (wants_tiles(L)) {
    const int nd = L.ndim;
    const int64_t ntiles = L.numel / (L.shape[nd - 1] * L.shape[nd - 2]) * ((L.shape[nd - 2] + kTile - 1) / kTile) *
                           ((L.shape[nd - 1] + kTile - 1) / kTile);
    parallel_for(0, ntiles, std::max<int64_t>(1, grain / (kTile * kTile)),
                 [&](int64_t b, int64_t e) { run_tiles(L, b, e, f); });
    return;
  }
  parallel_for(0, L.numel, grain, [&](int64_t b, int64_t e) { run_range(L, b, e, f); });
}

template <int N, class F>
void for_each(const View* const (&ops)[N], int64_t grain, F&& f) {
  for_each(build_loop<N>(ops), grain, f);
}

// Grains (elements per chunk) for cheap and costly per-element work.
constexpr int64_t kGrainCheap = 32768;
constexpr int64_t kGrainCostly = 4096;

}  // namespace kael
