#include <algorithm>
#include <cmath>
#include <iterator>

#include "dsl/ir.h"

namespace rattn {

std::vector<double> ParamDomain::candidates() const {
  switch (kind) {
    case Kind::fixed:
    case Kind::set: return values;
    case Kind::range: {
      std::vector<double> out;
      if (geometric) {
        for (double v = lo; v <= hi * (1 + 1e-12); v *= step) out.push_back(v);
      } else {
        const long n = long(std::floor((hi - lo) / step + 1e-9));
        for (long i = 0; i <= n; ++i) out.push_back(lo + double(i) * step);
      }
      return out;
    }
  }
  return {};
}

double ParamDomain::default_value() const {
  if (preferred) return *preferred;
  if (kind == Kind::range) return lo;
  return values.empty() ? 0.0 : values.front();
}

const char* rope_style_name(RopeStyle style) {
  return style == RopeStyle::gptj ? "gptj" : "neox";
}

int ModelLayout::num_global_layers() const {
  return int(std::count_if(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.global; }));
}

std::vector<PlanParam> plan_params(const RetrievalPlan& p) {
  return {{plan_keys::sinks, &p.sinks},
          {plan_keys::window, &p.window},
          {plan_keys::top_k, &p.top_k},
          {plan_keys::graph_degree, &p.graph_degree},
          {plan_keys::query_neighbors, &p.query_neighbors},
          {plan_keys::build_sample, &p.build_sample},
          {plan_keys::search_queue, &p.search_queue},
          {plan_keys::tail_samples, &p.tail_samples},
          {plan_keys::build_queue, &p.build_queue},
          {plan_keys::pivot_capacity, &p.pivot_capacity},
          {plan_keys::pivots_per_query, &p.pivots_per_query},
          {plan_keys::two_hop_fill, &p.two_hop_fill},
          {plan_keys::extra_slots, &p.extra_slots},
          {plan_keys::entry_points, &p.entry_points},
          {plan_keys::repair_fraction, &p.repair_fraction},
          {plan_keys::key_metric, &p.key_metric},
          {plan_keys::key_metric_ridge, &p.key_metric_ridge},
          {plan_keys::key_metric_passes, &p.key_metric_passes},
          {plan_keys::causal, &p.causal},
          {plan_keys::insert_queue, &p.insert_queue},
          {plan_keys::insert_pivots, &p.insert_pivots},
          {plan_keys::insert_reverse, &p.insert_reverse},
          {plan_keys::insert_key_queue, &p.insert_key_queue},
          {plan_keys::traversal_codes, &p.traversal_codes},
          {plan_keys::code_dims, &p.code_dims},
          {plan_keys::code_coarse_dims, &p.code_coarse_dims},
          {plan_keys::search_patience, &p.search_patience},
          {plan_keys::search_seeds, &p.search_seeds},
          {plan_keys::search_expand_first, &p.search_expand_first},
          {plan_keys::search_full_expand, &p.search_full_expand},
          {plan_keys::shift_queries, &p.shift_queries},
          {plan_keys::shift_span, &p.shift_span},
          {plan_keys::refresh_sample, &p.refresh_sample},
          {plan_keys::shared_graph, &p.shared_graph},
          {plan_keys::knn_cluster_keys, &p.knn_cluster_keys},
          {plan_keys::knn_probes, &p.knn_probes},
          {plan_keys::repair_max_queries, &p.repair_max_queries}};
}

ConcretePlan default_concrete_plan(const RetrievalPlan& p) {
  ConcretePlan c;
  c.sinks = int64_t(p.sinks.default_value());
  c.window = int64_t(p.window.default_value());
  c.top_k = int64_t(p.top_k.default_value());
  c.graph_degree = int(p.graph_degree.default_value());
  c.query_neighbors = int(p.query_neighbors.default_value());
  c.build_sample = p.build_sample.default_value();
  c.search_queue = int(p.search_queue.default_value());
  c.build_queue = int(p.build_queue.default_value());
  c.pivot_capacity = int(p.pivot_capacity.default_value());
  c.pivots_per_query = int(p.pivots_per_query.default_value());
  c.two_hop_fill = p.two_hop_fill.default_value() != 0;
  c.extra_slots = int(p.extra_slots.default_value());
  c.entry_points = int(p.entry_points.default_value());
  c.repair_fraction = p.repair_fraction.default_value();
  c.key_metric = int(p.key_metric.default_value());
  c.key_metric_ridge = p.key_metric_ridge.default_value();
  c.key_metric_passes = int(p.key_metric_passes.default_value());
  c.causal = p.causal.default_value() != 0;
  c.insert_queue = int(p.insert_queue.default_value());
  c.insert_pivots = int(p.insert_pivots.default_value());
  c.insert_reverse = int(p.insert_reverse.default_value());
  c.insert_key_queue = int(p.insert_key_queue.default_value());
  c.traversal_codes = p.traversal_codes.default_value() != 0;
  c.code_dims = int(p.code_dims.default_value());
  c.code_coarse_dims = int(p.code_coarse_dims.default_value());
  c.search_patience = int(p.search_patience.default_value());
  c.search_seeds = int(p.search_seeds.default_value());
  c.search_expand_first = int(p.search_expand_first.default_value());
  c.search_full_expand = int(p.search_full_expand.default_value());
  c.tail_samples = int(p.tail_samples.default_value());
  c.shift_queries = int(p.shift_queries.default_value());
  c.shift_span = int(p.shift_span.default_value());
  c.refresh_sample = p.refresh_sample.default_value();
  c.shared_graph = p.shared_graph.default_value() != 0;
  c.knn_cluster_keys = int(p.knn_cluster_keys.default_value());
  c.knn_probes = int(p.knn_probes.default_value());
  c.repair_max_queries = int(p.repair_max_queries.default_value());
  for (const auto& [k, d] : p.kernel) {
    // A split range left to the tuner: the runtime sizes the splits to the
    // static set (static_set_splits), not the range's first value.
    if (k == "cuda.splits" && d.candidates().size() > 1 && !d.preferred) continue;
    c.kernel[k] = d.default_value();
  }
  for (const auto& [layer, own] : p.layer_search)
    for (const auto& [k, d] : own.params) c.layer_search[layer][k] = int(d.default_value());
  return c;
}

DecodeSearch ConcretePlan::decode_search(int layer) const {
  DecodeSearch s{search_queue, search_patience, search_seeds, search_expand_first, search_full_expand};
  const auto it = layer_search.find(layer);
  if (it == layer_search.end()) return s;
  for (const auto& [k, v] : it->second) {
    if (k == plan_keys::search_queue) s.queue = v;
    else if (k == plan_keys::search_patience) s.patience = v;
    else if (k == plan_keys::search_seeds) s.seeds = v;
    else if (k == plan_keys::search_expand_first) s.expand_first = v;
    else if (k == plan_keys::search_full_expand) s.full_expand = v;
  }
  return s;
}

LayerRetrieval ConcretePlan::layer_retrieval(int layer) const {
  LayerRetrieval r{top_k, tail_samples};
  const auto it = layer_search.find(layer);
  if (it == layer_search.end()) return r;
  if (const auto k = it->second.find(plan_keys::top_k); k != it->second.end()) r.top_k = k->second;
  if (const auto t = it->second.find(plan_keys::tail_samples); t != it->second.end()) r.tail_samples = t->second;
  return r;
}

void ConcretePlan::drop_layer_search(const char* key) {
  for (auto it = layer_search.begin(); it != layer_search.end();) {
    it->second.erase(key);
    it = it->second.empty() ? layer_search.erase(it) : std::next(it);
  }
}

}  // namespace rattn
