#include "core/cpu_info.h"

#include <fstream>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace rattn {

std::string cpu_info_field(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.find_first_not_of(" \t", name.size()) != colon) continue;
    return colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return "";
}

std::string cpu_model() {
  const std::string model = cpu_info_field("model name");
  return model.empty() ? "unknown" : model;
}

#if defined(__x86_64__)
bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;  // covers the OS's YMM state
  }();
  return has;
}

bool cpu_has_avx2_fma_f16c() {
  static const bool has = [] {
    // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
    // does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
    return cpu_has_avx2() && __builtin_cpu_supports("fma") && f16c;
  }();
  return has;
}

bool cpu_has_avx512f_bmi2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2");
  }();
  return has;
}
#else
bool cpu_has_avx2() { return false; }
bool cpu_has_avx2_fma_f16c() { return false; }
bool cpu_has_avx512f_bmi2() { return false; }
#endif

}  // namespace rattn
