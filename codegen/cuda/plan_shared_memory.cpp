// Pass 5: dynamic shared memory layout. The K/V tile buffers are dead once the
// tile loop ends, so the warp-merge scratch reuses their bytes.
#include <algorithm>
#include <string>

#include "codegen/cuda/passes.h"
#include "core/error.h"

namespace rattn::cuda {

KernelModule plan_shared_memory(KernelModule m) {
  const auto& p = m.params;
  KernelDef* k = find_kernel(m, KernelRole::partial);
  const int64_t tile_elems = int64_t(p.stages) * p.tile * p.head_dim;
  const int64_t kv_bytes = tile_elems * 2;  // f16 / bf16
  k->shared.clear();
  k->shared.push_back({"k_tiles", "unsigned short", tile_elems, 0});
  k->shared.push_back({"v_tiles", "unsigned short", tile_elems, kv_bytes});
  // The warp merge: every warp's state for the heads this block computes.
  const int64_t state = int64_t(p.warps) * m.mapping.heads_per_block;
  k->shared.push_back({"warp_max", "float", state, 0});
  k->shared.push_back({"warp_sum", "float", state, state * 4});
  k->shared.push_back({"warp_acc", "float", state * p.head_dim, state * 8});
  k->shared_bytes = std::max(2 * kv_bytes, (2 * state + state * p.head_dim) * 4);
  const int64_t limit = arch_shared_memory_limit(p.arch);
  if (k->shared_bytes > limit)
    fail(Status::invalid_argument,
         "cuda codegen: error: the partial kernel needs " + std::to_string(k->shared_bytes) +
             " bytes of shared memory but " + p.arch + " allows " + std::to_string(limit) +
             " per block; lower cuda.tile, cuda.stages or cuda.warps");
  m.passes_run.push_back("plan_shared_memory");
  return m;
}

}  // namespace rattn::cuda
