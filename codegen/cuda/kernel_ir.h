#pragma once
// The CUDA generator's kernel IR: a module of kernels, each a tree of loops and
// operations over an explicit thread mapping. Lowering starts from the plan
// (lower_from_plan) and every pass rewrites the module (passes.h declares
// them, one .cpp each; lower.h runs them); print_cuda.h turns the final
// module into CUDA C++ text.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace rattn::cuda {

enum class KvLayout { contiguous, paged };
const char* kv_layout_name(KvLayout l);

// Everything a decode-attention kernel module is specialised for. The knobs
// (tile ... stages) come from the plan's `kernel` map ("cuda.tile", ...).
struct DecodeAttentionParams {
  int head_dim = 128;
  int group_size = 1;  // query heads sharing one KV head
  DType kv_dtype = DType::f16;
  KvLayout layout = KvLayout::contiguous;
  int page_size = 16;  // paged layout only: tokens per page
  int tile = 32;       // tokens staged in shared memory per pipeline step
  int warps = 4;       // warps per block
  int splits = 4;      // flash-decoding splits along the KV length (grid.x)
  int vec = 8;         // KV elements per vector load (2, 4 or 8 = 4/8/16 bytes)
  int stages = 2;      // shared-memory pipeline depth (cp.async groups on sm_80+)
  std::string arch = "sm_90";
};

// How threads cover a tile; filled by the map_threads pass.
struct ThreadMapping {
  bool mapped = false;
  int block_threads = 0;
  int lanes_per_token = 0;   // lanes that share one token's dot product
  int chunks_per_lane = 0;   // vec-wide chunks each lane holds of a row
  int slots_per_warp = 0;    // tokens a warp works on at once (32 / lanes_per_token)
  int tokens_per_pass = 0;   // tokens a block works on at once
  int tokens_per_slot = 0;   // tokens each lane group handles per tile (tile / tokens_per_pass)
  int heads_per_block = 0;   // query heads of the group one block computes
  int group_blocks = 0;      // blocks per KV head and split (grid.z): group / heads_per_block
};

// Loop kinds: serial and unrolled loops become `for` loops; block_x/block_y are
// grid dimensions; lane_groups is a loop spread across threads.
enum class LoopKind { serial, unrolled, block_x, block_y, threads };
const char* loop_kind_name(LoopKind k);

enum class OpKind {
  load_queries,        // q of the group into registers, pre-scaled by log2(e)/sqrt(d)
  init_state,          // running max / sum / accumulator per query head
  stage_prologue,      // issue the first stages-1 tile copies
  stage_issue,         // issue the copy of tile + stages - 1 into its buffer
  stage_wait,          // wait for this tile's copy group
  stage_tile,          // synchronous copy of one tile (no pipeline)
  barrier,             // __syncthreads
  scores,              // per-token dot products, lane-group shuffle reduction
  online_softmax,      // rescale running state to the tile's max
  accumulate_values,   // acc += p * v
  merge_slots,         // merge the token slots of a warp (shuffles)
  merge_warps,         // merge the warps through shared memory
  store_final,         // o = acc / sum, lse (natural log) to the output
  store_partial,       // the same into the split workspace
  merge_splits,        // merge kernel: log-sum-exp over splits
};
const char* op_kind_name(OpKind k);

struct Stmt {
  enum class Kind { seq, loop, op };
  Kind kind = Kind::seq;
  // loop
  std::string var;
  std::string extent;  // an expression printed into the CUDA text
  LoopKind loop_kind = LoopKind::serial;
  // op
  OpKind op = OpKind::barrier;
  std::map<std::string, std::string> attrs;
  // seq and loop
  std::vector<Stmt> body;

  static Stmt seq(std::vector<Stmt> b) {
    Stmt s;
    s.body = std::move(b);
    return s;
  }
  static Stmt loop(std::string var, std::string extent, LoopKind k, std::vector<Stmt> b) {
    Stmt s;
    s.kind = Kind::loop;
    s.var = std::move(var);
    s.extent = std::move(extent);
    s.loop_kind = k;
    s.body = std::move(b);
    return s;
  }
  static Stmt make_op(OpKind k, std::map<std::string, std::string> a = {}) {
    Stmt s;
    s.kind = Kind::op;
    s.op = k;
    s.attrs = std::move(a);
    return s;
  }
};

struct SharedBuffer {
  std::string name;
  std::string elem;  // C type
  int64_t count = 0;
  int64_t offset_bytes = 0;
};

enum class KernelRole { partial, merge };

struct KernelDef {
  KernelRole role = KernelRole::partial;
  std::string name;                 // the symbol (module name + role suffix)
  std::string grid_x = "1", grid_y = "num_kv_heads", grid_z = "1";
  int block_threads = 0;
  std::vector<SharedBuffer> shared;  // dynamic shared memory, by offset
  int64_t shared_bytes = 0;
  Stmt body;
};

struct KernelModule {
  DecodeAttentionParams params;
  ThreadMapping mapping;
  std::string name;  // deterministic URI spelling out every specialisation
  std::vector<KernelDef> kernels;
  std::vector<std::string> passes_run;
};

// Human-readable dump of the module (what --print-ir-after-all shows).
std::string print_ir(const KernelModule& m);

// Finds the kernel of a role, or nullptr.
const KernelDef* find_kernel(const KernelModule& m, KernelRole role);
KernelDef* find_kernel(KernelModule& m, KernelRole role);

// Calls f on every statement of the tree (pre-order).
template <typename F>
void visit(Stmt& s, F&& f) {
  f(s);
  for (auto& c : s.body) visit(c, f);
}
template <typename F>
void visit(const Stmt& s, F&& f) {
  f(s);
  for (const auto& c : s.body) visit(c, f);
}

}  // namespace rattn::cuda
