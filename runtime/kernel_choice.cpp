#include "runtime/kernel_choice.h"

#include "codegen/halide/halide_kernels.h"
#include "core/error.h"
#include "core/log.h"

namespace rattn {

KernelChoice choose_cpu_kernels(const KernelSpec& spec, KernelPreference preference,
                                const ConcretePlan& plan) {
  KernelChoice c;
  // The index keeps its own vectorised inner products for the graph search:
  // they read the store directly with no per-call dispatch.
  c.index_distances = nullptr;
  if (preference != KernelPreference::reference) {
    try {
      c.attention = std::shared_ptr<CpuKernels>(make_halide_kernels(spec, HalideSchedule::from_plan(plan)));
      c.name = "halide";
      return c;
    } catch (const std::exception& e) {
      if (preference == KernelPreference::halide)
        fail(Status::unsupported, std::string("Halide kernels unavailable: ") + e.what());
      log_message(LogLevel::warn, std::string("Halide kernels unavailable, using the reference loops: ") + e.what());
    }
  }
  c.attention = std::shared_ptr<CpuKernels>(make_reference_kernels(spec));
  c.name = "reference";
  return c;
}

}  // namespace rattn
