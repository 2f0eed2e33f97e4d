#pragma once
// Where the KV cache and the indexes live at a given context length, per layer
// and in total: what `rattn inspect` prints (formulas in docs/dsl.md).
#include <cstdint>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "dsl/ir.h"

#include "core/memory.h"  // format_bytes

namespace rattn {

struct LayerMemory {
  int layer = 0;
  bool global = true;
  int64_t sliding_window = 0;      // local layers
  int64_t static_tokens = 0;       // exact-attention set: sinks + window (global), window (local)
  int64_t offloaded_tokens = 0;    // global layers: the rest, in CPU memory under the indexes
  uint64_t kv_bytes_static = 0;
  uint64_t kv_bytes_offloaded = 0;
  uint64_t index_bytes = 0;
  uint64_t kv_bytes_full = 0;      // the model's own cache: context (global), window (local)
  int num_indexes = 0;             // global layers: query heads (KV heads with shared_graph); 0 on local ones
};

struct MemoryPlan {
  int64_t context = 0;
  bool gpu = false;                      // the static set lives on the GPU (else on the CPU)
  ConcretePlan plan;                     // the defaults of the plan's domains
  uint64_t kv_bytes_per_token_layer = 0; // 2 (K,V) x kv_heads x head_dim x dtype size
  uint64_t index_bytes_per_node = 0;     // index_bytes_per_node(plan)
  uint64_t code_bytes_per_key = 0;       // code_bytes_per_key(plan, head_dim)
  std::vector<LayerMemory> layers;
  uint64_t kv_bytes_full = 0;
  uint64_t kv_bytes_static = 0;
  uint64_t kv_bytes_offloaded = 0;
  uint64_t kv_bytes_gpu = 0;   // static set when there is a GPU, else 0
  uint64_t kv_bytes_cpu = 0;   // offloaded KV (+ the static set without a GPU)
  uint64_t index_bytes = 0;
  int64_t num_indexes = 0;
};

// Bytes of one index node, as the projected graph holds it: a 4-byte count and
// graph_degree + extra_slots 4-byte neighbour slots (the adjacency arena),
// a 4-byte spanning-tree parent and a 4-byte cached weakest-edge score.
uint64_t index_bytes_per_node(const ConcretePlan& plan);
// Traversal code bytes per key and KV head: with traversal_codes, the key's
// 8-bit code (head_dim bytes, whole cache lines), held once per KV head (a
// GQA group's indexes share them); with projected codes (code_dims), one row
// per query head of the group (`group` = q_heads / kv_heads): code_dims -
// code_coarse_dims bytes padded to 16, 16 per 32 coarse dims, whole lines.
// Else 0.
uint64_t code_bytes_per_key(const ConcretePlan& plan, int head_dim, int group = 1);
// Whether the plan's decode searches walk projected codes (one set per query
// head) rather than the shared codes of the raw keys.
bool uses_projected_codes(const ConcretePlan& plan, int head_dim);

// The memory plan of `program` at `context` tokens with the plan's default
// values. Throws Error(invalid_argument) when context is < 1 or beyond the
// model's context.
MemoryPlan plan_memory(const Program& program, int64_t context);

// The human-readable report of `rattn inspect` (layers with identical
// numbers are grouped), and its JSON form.
std::string format_report(const Program& program, const MemoryPlan& mem);
boost::json::object report_json(const Program& program, const MemoryPlan& mem);


}  // namespace rattn
