#pragma once
// The one place that picks the CPU kernel implementation the runtime uses.
#include <memory>
#include <string>

#include "runtime/cpu_kernels.h"

namespace rattn {

struct KernelChoice {
  std::shared_ptr<CpuKernels> attention;        // static-set and retrieved-set attention
  std::shared_ptr<CpuKernels> index_distances;  // graph-search inner products; null = the index's own
  std::string name;
};

// The fastest implementation built in for `spec`.
KernelChoice choose_cpu_kernels(const KernelSpec& spec);

}  // namespace rattn
