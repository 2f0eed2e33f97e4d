#include "codegen/cuda/model_kernels.h"

#include <future>

#include "codegen/cuda/print_cuda.h"

namespace rattn::cuda {

std::vector<GeneratedModule> generate_model_kernels(const Program& program, const ConcretePlan& plan,
                                                    const std::string& arch, int page_size,
                                                    const PassObserver& observer,
                                                    std::vector<KvLayout> layouts) {
  std::vector<GeneratedModule> out;
  for (KvLayout layout : layouts) {
    LowerOptions o;
    o.layout = layout;
    o.arch = arch;
    o.page_size = page_size;
    GeneratedModule g;
    g.module = lower_decode_attention(program.model, plan, o, observer);
    g.source = print_cuda(g.module);
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<CompiledModule> compile_modules(KernelCache& cache, const std::vector<GeneratedModule>& modules,
                                            const CompileOptions& options) {
  std::vector<std::future<CompiledModule>> jobs;
  for (const auto& g : modules)
    jobs.push_back(std::async(std::launch::async, [&cache, &g, &options] {
      return cache.get_or_compile(g.module.name, g.source, options);
    }));
  std::vector<CompiledModule> out;
  for (auto& j : jobs) out.push_back(j.get());  // rethrows a job's error
  return out;
}

GeneratedModule generate_module(const DecodeAttentionParams& params) {
  GeneratedModule g;
  g.module = lower_decode_attention(params);
  g.source = print_cuda(g.module);
  return g;
}

}  // namespace rattn::cuda
