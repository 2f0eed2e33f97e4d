#include "runtime/kernel_choice.h"

namespace rattn {

std::shared_ptr<CpuKernels> make_cpu_kernels(const KernelSpec& spec, std::string* name) {
  // Reference loops until the Halide kernels (codegen/halide) are in.
  if (name) *name = "reference";
  return std::shared_ptr<CpuKernels>(make_reference_kernels(spec));
}

}  // namespace rattn
