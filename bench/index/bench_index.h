#pragma once
// `rattn bench index`: the projected graph against hnswlib HNSW (inner
// product), faiss IVF-Flat (inner product) and the exact flat scan, on
// synthetic or captured (calibration) data. tools/rattn/bench_index.cpp
// parses the options (its help describes each).
#include <array>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "core/dtype.h"
#include "runtime/index/key_index.h"
#include "runtime/index/projected_graph.h"

namespace rattn::bench {

// One graph search variant of --search, swept over the budgets.
struct SearchVariant {
  std::string name;
  bool codes = true;
  int width = 1;
  int rerank = 0;
  int code_dims = 0;
  int code_coarse_dims = 0;  // of the code_dims, 4-bit (codes@F+C)
  int patience = 0;
  int seeds = 0;  // the previous test query's best results seed the search (a decode step's warm start)
  int expand_first = 0, full_expand_rank = 0;  // partial expansion (SearchParams)
  SearchParams params(int k, int queue_length) const;
};

struct BenchIndexOptions {
  int64_t synthetic = 0;  // > 0: this many synthetic tokens; else calib
  std::string distribution = "topics";  // synthetic generator: topics or documents (runtime/data/synthetic_docs.h)
  std::string calib;
  int layer = -1, kv_head = 0, head = 0, dim = 128;
  // > 0: one graph per KV head, built from the pooled training queries of
  // this many query heads of the group (synthetic; --calib: the whole
  // group), searched with --head's test queries (plan option shared_graph).
  int shared_graph = 0;
  uint64_t seed = 1;
  int64_t queries = 1000;
  int k = 100;
  DType dtype = DType::f32;
  std::vector<std::string> methods{"graph", "hnsw", "ivf", "flat"};
  std::string baseline_keys = "both";
  GraphBuildParams graph;
  std::vector<int> budgets{100, 128, 160, 180, 200, 225, 250, 320, 400, 500};
  std::vector<SearchVariant> search{{"codes", true, 1}, {"exact", false, 1}};
  int interleave = 4;
  int repeat = 5;  // timing rounds; the median is reported
  std::string graph_cache;
  std::string build_fingerprint;  // every option except search-only ones: names a cached graph
  std::vector<int64_t> build_sizes;  // build sweep: graph builds on the first n keys (ascending)
  double insert_fraction = 0.1;
  int insert_queue = 0;
  int insert_refresh = 0;
  double insert_refresh_sample = 0.2;
  std::vector<std::array<int, 4>> insert_sweep;  // queue:pivots:reverse:key_queue
  std::vector<std::pair<int, int>> insert_schedules;  // window:insert_batch (the decode step's hints and batches)
  double target_recall = 0.95, target_scored = 0.02;
  std::string dump_ids, dump_graph, plot;
  BenchIndexOptions() {
    graph.sample_fraction = 0.2;
    graph.repair_fraction = 1.0;       // small but consistent gain (docs/performance.md)
    graph.keep_query_moment = true;    // for the codes@D search variants
  }
};

// Runs the benchmark, printing its progress to `text` (nullptr: silent).
// Returns the report (machine_info, parameters, data, every method, the
// operating point, the insert experiments). Throws UsageError when the data
// does not fit the options (a head out of range, too many test queries).
boost::json::object run_bench_index(const BenchIndexOptions& o, std::FILE* text);

}  // namespace rattn::bench
