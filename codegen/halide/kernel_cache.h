#pragma once
// Internal: compiled kernels, cached in memory and on disk. No Halide.h.
#include <memory>
#include <string>
#include <vector>

#include "codegen/halide/halide_kernels.h"
#include "core/embedded_abi.h"

namespace rattn::internal {

// Halide's generic entry point `NAME_argv(void** args)`; returns 0 on success.
using KernelEntry = int (*)(void**);

// LoadedKernel::path of a kernel from the embedded set: this prefix + its label.
inline constexpr const char* kEmbeddedPathPrefix = "embedded:";

struct LoadedKernel {
  std::string name;  // symbol / kernel name
  std::string path;  // the shared object it came from
  KernelEntry entry = nullptr;
};

// "<kernel name>-<16 hex digits>": the hash covers the Halide version, the
// host target, the pipeline version and the name (i.e. every specialisation).
std::string kernel_file_key(const HalideKernelConfig& c);

// The kernel for `c`: from memory, else from <cache dir>/<key>.so, else
// compiled, linked, written atomically and loaded. Thread-safe; concurrent
// processes may build the same file, each rename replaces it whole.
std::shared_ptr<const LoadedKernel> get_kernel(const HalideKernelConfig& c);

// get_kernel for several configs, building missing ones on up to one thread
// per core.
std::vector<std::shared_ptr<const LoadedKernel>> get_kernels(const std::vector<HalideKernelConfig>& configs);

void check_spec(const KernelSpec& spec);

// Embedded kernel sets (a deployable library; embedded_kernels.cpp).
struct EmbeddedChoice {
  const embedded::KernelSet* set = nullptr;  // nullptr: none runs (or none wanted)
  std::string warning;                       // why the best set was passed over, "" if it was not
};
// The features of Halide target `target` that `host` (Halide's host target
// string) lacks; "architecture ..." when arch, bits or OS differ. Empty: it runs.
std::vector<std::string> missing_target_features(const std::string& target, const std::string& host);
// Picks among `sets` (best first) for a CPU described by `host_target`.
// preference: "auto" or "host" (the first set that runs), "baseline" (only the
// set labelled so), "jit" (none).
EmbeddedChoice choose_embedded_set(const embedded::KernelSet* sets, int n, const std::string& host_target,
                                   const std::string& preference);
// The set this process uses: chosen once from the payload and
// $RATTN_CPU_KERNELS (default auto), warnings to the log. nullptr if none.
const embedded::KernelSet* embedded_kernel_set();
// The kernel named `name` in that set, or nullptr.
const embedded::Kernel* find_embedded_kernel(const std::string& name);
// What vector_width 0 resolves to: the embedded set's natural width, else the host's.
int default_vector_width();

// Removes what killed builds left in the cache directory `dir`: scratch
// directories (.tmp-<pid>-*) and temporary files (*.tmp.<pid>.*) older than
// 10 minutes whose process is gone (or older than a day). Returns how many.
// Done once per process and directory when the cache is first opened.
int remove_stale_scratch(const std::string& dir);

}  // namespace rattn::internal
