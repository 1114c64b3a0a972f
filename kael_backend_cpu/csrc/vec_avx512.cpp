// The AVX-512 vector table (64-byte vectors, 32 vector registers); this file alone is
// compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c, and
// vec_select.cpp only picks it when the CPU has those and the OS saves the ZMM state.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "vec.h"

#if defined(KAEL_HAVE_AVX512_TU)
#define KAEL_VBYTES 64
// GEMM micro-tile: 12 rows x 2 vectors (12 x 32 floats, 6 x 16 doubles) keeps 24 (12)
// accumulators, two B vectors and the broadcast in the 32 ZMM registers; a 256-deep
// B micro-panel (32 KiB for floats) stays in L1 while the A block (MC x 256) sits in L2.
#define KAEL_MR_F 12
#define KAEL_NV_F 2
#define KAEL_MC_F 144
#define KAEL_KC_F 256
#define KAEL_NC_F 4096
#define KAEL_MR_D 6
#define KAEL_NV_D 2
#define KAEL_MC_D 72
#define KAEL_KC_D 256
#define KAEL_NC_D 4096

namespace kael {
namespace vec_avx512 {
#include "vec_table.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace vec_avx512

const VecTable* vec_avx512_table() {
  static const VecTable t = vec_avx512::make_table("avx512");
  return &t;
}

}  // namespace kael
#else
namespace kael {
const VecTable* vec_avx512_table() {
  return nullptr;
}
}  // namespace kael
#endif
