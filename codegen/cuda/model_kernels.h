#pragma once
// The kernels one model needs: its decode-attention module for contiguous and
// for paged KV, with the plan's chosen (or default) cuda.* knobs.
#include <string>
#include <vector>

#include "codegen/cuda/lower.h"
#include "codegen/cuda/nvrtc_compiler.h"
#include "dsl/ir.h"

namespace rattn::cuda {

struct GeneratedModule {
  KernelModule module;
  std::string source;  // print_cuda(module)
};

// Lowers and prints the model's modules for `arch`. `observer` sees the IR
// after every pass of every module.
std::vector<GeneratedModule> generate_model_kernels(const Program& program, const ConcretePlan& plan,
                                                    const std::string& arch, int page_size,
                                                    const PassObserver& observer = {},
                                                    std::vector<KvLayout> layouts = {KvLayout::contiguous,
                                                                                     KvLayout::paged});

// Compiles (or loads from `cache`) every module on up to `threads` threads
// (0 = one per hardware thread). NVRTC is thread-safe; the cache's flock
// serialises equal entries. Results are in the order of `modules`.
std::vector<CompiledModule> compile_modules(KernelCache& cache, const std::vector<GeneratedModule>& modules,
                                            const CompileOptions& options, int threads = 0);

// Lowers + prints one specialisation.
GeneratedModule generate_module(const DecodeAttentionParams& params);

}  // namespace rattn::cuda
