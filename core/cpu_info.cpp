#include "core/cpu_info.h"

#include <fstream>

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

}  // namespace rattn
