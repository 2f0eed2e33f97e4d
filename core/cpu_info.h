#pragma once
// What /proc/cpuinfo says of the first CPU, for reports and fingerprints.
#include <string>

namespace rattn {

// Its "model name" field, or "unknown".
std::string cpu_model();
// Its named field (e.g. "flags"), or "" when absent.
std::string cpu_info_field(const std::string& name);

// Instruction sets this CPU and OS run (checked once; false off x86-64), for
// the kernels that dispatch on them.
bool cpu_has_avx2();
bool cpu_has_avx2_fma_f16c();  // the index's row kernels (fp16 rows widened by F16C)
bool cpu_has_avx512f_bmi2();   // the top-k selection's compress-store partitions

}  // namespace rattn
