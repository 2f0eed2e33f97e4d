#pragma once
// What /proc/cpuinfo says of the first CPU, for reports and fingerprints.
#include <string>

namespace rattn {

// Its "model name" field, or "unknown".
std::string cpu_model();
// Its named field (e.g. "flags"), or "" when absent.
std::string cpu_info_field(const std::string& name);

}  // namespace rattn
