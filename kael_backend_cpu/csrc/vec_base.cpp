// The portable vector table: baseline instructions only (SSE2 on x86-64, NEON on arm64).
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

#define KAEL_VBYTES 16
#define KAEL_MR_F 4
#define KAEL_NV_F 2
#define KAEL_MC_F 128
#define KAEL_MR_D 4
#define KAEL_NV_D 2
#define KAEL_MC_D 64

namespace kael {
namespace vec_base {
#include "vec_table.h"  // NOLINT(bugprone-suspicious-include)
}  // namespace vec_base

const VecTable& vec_base_table() {
  static const VecTable t = vec_base::make_table("baseline");
  return t;
}

}  // namespace kael
