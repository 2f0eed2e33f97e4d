// Pass 3: K/V tiles go through shared memory. With stages > 1 the copy of tile
// i + stages - 1 is issued (cp.async on sm_80+) before tile i is computed.
#include <string>

#include "codegen/cuda/passes.h"

namespace rattn::cuda {

KernelModule pipeline_kv_tiles(KernelModule m) {
  const int stages = m.params.stages;
  KernelDef* k = find_kernel(m, KernelRole::partial);
  std::vector<Stmt> body;
  for (auto& s : k->body.body) {
    if (s.kind == Stmt::Kind::loop && s.var == "tile") {
      std::vector<Stmt> inner;
      if (stages > 1) {
        body.push_back(Stmt::make_op(OpKind::stage_prologue, {{"stages", std::to_string(stages)}}));
        inner.push_back(Stmt::make_op(OpKind::stage_issue, {{"ahead", std::to_string(stages - 1)}}));
        inner.push_back(Stmt::make_op(OpKind::stage_wait, {{"pending", std::to_string(stages - 1)}}));
      } else {
        inner.push_back(Stmt::make_op(OpKind::stage_tile));
      }
      inner.push_back(Stmt::make_op(OpKind::barrier));
      for (auto& c : s.body) inner.push_back(std::move(c));
      inner.push_back(Stmt::make_op(OpKind::barrier, {{"why", "buffer reuse"}}));
      s.body = std::move(inner);
    }
    body.push_back(std::move(s));
  }
  k->body.body = std::move(body);
  m.passes_run.push_back("pipeline_kv_tiles");
  return m;
}

}  // namespace rattn::cuda
