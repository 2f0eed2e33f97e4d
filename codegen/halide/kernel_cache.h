#pragma once
// Internal: compiled kernels, cached in memory and on disk. No Halide.h.
#include <memory>
#include <string>
#include <vector>

#include "codegen/halide/halide_kernels.h"

namespace rattn::internal {

// Halide's generic entry point `NAME_argv(void** args)`; returns 0 on success.
using KernelEntry = int (*)(void**);

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

// Removes what killed builds left in the cache directory `dir`: scratch
// directories (.tmp-<pid>-*) and temporary files (*.tmp.<pid>.*) older than
// 10 minutes whose process is gone (or older than a day). Returns how many.
// Done once per process and directory when the cache is first opened.
int remove_stale_scratch(const std::string& dir);

}  // namespace rattn::internal
