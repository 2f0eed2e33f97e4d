// `rattn bench index`: the projected graph against hnswlib HNSW (inner
// product), faiss IVF-Flat (inner product) and the exact flat scan, on
// synthetic or captured (calibration) data. The two baselines are built on
// the graph build's key transform (centred keys, or the query metric with
// --key-metric 1|2) and, labelled, on raw keys. Context = keys of the first
// T - m tokens; test queries = the queries of the last m tokens (never used
// by any build). Recall@k is against the exact top-k.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "bench/bench_util.h"
#include "bench/index/bench_index.h"
#include "bench/index/index_phases.h"
#include "bench/index/svg_plot.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/npy.h"
#include "runtime/data/calib.h"
#include "runtime/data/synthetic.h"
#include "runtime/data/synthetic_docs.h"

namespace rattn::bench {

namespace json = boost::json;

SearchParams SearchVariant::params(int k, int queue_length) const {
  SearchParams sp;
  sp.k = k;
  sp.queue_length = queue_length;
  sp.traversal_codes = codes;
  sp.expand_width = width;
  sp.rerank = rerank;
  sp.code_dims = code_dims;
  sp.code_coarse_dims = code_coarse_dims;
  sp.patience = patience;
  sp.expand_first = expand_first;
  sp.full_expand_rank = full_expand_rank;
  return sp;
}

[[noreturn]] void usage_error(const std::string& m) { usage_fail("rattn bench index: error: " + m); }

bool IndexRun::has(const char* method) const {
  return std::find(o.methods.begin(), o.methods.end(), method) != o.methods.end();
}

Dataset load_data(const BenchIndexOptions& o) {
  Dataset ds;
  std::vector<float> all_keys, all_q, group_q;
  int group = 0;
  if (o.synthetic > 0) {
    SyntheticHead h = make_named_synthetic(o.distribution, o.synthetic, o.dim, std::max(o.head + 1, o.shared_graph), o.seed);
    ds.dim = h.head_dim;
    ds.tokens = h.tokens;
    all_keys = std::move(h.keys);
    all_q.assign(h.query(o.head, 0), h.query(o.head, 0) + size_t(h.tokens) * size_t(h.head_dim));
    if (o.shared_graph > 0) {
      group = o.shared_graph;
      group_q.assign(h.queries.begin(), h.queries.begin() + std::ptrdiff_t(size_t(group) * size_t(h.tokens) * size_t(h.head_dim)));
    }
    ds.describe["source"] = "synthetic";
    ds.describe["distribution"] = o.distribution;
    ds.describe["seed"] = o.seed;
  } else {
    const CalibManifest man = read_calib_manifest(o.calib);
    const int layer = o.layer >= 0 ? o.layer : man.layers.front();
    if (o.kv_head < 0 || o.kv_head >= man.num_kv_heads) usage_error("--kv-head out of range for " + o.calib);
    if (o.head < 0 || o.head >= man.group()) usage_error("--head out of range (group size " + std::to_string(man.group()) + ")");
    const CalibLayer l = read_calib_layer(o.calib, man, layer);
    ds.dim = man.head_dim;
    ds.tokens = man.tokens;
    const size_t per = size_t(man.tokens) * size_t(man.head_dim);
    const int qh = o.kv_head * man.group() + o.head;
    all_keys.assign(l.k.begin() + std::ptrdiff_t(per * size_t(o.kv_head)), l.k.begin() + std::ptrdiff_t(per * size_t(o.kv_head + 1)));
    all_q.assign(l.q.begin() + std::ptrdiff_t(per * size_t(qh)), l.q.begin() + std::ptrdiff_t(per * size_t(qh + 1)));
    if (o.shared_graph > 0) {
      group = man.group();
      const size_t first = per * size_t(o.kv_head * man.group());
      group_q.assign(l.q.begin() + std::ptrdiff_t(first), l.q.begin() + std::ptrdiff_t(first + per * size_t(group)));
    }
    ds.describe["source"] = "calib";
    ds.describe["dir"] = o.calib;
    ds.describe["model"] = man.model;
    ds.describe["layer"] = layer;
  }
  ds.m = o.queries;
  if (ds.m >= ds.tokens / 2) usage_error("--queries must be less than half the tokens");
  ds.context = ds.tokens - ds.m;
  const size_t d = size_t(ds.dim);
  ds.keys.assign(all_keys.begin(), all_keys.begin() + std::ptrdiff_t(size_t(ds.context) * d));
  ds.train.assign(all_q.begin(), all_q.begin() + std::ptrdiff_t(size_t(ds.context) * d));
  ds.test.assign(all_q.begin() + std::ptrdiff_t(size_t(ds.context) * d), all_q.end());
  // Each head's training part (its first `context` tokens), head by head.
  for (int g = 0; g < group; ++g) {
    const auto from = group_q.begin() + std::ptrdiff_t(size_t(g) * size_t(ds.tokens) * d);
    ds.pooled.insert(ds.pooled.end(), from, from + std::ptrdiff_t(size_t(ds.context) * d));
  }
  if (group > 0) ds.describe["shared_graph_heads"] = group;
  ds.describe["tokens"] = ds.tokens;
  ds.describe["context_keys"] = ds.context;
  ds.describe["test_queries"] = ds.m;
  ds.describe["head_dim"] = ds.dim;
  ds.describe["kv_head"] = o.kv_head;
  ds.describe["query_head"] = o.head;
  ds.describe["mahalanobis_ratio"] = mahalanobis_ratio(ds.keys.data(), ds.context, ds.train.data(), ds.context, ds.dim);
  return ds;
}

json::array to_json(const std::vector<Point>& points) {
  json::array pts;
  for (const auto& p : points) {
    json::object j;
    j[p.budget_name] = p.budget;
    j["recall"] = p.recall;
    j["scored_fraction"] = p.scored_fraction;
    j["us_per_query"] = p.us_per_query;
    if (p.cpu_us_per_query > 0) j["cpu_us_per_query"] = p.cpu_us_per_query;
    if (p.us_rounds.size() > 1) {
      json::array rounds;
      for (double u : p.us_rounds) rounds.push_back(u);
      j["us_per_query_rounds"] = std::move(rounds);
    }
    pts.push_back(std::move(j));
  }
  return pts;
}

json::value to_json(const MethodResult& r) {
  json::object o;
  o["name"] = r.name;
  o["build_seconds"] = r.build_seconds;
  o["bytes"] = r.bytes;
  o["points"] = to_json(r.points);
  for (const auto& kv : r.extra) o[kv.key()] = kv.value();
  return o;
}

json::object run_bench_index(const BenchIndexOptions& o, std::FILE* text) {
  const Log log = [text](const std::string& line) {
    if (text) std::fprintf(text, "%s\n", line.c_str());
    std::fflush(stdout);
  };
  const double t_load = seconds_now();
  Dataset ds = load_data(o);
  const int d = ds.dim;
  const int64_t N = ds.context, m = ds.m;
  log("data: " + std::to_string(ds.tokens) + " tokens, context " + std::to_string(N) + ", " + std::to_string(m) +
      " test queries, d=" + std::to_string(d) + ", mahalanobis ratio " +
      std::to_string(ds.describe["mahalanobis_ratio"].as_double()) + " (" + std::to_string(seconds_now() - t_load) + " s)");

  RowStore store(o.dtype, d);
  store.append_f32(ds.keys.data(), N);
  IndexRun ir(o, ds, store.view(), log);
  ir.gt = harness::exact_top_k_lists(ir.keys, ds.test.data(), m, o.k, o.graph.threads);
  if (!o.build_sizes.empty()) ir.build_sweep();
  if (ir.has("graph")) ir.graph_phase();
  ir.baseline_phase();
  ir.insert_phase();

  if (!o.dump_ids.empty()) {
    if (ir.op_ids.empty()) usage_error("--dump-ids needs the graph method");
    std::vector<int32_t> flat(size_t(m) * size_t(o.k), -1);
    for (int64_t i = 0; i < m; ++i)
      std::copy(ir.op_ids[size_t(i)].begin(), ir.op_ids[size_t(i)].begin() + std::min<ptrdiff_t>(o.k, ptrdiff_t(ir.op_ids[size_t(i)].size())),
                flat.begin() + std::ptrdiff_t(size_t(i) * size_t(o.k)));
    write_npy(o.dump_ids, NpyType::i32, {m, int64_t(o.k)}, flat.data());
  }
  if (!o.plot.empty()) {
    std::vector<PlotSeries> series;
    for (const auto& r : ir.results) {
      PlotSeries s;
      s.name = r.name;
      for (const auto& p : r.points) s.points.push_back({p.scored_fraction, p.recall});
      series.push_back(std::move(s));
    }
    const std::string title = "recall@" + std::to_string(o.k) + " vs keys scored, " + std::to_string(N) + " keys, d=" +
                              std::to_string(d) + ", " + std::to_string(m) + " test queries";
    write_file_atomic(o.plot, recall_plot_svg(series, title));
  }

  json::object report;
  report["benchmark"] = "index";
  report["machine_info"] = machine_info();
  json::object params;
  params["k"] = o.k;
  params["dtype"] = dtype_name(o.dtype);
  params["degree"] = o.graph.degree;
  params["query_neighbors"] = o.graph.query_neighbors;
  params["sample_fraction"] = o.graph.sample_fraction;
  params["repair_fraction"] = o.graph.repair_fraction;
  params["repair_max_queries"] = o.graph.repair_max_queries;
  params["cooccurrence_order"] = o.graph.cooccurrence_order;
  params["key_metric"] = o.graph.key_metric;
  // The key-to-key transform of the graph's build, which the baselines get.
  params["graph_key_transform"] = o.graph.key_metric == 0 ? std::string(o.graph.center_keys ? "centred" : "raw")
                                                          : "query_metric_" + std::to_string(o.graph.key_metric);
  params["baseline_keys"] = o.baseline_keys;
  params["causal"] = o.graph.causal;
  params["shift_queries"] = o.graph.shift_queries;
  params["shift_span"] = o.graph.shift_span;
  params["rope_base"] = o.graph.rope_base;
  params["rope_interleaved"] = o.graph.rope_interleaved;
  params["key_metric_passes"] = o.graph.key_metric_passes;
  params["insert_queue"] = o.graph.insert_queue;
  params["insert_key_queue"] = o.graph.insert_key_queue;
  params["insert_pivots"] = o.graph.insert_pivots;
  params["insert_reverse"] = o.graph.insert_reverse;
  params["knn_cluster_keys"] = o.graph.knn_cluster_keys;
  params["knn_probes"] = o.graph.knn_probes;
  params["knn_min_keys"] = o.graph.knn_min_keys;
  params["connect_by_partition"] = o.graph.connect_by_partition;
  params["knn_bf16"] = o.graph.knn_bf16;
  params["knn_device"] = o.graph.knn_device == GraphBuildParams::KnnDevice::gpu         ? "gpu"
                         : o.graph.knn_device == GraphBuildParams::KnnDevice::automatic ? "auto"
                                                                                        : "cpu";
  params["build_threads"] = o.graph.threads;
  params["search_threads"] = 1;
  params["search"] = o.search.front().name;
  params["interleave"] = o.interleave;
  params["target_recall"] = o.target_recall;
  params["target_scored_fraction"] = o.target_scored;
  report["parameters"] = std::move(params);
  report["data"] = ds.describe;
  json::array methods;
  for (const auto& r : ir.results) methods.push_back(to_json(r));
  report["methods"] = std::move(methods);
  if (!ir.operating.empty()) report["operating_point"] = std::move(ir.operating);
  if (!ir.insert_report.empty()) report["insert"] = std::move(ir.insert_report);
  if (!ir.sweep_report.empty()) report["build_sweep"] = std::move(ir.sweep_report);
  return report;
}

}  // namespace rattn::bench

