// The pass list, Halide Lower.cpp style: one line per pass.
#include "codegen/cuda/lower.h"

namespace rattn::cuda {

KernelModule lower_decode_attention(KernelModule m, const PassObserver& after_pass) {
  auto note = [&](const char* pass) {
    if (after_pass) after_pass(pass, m);
  };
  note("lower_from_plan");
  m = check_specialisation(std::move(m));
  note("check_specialisation");
  m = map_threads(std::move(m));
  note("map_threads");
  m = pipeline_kv_tiles(std::move(m));
  note("pipeline_kv_tiles");
  m = split_kv_length(std::move(m));
  note("split_kv_length");
  m = plan_shared_memory(std::move(m));
  note("plan_shared_memory");
  m = name_kernels(std::move(m));
  note("name_kernels");
  return m;
}

KernelModule lower_decode_attention(const ModelLayout& model, const ConcretePlan& plan,
                                    const LowerOptions& options, const PassObserver& after_pass) {
  return lower_decode_attention(lower_from_plan(model, plan, options), after_pass);
}

KernelModule lower_decode_attention(const DecodeAttentionParams& params,
                                    const PassObserver& after_pass) {
  return lower_decode_attention(lower_from_params(params), after_pass);
}

}  // namespace rattn::cuda
