// Plan -> parameters: the index build and insert parameters and the decode
// search parameters a concrete plan stands for, one mapping for the runtime,
// `rattn tune` and `rattn eval`.
#include <algorithm>

#include "dsl/memory_plan.h"
#include "runtime/index/projected_graph.h"
#include "runtime/runtime.h"

namespace rattn::internal {

GraphBuildParams graph_build_params(const ConcretePlan& plan) {
  GraphBuildParams gp;
  gp.degree = plan.graph_degree;
  gp.query_neighbors = plan.query_neighbors;
  gp.sample_fraction = plan.build_sample;
  gp.build_queue = plan.build_queue;
  gp.pivot_capacity = plan.pivot_capacity;
  gp.pivots_per_query = plan.pivots_per_query;
  gp.fill_two_hop = plan.two_hop_fill;
  gp.extra_slots = plan.extra_slots;
  gp.entry_points = plan.entry_points;
  gp.repair_fraction = plan.repair_fraction;
  gp.key_metric = plan.key_metric;
  gp.key_metric_ridge = plan.key_metric_ridge;
  gp.key_metric_passes = plan.key_metric_passes;
  // Training query row t is token t; key row 0 is the first token after
  // the sinks (a graph is only built when the prefill filled them).
  gp.causal = plan.causal;
  gp.causal_key_offset = plan.sinks;
  gp.insert_queue = plan.insert_queue;
  gp.insert_pivots = plan.insert_pivots;
  gp.insert_reverse = plan.insert_reverse;
  gp.insert_key_queue = plan.insert_key_queue;
  gp.shift_queries = plan.shift_queries;
  gp.shift_span = plan.shift_span;
  gp.knn_cluster_keys = plan.knn_cluster_keys;
  gp.knn_probes = plan.knn_probes;
  gp.repair_max_queries = plan.repair_max_queries;
  // Lists ordered by co-occurrence only where a search reads them partially:
  // whole-list searches find the same keys in any order, and the order cost
  // 0.75 s of a 12 s build at 524288 keys (docs/index.md, step 10).
  gp.cooccurrence_order = plan.search_expand_first > 0;
  for (const auto& [layer, keys] : plan.layer_search)
    if (const auto it = keys.find(plan_keys::search_expand_first); it != keys.end() && it->second > 0)
      gp.cooccurrence_order = true;
  return gp;
}

SearchParams decode_search_params(const ConcretePlan& plan, const DecodeSearch& s, int k) {
  SearchParams sp;
  sp.k = k;
  sp.queue_length = std::max(s.queue, k);
  sp.traversal_codes = plan.traversal_codes;
  sp.code_dims = plan.code_dims;
  sp.code_coarse_dims = plan.code_coarse_dims;
  sp.patience = s.patience;
  sp.expand_first = s.expand_first;
  sp.full_expand_rank = s.full_expand;
  return sp;
}

GraphBuildParams graph_build_params(const ConcretePlan& plan, const ModelLayout& layout, int layer) {
  GraphBuildParams gp = graph_build_params(plan);
  if (layer >= 0 && size_t(layer) < layout.layers.size()) gp.rope_base = layout.layers[size_t(layer)].rope_base;
  gp.rope_interleaved = layout.rope_style == RopeStyle::gptj;
  if (layer >= 0) gp.cooccurrence_order = plan.decode_search(layer).expand_first > 0;
  // A shared graph trains on its group's pooled queries: build_sample /
  // group of them, as many as a query head's graph takes (synthetic T =
  // 131072: recall@100 within 0.006 of the per-head graphs at equal keys
  // scored, at a quarter of the group's build; the whole pool scored more
  // keys for the same recall; docs/index.md, "Shared graphs").
  if (plan.shared_graph && layout.group_size() > 1) gp.sample_fraction = plan.build_sample / layout.group_size();
  // Projected codes are fitted to the training queries' second moment.
  gp.keep_query_moment = uses_projected_codes(plan, layout.head_dim);
  return gp;
}

}  // namespace rattn::internal
