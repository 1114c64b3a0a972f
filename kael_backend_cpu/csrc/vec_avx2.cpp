// The AVX2 + FMA vector table; this file alone is compiled with -mavx2 -mfma.
#include <algorithm>
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

#if defined(KAEL_HAVE_AVX2_TU)
#define KAEL_VBYTES 32
#define KAEL_MR_F 6
#define KAEL_NV_F 2
#define KAEL_MC_F 144
#define KAEL_MR_D 6
#define KAEL_NV_D 2
#define KAEL_MC_D 72

namespace kael {
namespace vec_avx2 {
#include "vec_table.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace vec_avx2

const VecTable* vec_avx2_table() {
  static const VecTable t = vec_avx2::make_table("avx2");
  return &t;
}

}  // namespace kael
#else
namespace kael {
const VecTable* vec_avx2_table() {
  return nullptr;
}
}  // namespace kael
#endif
