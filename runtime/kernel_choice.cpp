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
      std::shared_ptr<HalideKernels> k = make_halide_kernel_set(spec, HalideSchedule::from_plan(plan));
      // "halide embedded:<set> (<target>)" when a deployable library's own
      // ahead-of-time kernels serve every call.
      c.name = k->embedded() ? "halide embedded:" + embedded_kernel_set_name() : "halide";
      c.attention = std::move(k);
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
