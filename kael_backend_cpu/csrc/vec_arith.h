// float32 add/sub/mul/div loops over contiguous or broadcast (stride 0) operands; large
// outputs are written with non-temporal stores.
// Pasted inside the per-ISA namespace by vec_table.h (NOTE [runtime dispatch] in vec.h):
// no includes but its vec_*.h siblings.
#pragma once

#include "vec_core.h"

// Outputs of at least this many bytes bypass the cache (they would evict it anyway).
constexpr int64_t kStreamBytes = int64_t{16} << 20;

template <int OP>
inline vf arith(vf a, vf b) {
  if constexpr (OP == 0)
    return a + b;
  else if constexpr (OP == 1)
    return a - b;
  else if constexpr (OP == 2)
    return a * b;
  else
    return a / b;
}

inline void stream_store(float* p, vf v) {  // p is sizeof(vf)-aligned
#if KAEL_VBYTES == 64 && defined(__AVX512F__)
  _mm512_stream_ps(p, bitcast<__m512>(v));
#elif KAEL_VBYTES == 32 && defined(__AVX__)
  _mm256_stream_ps(p, bitcast<__m256>(v));
#elif KAEL_VBYTES == 16 && defined(__SSE2__)
  _mm_stream_ps(p, bitcast<__m128>(v));
#else
  store(p, v);
#endif
}

template <int OP>
void arith_loop(float* out, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) {
  constexpr int64_t L = V<float>::L;
  int64_t i = 0;
  const bool stream = n * 4 >= kStreamBytes;
  if (stream) {  // scalar head up to a vector-aligned output
    for (; i < n && (reinterpret_cast<uintptr_t>(out + i) % sizeof(vf)) != 0; ++i) {
      out[i] = arith<OP>(splat(a[i * sa]), splat(b[i * sb]))[0];
    }
  }
  const vf a0 = splat(a[0]), b0 = splat(b[0]);
  for (; i + L <= n; i += L) {
    const vf x = sa ? load(a + i) : a0;
    const vf y = sb ? load(b + i) : b0;
    if (stream) {
      stream_store(out + i, arith<OP>(x, y));
    } else {
      store(out + i, arith<OP>(x, y));
    }
  }
  for (; i < n; ++i) out[i] = arith<OP>(splat(a[i * sa]), splat(b[i * sb]))[0];
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
}

void arith_f32(int op, float* out, const float* a, int64_t sa, const float* b, int64_t sb, int64_t n) {
  switch (op) {
    case 0:
      arith_loop<0>(out, a, sa, b, sb, n);
      break;
    case 1:
      arith_loop<1>(out, a, sa, b, sb, n);
      break;
    case 2:
      arith_loop<2>(out, a, sa, b, sb, n);
      break;
    default:
      arith_loop<3>(out, a, sa, b, sb, n);
      break;
  }
}
