#include "codegen/cuda/model_kernels.h"

#include "codegen/cuda/print_cuda.h"

namespace rattn::cuda {

std::vector<GeneratedModule> generate_model_kernels(const Program& program, const ConcretePlan& plan,
                                                    const std::string& arch, int page_size,
                                                    const PassObserver& observer) {
  std::vector<GeneratedModule> out;
  for (KvLayout layout : {KvLayout::contiguous, KvLayout::paged}) {
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

GeneratedModule generate_module(const DecodeAttentionParams& params) {
  GeneratedModule g;
  g.module = lower_decode_attention(params);
  g.source = print_cuda(g.module);
  return g;
}

}  // namespace rattn::cuda
