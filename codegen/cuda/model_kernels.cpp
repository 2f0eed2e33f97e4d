#include "codegen/cuda/model_kernels.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>

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
                                            const CompileOptions& options, int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, int(modules.size()));
  std::vector<CompiledModule> out(modules.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < modules.size();)
      out[i] = cache.get_or_compile(modules[i].module.name, modules[i].source, options);
  };
  std::vector<std::future<void>> jobs;
  for (int t = 0; t < threads; ++t) jobs.push_back(std::async(std::launch::async, worker));
  for (auto& j : jobs) j.get();  // rethrows a worker's error
  return out;
}

GeneratedModule generate_module(const DecodeAttentionParams& params) {
  GeneratedModule g;
  g.module = lower_decode_attention(params);
  g.source = print_cuda(g.module);
  return g;
}

}  // namespace rattn::cuda
