// The few-row GEMM kernels (NOTE [gemm paths] in gemm.h), which read their operands in place:
// rows_nmajor (B contiguous along n: B's rows streamed through C) and rows_kmajor (A's rows
// and B's columns contiguous along k: blocks of dot products). Each sums an element's
// products in the same order whatever the number of rows.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"

// Few rows, B contiguous along n: B's rows stream front to back, KG rows at a time,
// into a chunk of C's columns kept in cache (C is read and written once per KG rows
// of B; B is read once in total, sequentially, which is what the memory system and
// the prefetchers like best for decode-sized products).
template <class T, int MB, int KG>
void stream_block(int64_t n, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c, int64_t rsc) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  vt av[MB][KG];
  for (int m = 0; m < MB; ++m) {
    for (int t = 0; t < KG; ++t) av[m][t] = splat(a[m * rsa + t * csa]);
  }
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    vt bv[KG];
    for (int t = 0; t < KG; ++t) bv[t] = load(b + t * rsb + j);
    for (int m = 0; m < MB; ++m) {
      vt cv = load(c + m * rsc + j);
      for (int t = 0; t < KG; ++t) cv += av[m][t] * bv[t];
      store(c + m * rsc + j, cv);
    }
  }
  for (; j < n; ++j) {
    for (int m = 0; m < MB; ++m) {
      T s = c[m * rsc + j];
      for (int t = 0; t < KG; ++t) s += a[m * rsa + t * csa] * b[t * rsb + j];
      c[m * rsc + j] = s;
    }
  }
}

template <class T, int MB, int KG>
void stream_rows(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                 int64_t rsc) {
  int64_t kk = 0;
  for (; kk + KG <= k; kk += KG) {
    int64_t i = 0;
    for (; i + MB <= m; i += MB) {
      stream_block<T, MB, KG>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
    }
    for (; i < m; ++i) stream_block<T, 1, KG>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
  }
  for (; kk < k; ++kk) {
    for (int64_t i = 0; i < m; ++i)
      stream_block<T, 1, 1>(n, a + i * rsa + kk * csa, rsa, csa, b + kk * rsb, rsb, c + i * rsc, rsc);
  }
}

// Few rows, B contiguous along n, a register tile of C: MB rows x NV vectors of C held
// in registers while kn rows of B go by (loaded from C first and stored back after).
// Every element of C still sums its products in order k = 0, 1, 2, ... with one fused
// multiply-add each, exactly like stream_block, so a row comes out bit-identical
// whatever m is (NOTE [batched = alone] in kael/models/_batched.py).
template <class T, int MB, int NV>
inline void tile_nmajor(int64_t kn, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c, int64_t rsc) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  vt acc[MB][NV];
  for (int i = 0; i < MB; ++i) {
    for (int v = 0; v < NV; ++v) acc[i][v] = load(c + i * rsc + v * L);
  }
#pragma GCC unroll 4
  for (int64_t t = 0; t < kn; ++t) {
    vt bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + t * rsb + v * L);
    for (int i = 0; i < MB; ++i) {
      const vt av = splat(a[i * rsa + t * csa]);
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
  for (int i = 0; i < MB; ++i) {
    for (int v = 0; v < NV; ++v) store(c + i * rsc + v * L, acc[i][v]);
  }
}

// All m rows of one column tile (NV vectors wide), four rows at a time: the tile's
// kn x NV*L block of B is read from memory by the first group and from L1 by the rest.
template <class T, int NV>
inline void tile_rows_nmajor(int64_t m, int64_t kn, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                             int64_t rsc) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) tile_nmajor<T, 4, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
  switch (m - i) {
    case 3:
      tile_nmajor<T, 3, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    case 2:
      tile_nmajor<T, 2, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    case 1:
      tile_nmajor<T, 1, NV>(kn, a + i * rsa, rsa, csa, b, rsb, c + i * rsc, rsc);
      break;
    default:
      break;
  }
}

template <class T>
void rows_nmajor(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, T* c,
                 int64_t rsc, bool accumulate) {
  if (!accumulate) {
    for (int64_t i = 0; i < m; ++i) std::memset(c + i * rsc, 0, static_cast<size_t>(n) * sizeof(T));
  }
  if (m == 1 || m > 4) {
    // Stream B's rows front to back (eight at a time for one row; four at a time for
    // pairs of rows) through a chunk of C that stays in cache (~256 KiB): B is read once,
    // sequentially, at memory bandwidth. For five rows and more this measured faster than
    // the register tiles below when B comes from memory (the long runs along B's rows
    // keep the prefetchers ahead).
    const int64_t chunk = std::max<int64_t>(256, (int64_t{256} << 10) / (m * static_cast<int64_t>(sizeof(T))));
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t w = n - j0 < chunk ? n - j0 : chunk;
      if (m == 1) {
        stream_rows<T, 1, 8>(1, w, k, a, rsa, csa, b + j0, rsb, c + j0, rsc);
      } else {
        stream_rows<T, 2, 4>(m, w, k, a, rsa, csa, b + j0, rsb, c + j0, rsc);
      }
    }
    return;
  }
  constexpr int64_t L = V<T>::L;
  // Two to four rows: blocks of KB rows of B, cut into register tiles of 4 rows x 3
  // vectors that hold C while the block goes by; C's chunk (m x W, 256 KiB) stays in L2
  // between blocks, so B's rows are read in long runs.
  constexpr int64_t KB = 4;
  const int64_t W = std::max<int64_t>(1, (int64_t{256} << 10) / (m * static_cast<int64_t>(sizeof(T)) * 3 * L)) * 3 * L;
  for (int64_t j0 = 0; j0 < n; j0 += W) {
    const int64_t j1 = n - j0 < W ? n : j0 + W;
    for (int64_t k0 = 0; k0 < k; k0 += KB) {
      const int64_t kn = k - k0 < KB ? k - k0 : KB;
      const T* ak = a + k0 * csa;
      const T* bk = b + k0 * rsb;
      int64_t j = j0;
      const int64_t ahead = k - k0 - KB < KB ? k - k0 - KB : KB;  // rows of the next block
      for (; j + 3 * L <= j1; j += 3 * L) {
        // the same columns of the next block: fetched now, used one sweep of W later
        for (int64_t t = 0; t < ahead; ++t) {
          __builtin_prefetch(bk + (KB + t) * rsb + j);
          __builtin_prefetch(bk + (KB + t) * rsb + j + 3 * L - 1);
        }
        tile_rows_nmajor<T, 3>(m, kn, ak, rsa, csa, bk + j, rsb, c + j, rsc);
      }
      for (; j + L <= j1; j += L) tile_rows_nmajor<T, 1>(m, kn, ak, rsa, csa, bk + j, rsb, c + j, rsc);
      for (; j < j1; ++j) {
        for (int64_t i = 0; i < m; ++i) {
          T s = c[i * rsc + j];
          for (int64_t t = 0; t < kn; ++t) s += ak[i * rsa + t * csa] * bk[t * rsb + j];
          c[i * rsc + j] = s;
        }
      }
    }
  }
}

// Cache lines to prefetch, a line per step of a dot-product loop up to `stop`.
struct LineFetch {
  const char* next = nullptr;
  const char* stop = nullptr;
};

// Few rows, A rows and B columns contiguous along k: MB x NB dot products, each summed in
// L lanes. kmajor_accumulate adds the products over [k0, k1) (whole vectors) to acc; with
// `fetch`, each step along k also prefetches one line of it (spread this way, the requests
// overlap the arithmetic instead of queueing up in a burst). kmajor_store sums the lanes,
// adds the last k % L products and writes C. Split at any multiple of L, the sums are the
// same operations in the same order.
template <class T, int MB, int NB>
inline void kmajor_accumulate(vec_t<T> (&acc)[MB][NB], int64_t k0, int64_t k1, const T* a, int64_t rsa, const T* b,
                              int64_t csb, LineFetch* fetch) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  for (int64_t kk = k0; kk + L <= k1; kk += L) {
    if (fetch != nullptr && fetch->next < fetch->stop) {
      __builtin_prefetch(fetch->next, 0, 2);
      fetch->next += 64;
    }
    vt bv[NB];
    for (int j = 0; j < NB; ++j) bv[j] = load(b + j * csb + kk);
    for (int i = 0; i < MB; ++i) {
      const vt av = load(a + i * rsa + kk);
      for (int j = 0; j < NB; ++j) acc[i][j] += av * bv[j];
    }
  }
}

template <class T, int MB, int NB>
inline void kmajor_store(const vec_t<T> (&acc)[MB][NB], int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb,
                         T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const int64_t kv = k - k % V<T>::L;
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < NB; ++j) {
      T s = hsum<T>(acc[i][j]);
      for (int64_t t = kv; t < k; ++t) s += a[i * rsa + t] * b[j * csb + t];
      T& dst = c[i * rsc + j * csc];
      dst = accumulate ? dst + s : s;
    }
  }
}

// NOTE [one-row prefetch]: one row of A against B's columns (decode's float32 linears) is a
// single stream through B, which the hardware prefetchers follow; asking besides for the line
// kOneRowAhead bytes ahead at each step, into L2 (locality 1), keeps more misses in flight than
// they do alone. Decode, float32 GGUF files, this 300 MiB-L3 AVX-512 host, tok/s, median of 3
// interleaved runs, without -> with: GPT-2 small 31.4 -> 35.8 (1 thread), 62.0 -> 71.4 (2);
// SmolLM2-135M-shaped 28.3 -> 32.3, 54.2 -> 62.0 (the weights read at 1.0x NumPy's bandwidth
// on the same working set, where they read at 0.87-0.91x). 8 KiB ahead gained less, 32 and
// 64 KiB less again; locality 3 (into L1) lost to no prefetch at all. Only the order of the
// loads changes: every product and sum is the same.
constexpr int64_t kOneRowAhead = 16384;

// One row of A against B's n columns (m = 1 of rows_kmajor): each column a rows_kmajor_block<1, 1>
// that also prefetches, at each step, the line kOneRowAhead bytes ahead of the step's load, below
// the end of B. Its own loop rather than kmajor_accumulate with a LineFetch: that one measured
// about 10% slower here at 2 threads (GPT-2 small's float32 decode, 3 interleaved runs), and its
// fetch moves a line a step, so on tables whose step is under a line its distance would grow.
template <class T>
void one_row_dots(int64_t n, int64_t k, const T* a, const T* b, int64_t csb, T* c, int64_t csc, bool accumulate) {
  using vt = vec_t<T>;
  constexpr int64_t L = V<T>::L;
  constexpr int64_t step = L * static_cast<int64_t>(sizeof(T));
  const char* end = reinterpret_cast<const char*>(b + (n - 1) * csb + k);
  for (int64_t j = 0; j < n; ++j) {
    const T* bj = b + j * csb;
    const char* ahead = reinterpret_cast<const char*>(bj) + kOneRowAhead;
    vt acc[1][1] = {{vt{}}};
    for (int64_t kk = 0; kk + L <= k; kk += L, ahead += step) {
      if (ahead < end) __builtin_prefetch(ahead, 0, 1);
      acc[0][0] += load(a + kk) * load(bj + kk);
    }
    kmajor_store<T, 1, 1>(acc, k, a, k, bj, csb, c + j * csc, 0, csc, accumulate);
  }
}

template <class T, int MB, int NB>
void rows_kmajor_block(int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb, T* c, int64_t rsc, int64_t csc,
                       bool accumulate) {
  vec_t<T> acc[MB][NB];
  for (auto& row : acc) {
    for (auto& v : row) v = vec_t<T>{};
  }
  kmajor_accumulate<T, MB, NB>(acc, 0, k, a, rsa, b, csb, nullptr);
  kmajor_store<T, MB, NB>(acc, k, a, rsa, b, csb, c, rsc, csc, accumulate);
}

// One group of MB rows over the column tiles [j0, j1) of rows_kmajor (3 columns a tile),
// the products over [k0, k1) only; each tile prefetches its share (`per_tile` lines) of
// the stream `fetch`. Between depth blocks a tile's accumulators wait in `saved` (MB x 3
// vectors a tile; null when [k0, k1) is the whole depth); after the last block (k1 == k)
// the tile's results go to C.
template <class T, int MB>
void kmajor_pass(int64_t j0, int64_t j1, int64_t k0, int64_t k1, int64_t k, const T* a, int64_t rsa, const T* b,
                 int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate, vec_t<T>* saved, LineFetch& fetch,
                 int64_t per_tile, const char* end) {
  for (int64_t jj = j0; jj < j1; jj += 3) {
    vec_t<T>* tile = saved == nullptr ? nullptr : saved + (jj - j0) * MB;
    vec_t<T> acc[MB][3];
    for (int i = 0; i < MB; ++i) {
      for (int j = 0; j < 3; ++j) acc[i][j] = k0 == 0 ? vec_t<T>{} : tile[i * 3 + j];
    }
    LineFetch share{fetch.next, std::min(end, fetch.next + per_tile * 64)};
    kmajor_accumulate<T, MB, 3>(acc, k0, k1, a, rsa, b + jj * csb, csb, &share);
    fetch.next = share.next;
    if (k1 == k) {
      kmajor_store<T, MB, 3>(acc, k, a, rsa, b + jj * csb, csb, c + jj * csc, rsc, csc, accumulate);
    } else {
      for (int i = 0; i < MB; ++i) {
        for (int j = 0; j < 3; ++j) tile[i * 3 + j] = acc[i][j];
      }
    }
  }
}

// Long dot products (MLP down-projection, k = 3072): four rows of A no longer fit in L1
// beside a tile of B, so every step would read both from L2. The chunk's products then go
// in depth blocks of kDepth: a group's rows and a tile over one block stay in L1.
constexpr int64_t kDepthMin = 1024;
constexpr int64_t kDepth = 512;

template <class T>
void rows_kmajor(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, const T* b, int64_t csb, T* c, int64_t rsc,
                 int64_t csc, bool accumulate) {
  // One row: B's columns one after the other, a single stream through memory front to back,
  // prefetched ahead (NOTE [one-row prefetch]). Before that prefetch, on another host: 1 thread,
  // GPT-2 small's float32 linears, 494 MB, 24 GB/s, that machine's read bandwidth, where blocks
  // of 1 x 8 columns, eight interleaved streams, took 19 GB/s and 1 x 2 or chunks with
  // prefetching less. More rows: blocks of 4 x 3 dot products (twelve independent accumulators
  // keep both FMA pipes busy). Columns go in chunks of about 128 KiB of B: every group of four
  // rows of A (in L1) runs over the chunk, which the first group reads from memory and the
  // others from L2, so B is read from memory once. Each dot product sums its lanes in the same
  // order in every block shape, so a row's result does not depend on m.
  int64_t j = 0;
  if (m == 1 && n > 0) {
    one_row_dots<T>(n, k, a, b, csb, c, csc, accumulate);  // NOTE [one-row prefetch]
    j = n;
  }
  const int64_t chunk = std::max<int64_t>(1, (int64_t{128} << 10) / (3 * k * static_cast<int64_t>(sizeof(T)))) * 3;
  const int64_t n3 = j + (n - j) / 3 * 3;
  const int64_t groups = m / 4 + (m % 4) / 2 + m % 2;
  std::vector<vec_t<T>> saved;  // a depth-blocked chunk's accumulators: m x (j1 - j0) vectors
  for (int64_t j0 = j; j0 < n3; j0 += chunk) {
    const int64_t j1 = std::min<int64_t>(n3, j0 + chunk);
    // The next chunk of B is fetched into cache while this one is computed: each block
    // takes an equal share and asks for one line per step along k (a burst of requests
    // at the start of each block would stall it; kael_backend_cpu/README.md, "Notes"),
    // so memory and arithmetic overlap.
    const char* next = reinterpret_cast<const char*>(b + j1 * csb);
    const int64_t next_bytes = (std::min<int64_t>(n, j1 + chunk) - j1) * csb * static_cast<int64_t>(sizeof(T));
    const int64_t tiles = (j1 - j0) / 3;
    const int64_t per_tile = (next_bytes / 64 + groups * tiles - 1) / (groups * tiles);  // lines
    const char* end = next + std::max<int64_t>(0, next_bytes);
    LineFetch fetch{next, end};
    const int64_t depth = k > kDepthMin && m > 1 ? kDepth : std::max<int64_t>(k, 1);
    const int64_t depths = std::max<int64_t>(1, (k + depth - 1) / depth);
    const int64_t per_block = (per_tile + depths - 1) / depths;
    if (depths > 1) saved.resize(static_cast<size_t>(m * (j1 - j0)));
    const auto group_saved = [&](int64_t i) { return depths > 1 ? saved.data() + i * (j1 - j0) : nullptr; };
    for (int64_t k0 = 0; k0 == 0 || k0 < k; k0 += depth) {
      const int64_t k1 = std::min(k, k0 + depth);
      int64_t i = 0;
      for (; i + 4 <= m; i += 4)
        kmajor_pass<T, 4>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
      for (; i + 2 <= m; i += 2)
        kmajor_pass<T, 2>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
      for (; i < m; ++i)
        kmajor_pass<T, 1>(j0, j1, k0, k1, k, a + i * rsa, rsa, b, csb, c + i * rsc, rsc, csc, accumulate,
                          group_saved(i), fetch, per_block, end);
    }
  }
  for (j = n3; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      rows_kmajor_block<T, 1, 1>(k, a + i * rsa, rsa, b + j * csb, csb, c + i * rsc + j * csc, rsc, csc, accumulate);
    }
  }
}
