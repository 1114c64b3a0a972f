// Picks the vector table for this CPU at first use (NOTE [runtime dispatch] in vec.h): the
// CPU's features from CPUID, the register state the OS saves from XGETBV, and KAEL_CPU_ISA.
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "check.h"
#include "vec.h"

namespace kael {
namespace {

#if defined(__x86_64__) || defined(__i386__)
bool bit(unsigned reg, int b) {
  return ((reg >> b) & 1U) != 0;
}

// XCR0: the register state the OS saves (XGETBV without -mxsave, so this file stays baseline).
uint64_t xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// Linux hands a process the AMX tile data state (XTILEDATA, 8 KiB a thread) only once it asks
// (arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16 on); until then a tile instruction faults. Asked once,
// at detection, for the whole process; false where the kernel refuses or is not Linux.
bool os_grants_amx() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  const unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1 || __get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool osxsave = bit(c, 27);
  f.fma = bit(c, 12);
  f.avx = bit(c, 28);
  f.f16c = bit(c, 29);
  uint64_t xcr0 = 0;
  if (osxsave) {
    xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6U) == 0x6U;       // XMM and YMM state
    f.os_avx512 = (xcr0 & 0xE6U) == 0xE6U;  // and opmask, ZMM0-15 upper halves, ZMM16-31
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned max_sub = a;
    f.avx2 = bit(b, 5);
    f.avx512f = bit(b, 16);
    f.avx512dq = bit(b, 17);
    f.avx512bw = bit(b, 30);
    f.avx512vl = bit(b, 31);
    f.avx512_vnni = bit(c, 11);
    f.amx_bf16 = bit(d, 22) && bit(d, 24);  // AMX-BF16 and AMX-TILE
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512_bf16 = bit(a, 5);
    }
  }
  // TILECFG and TILEDATA in XCR0, and this process's permission to use them
  f.os_amx = f.amx_bf16 && (xcr0 & 0x60000U) == 0x60000U && os_grants_amx();
  return f;
}
#else
CpuFeatures detect() {
  return CpuFeatures{};
}
#endif

bool has_feature(const std::string& name) {
  for (const auto& [n, on] : cpu_feature_list()) {
    if (n == name) return on;
  }
  return false;
}

std::string canonical(const std::string& name) {
  return name == "base" ? "baseline" : name;
}

bool known(const std::string& name) {
  return name == "baseline" || name == "avx2" || name == "avx512";
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// KAEL_CPU_DISABLE=name[,name...]: features to treat as absent (cpu_feature_list names), so
// one machine can run as a CPU without them would; "" when every name is known, else the message.
std::string apply_disable(CpuFeatures& f) {
  const char* env = std::getenv("KAEL_CPU_DISABLE");
  if (env == nullptr) return {};
  bool* fields[] = {&f.avx,      &f.avx2,        &f.fma,         &f.f16c,     &f.avx512f, &f.avx512bw,  &f.avx512vl,
                    &f.avx512dq, &f.avx512_vnni, &f.avx512_bf16, &f.amx_bf16, &f.os_avx,  &f.os_avx512, &f.os_amx};
  const char* names[] = {"avx",      "avx2",        "fma",         "f16c",     "avx512f", "avx512bw",  "avx512vl",
                         "avx512dq", "avx512_vnni", "avx512_bf16", "amx_bf16", "os_avx",  "os_avx512", "os_amx"};
  const std::string list = env;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string name = list.substr(start, end - start);
    start = end + 1;
    if (name.empty()) continue;
    bool found = false;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
      if (name == names[i]) {
        *fields[i] = false;
        found = true;
      }
    }
    if (!found) {
      std::string all;
      for (const char* n : names) all += (all.empty() ? "" : ", ") + std::string(n);
      std::string msg = "KAEL_CPU_DISABLE='";
      msg += list;
      msg += "': unknown CPU feature '";
      msg += name;
      msg += "'; expected a comma-separated list of ";
      msg += all;
      return msg;
    }
  }
  return {};
}

struct Detected {
  CpuFeatures features;
  std::string disable_error;
};

const Detected& detected() {
  static const Detected d = [] {
    Detected r;
    r.features = detect();
    r.disable_error = apply_disable(r.features);
    return r;
  }();
  return d;
}

const VecTable& choose() {
  KAEL_CHECK(detected().disable_error.empty(), Backend, detected().disable_error);
  const char* env = std::getenv("KAEL_CPU_ISA");
  if (env == nullptr || *env == '\0') {
    for (const auto& name : vec_tables_runnable()) {
      if (const VecTable* t = vec_table_named(name)) return *t;
    }
    return vec_base_table();
  }
  const std::string want = env;
  KAEL_CHECK(known(canonical(want)), Backend, "KAEL_CPU_ISA=", '\'', want, '\'',
             ": unknown vector table; expected baseline (or base), avx2 or avx512, or unset for the widest this CPU "
             "runs (",
             joined(vec_tables_runnable()), ")");
  const std::string missing = vec_table_missing(canonical(want));
  KAEL_CHECK(missing.empty(), Backend, "KAEL_CPU_ISA=", '\'', want, '\'', ": this CPU cannot run the ", canonical(want),
             " table (", missing, "); the tables it runs: ", joined(vec_tables_runnable()));
  return *vec_table_named(canonical(want));
}

}  // namespace

const CpuFeatures& cpu_features() {
  return detected().features;
}

std::vector<std::pair<std::string, bool>> cpu_feature_list() {
  const CpuFeatures& f = cpu_features();
  return {{"avx", f.avx},
          {"avx2", f.avx2},
          {"fma", f.fma},
          {"f16c", f.f16c},
          {"avx512f", f.avx512f},
          {"avx512bw", f.avx512bw},
          {"avx512vl", f.avx512vl},
          {"avx512dq", f.avx512dq},
          {"avx512_vnni", f.avx512_vnni},
          {"avx512_bf16", f.avx512_bf16},
          {"amx_bf16", f.amx_bf16},
          {"os_avx", f.os_avx},
          {"os_avx512", f.os_avx512},
          {"os_amx", f.os_amx}};
}

std::vector<std::string> vec_tables_compiled() {
  std::vector<std::string> names;
  if (vec_avx512_table() != nullptr) names.emplace_back("avx512");
  if (vec_avx2_table() != nullptr) names.emplace_back("avx2");
  names.emplace_back("baseline");
  return names;
}

std::vector<std::string> vec_table_requires(const std::string& name) {
  // What each translation unit is compiled with (CMakeLists.txt), and the OS state its registers need.
  if (name == "avx2") return {"avx", "avx2", "fma", "f16c", "os_avx"};
  if (name == "avx512")
    return {"avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "os_avx", "os_avx512"};
  return {};
}

std::string vec_table_missing(const std::string& name) {
  const std::string n = canonical(name);
  if (!known(n)) return "unknown table";
  if (vec_table_named(n) == nullptr) return "not compiled into this build";
  std::vector<std::string> lacking;
  for (const auto& need : vec_table_requires(n)) {
    if (!has_feature(need)) lacking.push_back(need);
  }
  return lacking.empty() ? std::string() : "lacks " + joined(lacking);
}

std::vector<std::string> vec_tables_runnable() {
  std::vector<std::string> names;
  for (const auto& n : vec_tables_compiled()) {
    if (vec_table_missing(n).empty()) names.push_back(n);
  }
  return names;
}

const VecTable* vec_table_named(const std::string& name) {
  const std::string n = canonical(name);
  if (n == "baseline") return &vec_base_table();
  if (n == "avx2") return vec_avx2_table();
  if (n == "avx512") return vec_avx512_table();
  return nullptr;
}

const VecTable& vec() {
  static const VecTable& t = choose();  // a throw leaves it unset: the next call tries (and throws) again
  return t;
}

}  // namespace kael
