// The GEMM driver (NOTE [gemm paths] in gemm.h), the matmul primitive and linear.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "buffer.h"
#include "elementwise.h"
#include "gemm.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vec.h"

namespace kael {
namespace {

constexpr int64_t kSmall = 16;  // rows (or columns) up to which the row kernels run (NOTE [gemm paths])

template <class T>
const GemmKernels<T>& kernels_for() {
  if constexpr (std::is_same_v<T, float>) {
    return vec().sgemm;
  } else {
    return vec().dgemm;
  }
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// One thread's share: the BLIS loops over a sub-matrix of C. pack_b(pc, kc, jc, nc, bp) packs
// rows [pc, pc + kc) x cols [jc, jc + nc) of B into nr-column panels at bp (zero padded), as
// GemmKernels::pack_b does; depth blocks are multiples of k_align (but the last).
template <class T, class PackB>
void gemm_packed_serial(int64_t m, int64_t n, int64_t k, int64_t k_align, const T* a, int64_t rsa, int64_t csa,
                        const PackB& pack_b, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const GemmKernels<T>& g = kernels_for<T>();
  const int64_t kblocks = (k + g.kc - 1) / g.kc;
  const int64_t kc_max = std::min(k, round_up((k + kblocks - 1) / kblocks, k_align));  // balanced depth blocks
  const int64_t mc_max = std::min(g.mc, round_up(m, g.mr));
  const int64_t nc_max = std::min(g.nc, round_up(n, g.nr));
  Buffer abuf(static_cast<size_t>(mc_max * kc_max) * sizeof(T));
  Buffer bbuf(static_cast<size_t>(nc_max * kc_max) * sizeof(T));
  T* ap = abuf.get<T>();
  T* bp = bbuf.get<T>();
  for (int64_t jc = 0; jc < n; jc += g.nc) {
    const int64_t nc = std::min(g.nc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kc_max) {
      const int64_t kc = std::min(kc_max, k - pc);
      pack_b(pc, kc, jc, nc, bp);
      const bool acc = accumulate || pc > 0;
      for (int64_t ic = 0; ic < m; ic += g.mc) {
        const int64_t mc = std::min(g.mc, m - ic);
        g.pack_a(mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap);
        for (int64_t jr = 0; jr < nc; jr += g.nr) {
          const int nr = static_cast<int>(std::min<int64_t>(g.nr, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += g.mr) {
            const int mr = static_cast<int>(std::min<int64_t>(g.mr, mc - ir));
            g.kernel(kc, ap + ir * kc, bp + jr * kc, c + (ic + ir) * rsc + (jc + jr) * csc, rsc, csc, mr, nr, acc);
          }
        }
      }
    }
  }
}

// The packed GEMM over the thread pool: the threads split the larger of m and n.
template <class T, class PackB>
void gemm_packed_with(int64_t m, int64_t n, int64_t k, int64_t k_align, const T* a, int64_t rsa, int64_t csa,
                      const PackB& pack_b, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const GemmKernels<T>& g = kernels_for<T>();
  const bool split_n = n >= m;
  const int64_t unit = split_n ? g.nr : g.mr;
  const int64_t units = ((split_n ? n : m) + unit - 1) / unit;
  const int64_t work = m * n * k;
  const int64_t parts = work < (int64_t{1} << 18) ? 1 : std::min<int64_t>(parallel_width(), units);
  if (parts <= 1) {
    gemm_packed_serial(m, n, k, k_align, a, rsa, csa, pack_b, c, rsc, csc, accumulate);
    return;
  }
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t u0 = units * p / parts, u1 = units * (p + 1) / parts;
      if (split_n) {
        const int64_t n0 = u0 * unit, n1 = std::min(n, u1 * unit);
        if (n1 > n0) {
          const auto shifted = [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* bp) {
            pack_b(pc, kc, n0 + jc, nc, bp);
          };
          gemm_packed_serial(m, n1 - n0, k, k_align, a, rsa, csa, shifted, c + n0 * csc, rsc, csc, accumulate);
        }
      } else {
        const int64_t m0 = u0 * unit, m1 = std::min(m, u1 * unit);
        if (m1 > m0) {
          gemm_packed_serial(m1 - m0, n, k, k_align, a + m0 * rsa, rsa, csa, pack_b, c + m0 * rsc, rsc, csc,
                             accumulate);
        }
      }
    }
  });
}

template <class T>
void gemm_packed(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb,
                 int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const GemmKernels<T>& g = kernels_for<T>();
  const auto pack = [&](int64_t pc, int64_t kc, int64_t jc, int64_t nc, T* bp) {
    g.pack_b(kc, nc, b + pc * rsb + jc * csb, rsb, csb, bp);
  };
  gemm_packed_with(m, n, k, 1, a, rsa, csa, pack, c, rsc, csc, accumulate);
}

// Few rows: C's columns split across threads, B read in place.
template <class T>
bool gemm_few_rows(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb,
                   int64_t csb, T* c, int64_t rsc, int64_t csc, bool accumulate) {
  const GemmKernels<T>& g = kernels_for<T>();
  const bool nmajor = csb == 1 && csc == 1;
  const bool kmajor = rsb == 1 && !nmajor;
  if (!nmajor && !kmajor) return false;
  Buffer abuf;
  if (kmajor && csa != 1) {  // the dot kernels want A contiguous along k: copy the few rows
    abuf = Buffer(static_cast<size_t>(m * k) * sizeof(T));
    T* ac = abuf.get<T>();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t kk = 0; kk < k; ++kk) ac[i * k + kk] = a[i * rsa + kk * csa];
    }
    a = ac;
    rsa = k;
    csa = 1;
  }
  // One contiguous column range per thread: each streams its part of every row of B
  // front to back (short pieces of rows would defeat the prefetchers).
  const int64_t block = 64;  // columns per unit of work
  const int64_t blocks = (n + block - 1) / block;
  const int64_t parts = m * n * k < (int64_t{1} << 16) ? 1 : std::min<int64_t>(parallel_width(), blocks);
  parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = blocks * p / parts * block, n1 = std::min(n, blocks * (p + 1) / parts * block);
      if (n1 <= n0) continue;
      if (nmajor) {
        g.rows_nmajor(m, n1 - n0, k, a, rsa, csa, b + n0, rsb, c + n0, rsc, accumulate);
      } else {
        g.rows_kmajor(m, n1 - n0, k, a, rsa, b + n0 * csb, csb, c + n0 * csc, rsc, csc, accumulate);
      }
    }
  });
  return true;
}

template <class T>
void naive_matmul_2d(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb,
                     int64_t csb, T* c, int64_t rsc, int64_t csc) {
  // integers wrap like NumPy: accumulate in the unsigned type of at least 32 bits
  using W = wide_t<T>;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) c[i * rsc + j * csc] = T(0);
    for (int64_t kk = 0; kk < k; ++kk) {
      const auto av = static_cast<W>(a[i * rsa + kk * csa]);  // NOLINT(bugprone-signed-char-misuse): wraps
      for (int64_t j = 0; j < n; ++j) {
        T& dst = c[i * rsc + j * csc];
        dst = static_cast<T>(static_cast<W>(static_cast<W>(dst) + av * static_cast<W>(b[kk * rsb + j * csb])));
      }
    }
  }
}

// The batch loop of matmul over native-typed operands.
template <class T>
void matmul_batches(const View& out, const View& a, const View& b) {
  const int nd = out.ndim;
  const int64_t m = out.shape[nd - 2], n = out.shape[nd - 1], k = a.shape[nd - 1];
  int64_t nbatch = 1;
  for (int d = 0; d < nd - 2; ++d) nbatch *= out.shape[d];
  auto run = [&](int64_t i) {
    int64_t rem = i, oo = 0, ao = 0, bo = 0;
    for (int d = nd - 3; d >= 0; --d) {
      const int64_t idx = rem % out.shape[d];
      rem /= out.shape[d];
      oo += idx * out.strides[d];
      ao += idx * a.strides[d];
      bo += idx * b.strides[d];
    }
    T* c = out.ptr<T>() + oo;
    const T* ap = a.ptr<T>() + ao;
    const T* bp = b.ptr<T>() + bo;
    if constexpr (std::is_floating_point_v<T>) {
      gemm<T>(m, n, k, ap, a.strides[nd - 2], a.strides[nd - 1], bp, b.strides[nd - 2], b.strides[nd - 1], c,
              out.strides[nd - 2], out.strides[nd - 1], false);
    } else {
      naive_matmul_2d<T>(m, n, k, ap, a.strides[nd - 2], a.strides[nd - 1], bp, b.strides[nd - 2], b.strides[nd - 1], c,
                         out.strides[nd - 2], out.strides[nd - 1]);
    }
  };
  const bool small = m * n * k < (int64_t{1} << 21) || !std::is_floating_point_v<T>;
  if (nbatch > 1 && small) {
    parallel_for(0, nbatch, std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, m * n * k)),
                 [&](int64_t b0, int64_t b1) {
                   for (int64_t i = b0; i < b1; ++i) run(i);
                 });
  } else {
    for (int64_t i = 0; i < nbatch; ++i) run(i);
  }
}

// Leading dims of v collapse to one row dim? Returns its stride (or 0 with ok=false).
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

template <class T>
void linear_native(const View& out, const View& x, const View& w, const View* bias) {
  const int64_t in = w.shape[1], outf = w.shape[0];
  const int64_t m = outf ? out.numel() / outf : 0;
  int64_t rsx = 0, rso = 0;
  Temp xt, ot;
  const View* xv = &x;
  const View* ov = &out;
  if (!rows_stride(x, &rsx)) {
    xt = to_contiguous(x, x.dtype);
    xv = &xt.view;
    rsx = in;
  }
  if (!rows_stride(out, &rso) || out.strides[out.ndim - 1] != 1) {
    ot = make_temp(out.dtype, out.shape, out.ndim);
    ov = &ot.view;
    rso = outf;
  }
  T* c = ov->ptr<T>();
  const int64_t cso = ov->strides[ov->ndim - 1];
  if (bias != nullptr) {
    Temp bt;
    const T* bp = bias->ptr<T>();
    if (bias->strides[0] != 1) {
      bt = to_contiguous(*bias, bias->dtype);
      bp = bt.view.ptr<T>();
    }
    parallel_for(0, m, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, outf)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) std::memcpy(c + r * rso, bp, static_cast<size_t>(outf) * sizeof(T));
    });
  }
  gemm<T>(m, outf, in, xv->ptr<T>(), rsx, xv->strides[xv->ndim - 1], w.ptr<T>(), w.strides[1], w.strides[0], c, rso,
          cso, bias != nullptr);
  if (ov != &out) copy(out, *ov);
}

}  // namespace

template <class T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, int64_t rsa, int64_t csa, const T* b, int64_t rsb, int64_t csb,
          T* c, int64_t rsc, int64_t csc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) c[i * rsc + j * csc] = T(0);
      }
    }
    return;
  }
  if (n == 1) {  // a single column: its column strides are meaningless
    csb = 1;
    csc = 1;
  }
  // Keep C row-major for the micro-kernel: C^T = B^T A^T when C is column-major.
  if (csc != 1 && rsc == 1) {
    gemm<T>(n, m, k, b, csb, rsb, a, csa, rsa, c, csc, rsc, accumulate);
    return;
  }
  if (m <= kSmall && gemm_few_rows(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate)) return;
  // Few columns: the transposed product, but only past kSmall rows, so up to kSmall rows a row is always summed
  // by the row kernels as it would be alone (a short KV cache makes n < m in stacked GQA decode).
  if (m > kSmall && n <= kSmall && gemm_few_rows(n, m, k, b, csb, rsb, a, csa, rsa, c, csc, rsc, accumulate)) return;
  gemm_packed(m, n, k, a, rsa, csa, b, rsb, csb, c, rsc, csc, accumulate);
}

template void gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                          float*, int64_t, int64_t, bool);

template void gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t, int64_t,
                           double*, int64_t, int64_t, bool);

void sgemm_packed_b(int64_t m, int64_t n, int64_t k, const float* a, int64_t rsa, int64_t csa, int64_t k_align,
                    const PackBFn& pack_b, float* c, int64_t rsc) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  gemm_packed_with(m, n, k, std::max<int64_t>(1, k_align), a, rsa, csa, pack_b, c, rsc, 1, false);
}

int sgemm_nr() {
  return vec().sgemm.nr;
}

void matmul(const View& out, const View& a, const View& b) {
  const int nd = out.ndim;
  KAEL_CHECK(nd >= 2 && a.ndim == nd && b.ndim == nd, Shape, "matmul: expected out, a, b with the same rank >= 2, got ",
             nd, ", ", a.ndim, ", ", b.ndim);
  KAEL_CHECK(a.shape[nd - 2] == out.shape[nd - 2] && b.shape[nd - 1] == out.shape[nd - 1] &&
                 a.shape[nd - 1] == b.shape[nd - 2],
             Shape, "matmul: a [.., ", a.shape[nd - 2], ", ", a.shape[nd - 1], "] @ b [.., ", b.shape[nd - 2], ", ",
             b.shape[nd - 1], "] does not give out [.., ", out.shape[nd - 2], ", ", out.shape[nd - 1], "]");
  for (int d = 0; d < nd - 2; ++d) {
    KAEL_CHECK(a.shape[d] == out.shape[d] && b.shape[d] == out.shape[d], Shape,
               "matmul: batch dims must already be broadcast to the output's, dim ", d);
  }
  KAEL_CHECK(a.dtype == out.dtype && b.dtype == out.dtype, DType, "matmul: dtypes differ: out ", dtype_name(out.dtype),
             ", a ", dtype_name(a.dtype), ", b ", dtype_name(b.dtype));
  if (out.numel() == 0) return;
  if (is_half(out.dtype)) {  // compute in float32
    Temp ta = to_contiguous(a, DType::Float32), tb = to_contiguous(b, DType::Float32);
    Temp tc = make_temp(DType::Float32, out.shape, nd);
    matmul_batches<float>(tc.view, ta.view, tb.view);
    copy(out, tc.view);
    return;
  }
  KAEL_CHECK(out.dtype != DType::Bool, DType, "matmul: bool tensors are not supported");
  KAEL_DISPATCH_NATIVE(out.dtype, "matmul", (matmul_batches<T>(out, a, b)));
}

void linear(const View& out, const View& x, const View& weight, const View* bias) {
  KAEL_CHECK(weight.ndim == 2 && x.ndim >= 1 && x.shape[x.ndim - 1] == weight.shape[1], Shape, "linear: input [.., ",
             x.ndim ? x.shape[x.ndim - 1] : 0, "] does not fit weight of ", weight.ndim, " dims");
  KAEL_CHECK(out.ndim >= 1 && out.shape[out.ndim - 1] == weight.shape[0], Shape, "linear: output's last dim ",
             out.ndim ? out.shape[out.ndim - 1] : 0, " != out_features ", weight.shape[0]);
  KAEL_CHECK(bias == nullptr || (bias->ndim == 1 && bias->shape[0] == weight.shape[0]), Shape, "linear: bias must be [",
             weight.shape[0], "]");
  KAEL_CHECK(x.dtype == out.dtype && weight.dtype == out.dtype && (bias == nullptr || bias->dtype == out.dtype), DType,
             "linear: input, weight, bias and output must share a dtype");
  if (out.numel() == 0) return;
  if (is_half(out.dtype)) {
    Temp tx = to_contiguous(x, DType::Float32), tw = to_contiguous(weight, DType::Float32);
    Temp to = make_temp(DType::Float32, out.shape, out.ndim);
    Temp tb;
    if (bias != nullptr) tb = to_contiguous(*bias, DType::Float32);
    linear_native<float>(to.view, tx.view, tw.view, bias ? &tb.view : nullptr);
    copy(out, to.view);
    return;
  }
  KAEL_DISPATCH_FLOAT(out.dtype, "linear", (linear_native<T>(out, x, weight, bias)));
}

}  // namespace kael
