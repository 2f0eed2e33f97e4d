#include "core/memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace rattn {
namespace {

uint64_t meminfo_kib(const std::string& text, const char* key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return 0;
  unsigned long long kib = 0;
  std::sscanf(text.c_str() + at + std::char_traits<char>::length(key), ": %llu", &kib);
  return kib;
}

// memory.max - memory.current of this process's cgroup (v2), or 0 when none is set.
uint64_t cgroup_headroom() {
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), cur_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  unsigned long long current = 0;
  if (!(max_file >> max_text) || max_text == "max" || !(cur_file >> current)) return 0;
  const unsigned long long limit = std::strtoull(max_text.c_str(), nullptr, 10);
  return limit > current ? limit - current : 1;
}

}  // namespace

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  if (!f) return 0;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  uint64_t bytes = (meminfo_kib(text, "MemAvailable") + meminfo_kib(text, "SwapFree")) * 1024;
  if (const uint64_t cg = cgroup_headroom(); cg > 0 && bytes > 0) bytes = std::min(bytes, cg);
  return bytes;
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

void require_memory(uint64_t bytes, const std::string& what) {
  const uint64_t available = available_memory_bytes();
  if (available == 0 || bytes <= available) return;
  fail(Status::out_of_memory, what + " needs " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                                  " bytes); " + format_bytes(available) + " are available");
}

}  // namespace rattn
