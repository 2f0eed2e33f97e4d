#pragma once
// The lowering passes of the CUDA generator. Each is a free function
// KernelModule -> KernelModule defined in its own .cpp (named after it);
// lower.cpp runs them in order. Diagnostics throw rattn::Error whose message
// starts with "cuda codegen: error:".
#include <string>

#include "codegen/cuda/kernel_ir.h"
#include "dsl/ir.h"

namespace rattn::cuda {

// Choices that are not in the plan: the KV layout and the GPU arch.
struct LowerOptions {
  KvLayout layout = KvLayout::contiguous;
  int page_size = 16;
  std::string arch = "sm_90";
};

// Pass 0 (lower_from_plan.cpp): model + plan knobs -> one abstract partial
// kernel: load queries, loop over tiles of the static set, store (o, lse).
KernelModule lower_from_plan(const ModelLayout& model, const ConcretePlan& plan,
                             const LowerOptions& options);
// Same, from parameters given directly (tests, the tuner).
KernelModule lower_from_params(const DecodeAttentionParams& params);

// The largest GQA group (query heads per KV head), as the CPU kernels.
inline constexpr int kMaxGroupSize = 64;
// The most query heads one block computes (their queries and accumulators
// live in registers); a larger group is split over grid.z.
inline constexpr int kMaxHeadsPerBlock = 8;

// Pass 1 (check_specialisation.cpp): head dim, group size, dtype, arch and knob
// ranges; throws with the offending value and what was expected.
KernelModule check_specialisation(KernelModule m);
// Pass 2 (map_threads.cpp): lanes per token, token slots per warp, tokens per
// tile per lane group; adds the unrolled per-slot loop and the slot/warp merges.
KernelModule map_threads(KernelModule m);
// The mapping map_threads gives a specialisation (not checked), and the
// query heads per block for a group: the largest divisor of the group up to
// kMaxHeadsPerBlock.
ThreadMapping thread_mapping(const DecodeAttentionParams& p);
int heads_per_block(int group_size);
// Pass 3 (pipeline_kv_tiles.cpp): shared-memory staging of K/V tiles with
// `stages` buffers (cp.async groups on sm_80+), barriers around each tile.
KernelModule pipeline_kv_tiles(KernelModule m);
// Pass 4 (split_kv_length.cpp): flash-decoding; grid.x = splits, partial
// results to a workspace, plus the merge kernel (natural-log log-sum-exp).
KernelModule split_kv_length(KernelModule m);
// Pass 5 (plan_shared_memory.cpp): lays out the dynamic shared memory (tile
// buffers and the warp-merge scratch share bytes) and checks the arch limit.
KernelModule plan_shared_memory(KernelModule m);
// Pass 6 (name_kernels.cpp): the deterministic URI and the kernel symbols.
KernelModule name_kernels(KernelModule m);

// The URI of a specialisation, e.g.
// rattn_decode_hd128_g4_f16_contig_t32_w4_s4_v8_st2_sm90.
std::string module_uri(const DecodeAttentionParams& p);

// Largest dynamic shared memory per block (bytes) the arch allows with opt-in;
// 0 for an unknown arch.
int64_t arch_shared_memory_limit(const std::string& arch);
// The archs the generator accepts ("sm_75" ... "sm_120").
const std::vector<std::string>& supported_archs();

}  // namespace rattn::cuda
