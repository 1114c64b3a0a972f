// Picks the vector table for this CPU at first use (NOTE [runtime dispatch] in vec.h).
#include <cstdlib>
#include <cstring>

#include "vec.h"

namespace kael {
namespace {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const VecTable& choose() {
  const char* want = std::getenv("KAEL_CPU_ISA");
  const bool force_base = want != nullptr && std::strcmp(want, "base") == 0;
  const VecTable* avx2 = vec_avx2_table();
  if (!force_base && avx2 != nullptr && cpu_has_avx2_fma()) return *avx2;
  return vec_base_table();
}

}  // namespace

const VecTable& vec() {
  static const VecTable& t = choose();
  return t;
}

}  // namespace kael
