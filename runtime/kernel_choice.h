#pragma once
// The one place that picks the CPU kernel implementation the runtime uses.
#include <memory>
#include <string>

#include "runtime/cpu_kernels.h"

namespace rattn {

// The fastest implementation built in for `spec`; its name goes to *name.
std::shared_ptr<CpuKernels> make_cpu_kernels(const KernelSpec& spec, std::string* name);

}  // namespace rattn
