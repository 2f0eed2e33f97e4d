// Pass 2: how the threads of a block cover a tile of tokens.
//
// A token's row of head_dim elements is read by `lanes_per_token` lanes, each
// holding chunks of `vec` elements (coalesced: chunk c of lane l starts at
// (c * lanes_per_token + l) * vec). A warp therefore works on 32 /
// lanes_per_token tokens at once ("slots"), a block on warps * slots tokens,
// and each lane group walks tile / (warps * slots) tokens of every tile. Each
// lane group keeps its own running (max, sum, acc) for every query head the
// block computes; merge_slots and merge_warps combine them at the end.
//
// A block computes at most kMaxHeadsPerBlock query heads of the GQA group:
// each lane holds a query and an accumulator slice per head, and more heads
// spill registers. A larger group is split over grid.z into equal blocks of
// the largest divisor of the group not above that, each reading the same
// K/V rows (from L2 after the first).
#include <algorithm>
#include <string>

#include "codegen/cuda/passes.h"
#include "core/error.h"

namespace rattn::cuda {

int heads_per_block(int group_size) {
  int h = std::min(group_size, kMaxHeadsPerBlock);
  while (h > 1 && group_size % h != 0) --h;
  return std::max(h, 1);
}

ThreadMapping thread_mapping(const DecodeAttentionParams& p) {
  ThreadMapping t;
  t.block_threads = p.warps * 32;
  t.lanes_per_token = std::min(32, p.head_dim / p.vec);
  t.chunks_per_lane = p.head_dim / (t.lanes_per_token * p.vec);
  t.slots_per_warp = 32 / t.lanes_per_token;
  t.tokens_per_pass = p.warps * t.slots_per_warp;
  t.tokens_per_slot = p.tile / t.tokens_per_pass;
  t.heads_per_block = heads_per_block(p.group_size);
  t.group_blocks = p.group_size / t.heads_per_block;
  return t;
}

KernelModule map_threads(KernelModule m) {
  const auto& p = m.params;
  ThreadMapping t = thread_mapping(p);
  if (p.tile % t.tokens_per_pass != 0)
    fail(Status::invalid_argument,
         "cuda codegen: error: cuda.tile=" + std::to_string(p.tile) +
             " must be a multiple of the tokens a block reads at once (" +
             std::to_string(t.tokens_per_pass) + " = cuda.warps " + std::to_string(p.warps) +
             " x 32 / (head_dim " + std::to_string(p.head_dim) + " / cuda.vec " +
             std::to_string(p.vec) + ")); raise cuda.tile or lower cuda.warps");
  if (t.tokens_per_slot * t.heads_per_block > 256)
    fail(Status::invalid_argument,
         "cuda codegen: error: cuda.tile=" + std::to_string(p.tile) + " gives " +
             std::to_string(t.tokens_per_slot) + " tokens per lane group x " +
             (t.group_blocks == 1 ? "group size " + std::to_string(p.group_size)
                                  : std::to_string(t.heads_per_block) + " query heads per block") +
             " scores in registers (more than 256); lower cuda.tile or raise cuda.warps");
  t.mapped = true;
  m.mapping = t;

  KernelDef* k = find_kernel(m, KernelRole::partial);
  k->block_threads = t.block_threads;
  k->grid_z = std::to_string(t.group_blocks);
  std::vector<Stmt> body;
  for (auto& s : k->body.body) {
    if (s.kind == Stmt::Kind::loop && s.var == "tile") {
      const std::string slots = std::to_string(t.tokens_per_slot);
      s.body = {
          Stmt::loop("j", slots, LoopKind::unrolled,
                     {Stmt::make_op(OpKind::scores,
                                    {{"lanes", std::to_string(t.lanes_per_token)},
                                     {"reduce", "shfl_xor"}})}),
          Stmt::make_op(OpKind::online_softmax),
          Stmt::loop("j", slots, LoopKind::unrolled, {Stmt::make_op(OpKind::accumulate_values)}),
      };
      body.push_back(std::move(s));
      continue;
    }
    if (s.kind == Stmt::Kind::op && s.op == OpKind::store_final) {
      body.push_back(Stmt::make_op(OpKind::merge_slots,
                                   {{"slots", std::to_string(t.slots_per_warp)}}));
      body.push_back(Stmt::make_op(OpKind::barrier));
      body.push_back(Stmt::make_op(OpKind::merge_warps, {{"warps", std::to_string(p.warps)}}));
    }
    body.push_back(std::move(s));
  }
  k->body.body = std::move(body);
  m.passes_run.push_back("map_threads");
  return m;
}

}  // namespace rattn::cuda
