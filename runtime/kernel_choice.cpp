#include "runtime/kernel_choice.h"

namespace rattn {

KernelChoice choose_cpu_kernels(const KernelSpec& spec) {
  // Reference loops until the Halide kernels (codegen/halide) are in. The
  // scalar gathered_dot is slower than the index's built-in vectorised inner
  // products, so the index keeps its own.
  KernelChoice c;
  c.attention = std::shared_ptr<CpuKernels>(make_reference_kernels(spec));
  c.index_distances = nullptr;
  c.name = "reference";
  return c;
}

}  // namespace rattn
