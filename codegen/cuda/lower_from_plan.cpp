// Pass 0: the plan and the model's shape -> an abstract partial-attention kernel.
#include <cmath>
#include <string>

#include "codegen/cuda/passes.h"
#include "core/error.h"
#include "dsl/kernel_knobs.h"

namespace rattn::cuda {

namespace {

[[noreturn]] void knob_error(const std::string& msg) {
  fail(Status::invalid_argument, "cuda codegen: error: " + msg);
}

int knob_int(const std::string& key, double v) {
  if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 1e9)
    knob_error("knob '" + key + "' must be an integer (got " + std::to_string(v) + ")");
  return int(v);
}

}  // namespace

KernelModule lower_from_params(const DecodeAttentionParams& params) {
  KernelModule m;
  m.params = params;
  KernelDef k;
  k.role = KernelRole::partial;
  k.grid_x = "1";
  k.grid_y = "num_kv_heads";
  k.body = Stmt::seq({
      Stmt::make_op(OpKind::load_queries),
      Stmt::make_op(OpKind::init_state),
      Stmt::loop("tile", "num_tiles", LoopKind::serial,
                 {Stmt::make_op(OpKind::scores), Stmt::make_op(OpKind::online_softmax),
                  Stmt::make_op(OpKind::accumulate_values)}),
      Stmt::make_op(OpKind::store_final),
  });
  m.kernels.push_back(std::move(k));
  m.passes_run.push_back("lower_from_plan");
  return m;
}

KernelModule lower_from_plan(const ModelLayout& model, const ConcretePlan& plan,
                             const LowerOptions& options) {
  DecodeAttentionParams p;
  p.head_dim = model.head_dim;
  // group_size() is 0 for a layout without KV heads; q % kv != 0 is no GQA either.
  p.group_size = (model.num_kv_heads > 0 && model.num_q_heads % model.num_kv_heads == 0)
                     ? model.group_size()
                     : 0;
  p.kv_dtype = model.kv_dtype;
  p.layout = options.layout;
  p.page_size = options.page_size;
  p.arch = options.arch;
  for (const auto& [key, value] : plan.kernel) {
    if (key.rfind("cuda.", 0) != 0) continue;  // another generator's knob
    if (key == "cuda.tile") p.tile = knob_int(key, value);
    else if (key == "cuda.warps") p.warps = knob_int(key, value);
    else if (key == "cuda.splits") p.splits = knob_int(key, value);
    else if (key == "cuda.vec") p.vec = knob_int(key, value);
    else if (key == "cuda.stages") p.stages = knob_int(key, value);
    else if (key == "cuda.page") p.page_size = knob_int(key, value);
    else
      knob_error("unknown knob '" + key + "' (known: " + kernel_knob_names("cuda.") + ")");
  }
  return lower_from_params(p);
}

}  // namespace rattn::cuda
