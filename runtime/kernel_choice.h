#pragma once
// The one place that picks the CPU kernel implementation the runtime uses.
#include <memory>
#include <string>

#include "dsl/ir.h"
#include "kernels/cpu_kernels.h"

namespace rattn {

enum class KernelPreference : int {
  automatic = 0,  // Halide-generated kernels, else the reference loops
  reference = 1,  // plain scalar loops (no JIT compile: fast start, slow steps)
  halide = 2,     // Halide-generated kernels or an error
};

struct KernelChoice {
  std::shared_ptr<CpuKernels> attention;        // static-set and retrieved-set attention
  std::shared_ptr<CpuKernels> index_distances;  // graph-search inner products; null = the index's own
  std::string name;
};

// Kernels for `spec`; the plan's "halide.*" kernel keys set the Halide schedule.
KernelChoice choose_cpu_kernels(const KernelSpec& spec, KernelPreference preference,
                                const ConcretePlan& plan);

}  // namespace rattn
