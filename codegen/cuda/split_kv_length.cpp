// Pass 4: flash-decoding. Split s of grid.x covers a contiguous, tile-aligned
// range of the static set; with splits > 1 each writes (o_s, lse_s) to a
// workspace and a merge kernel combines them by natural-log log-sum-exp.
#include <string>

#include "codegen/cuda/passes.h"

namespace rattn::cuda {

KernelModule split_kv_length(KernelModule m) {
  const int splits = m.params.splits;
  KernelDef* k = find_kernel(m, KernelRole::partial);
  k->grid_x = std::to_string(splits);
  for (auto& s : k->body.body)
    if (s.kind == Stmt::Kind::loop && s.var == "tile") s.extent = "num_tiles(split)";
  if (splits > 1) {
    for (auto& s : k->body.body)
      if (s.kind == Stmt::Kind::op && s.op == OpKind::store_final) s.op = OpKind::store_partial;
    KernelDef merge;
    merge.role = KernelRole::merge;
    merge.grid_x = "1";
    merge.grid_y = "num_kv_heads";
    merge.block_threads = 128;
    merge.body = Stmt::seq({Stmt::loop(
        "i", "group*head_dim", LoopKind::threads,
        {Stmt::make_op(OpKind::merge_splits, {{"splits", std::to_string(splits)}, {"log", "natural"}})})});
    m.kernels.push_back(std::move(merge));
  }
  m.passes_run.push_back("split_kv_length");
  return m;
}

}  // namespace rattn::cuda
