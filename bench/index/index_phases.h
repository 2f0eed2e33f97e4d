#pragma once
// The phases of `rattn bench index`, run in order by run_bench_index
// (bench_index.cpp) on one IndexRun: the projected graph (index_graph.cpp),
// the baselines (index_baselines.cpp) and the insert experiments
// (index_insert.cpp).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <boost/json.hpp>

#include "bench/index/bench_index.h"
#include "harness/index_harness.h"
#include "kernels/kv_store.h"

namespace rattn::bench {

using harness::IdLists;
using Log = std::function<void(const std::string&)>;

// The evaluation set: context keys and training queries (first T - m tokens)
// and test queries (last m tokens).
struct Dataset {
  int dim = 0;
  int64_t tokens = 0, context = 0, m = 0;
  std::vector<float> keys;     // [context, d]
  std::vector<float> train;    // [context, d], this query head
  std::vector<float> test;     // [m, d]
  // --shared-graph: the training queries of the KV head's whole group
  // ([group * context, d], head by head), which the graph is built from.
  std::vector<float> pooled;
  boost::json::object describe;
};

// The data of --synthetic or --calib, cut as Dataset says.
Dataset load_data(const BenchIndexOptions& o);

// One point of a method's sweep: its budget and what it measured there.
struct Point {
  std::string budget_name;
  double budget = 0;
  double recall = 0, scored_fraction = 0, us_per_query = 0;
  double cpu_us_per_query = 0;  // this thread's CPU time (0: not measured); steadier than wall time on a shared machine
  std::vector<double> us_rounds;  // us_per_query of every timing round (--repeat; us_per_query is their median)
};

// One method: its build and its sweep (a report's "methods" entry).
struct MethodResult {
  std::string name;
  double build_seconds = 0;
  size_t bytes = 0;
  std::vector<Point> points;
  boost::json::object extra;
};

boost::json::array to_json(const std::vector<Point>& points);
boost::json::value to_json(const MethodResult& r);

// One run of the benchmark: what its phases read and add to. The phases run
// in order: graph_phase (with --methods graph), baseline_phase, insert_phase.
struct IndexRun {
  IndexRun(const BenchIndexOptions& options, const Dataset& data, const RowsView& context_keys, Log progress)
      : o(options), ds(data), d(data.dim), N(data.context), m(data.m), keys(context_keys), log(std::move(progress)) {}

  // The projected graph: its build (or --graph-cache), the search variants
  // swept over the budgets, the operating point, the pairing with the flat
  // scan and the interleaved search_many().
  void graph_phase();
  // hnswlib, faiss IVF and the exact flat scan; then the other methods'
  // recall at the operating point's scored fraction.
  void baseline_phase();
  // The insert experiments of the graph (plain, hinted, --insert-sweep) and
  // of hnswlib.
  void insert_phase();
  // --build-sizes: the graph's build on the first n keys for each size, and
  // the growth exponents between consecutive sizes (index_build_sweep.cpp).
  void build_sweep();
  bool has(const char* method) const;

  const BenchIndexOptions& o;
  const Dataset& ds;
  const int d;             // head dimension
  const int64_t N, m;      // context keys, test queries
  const RowsView keys;     // the context keys, stored as --dtype
  IdLists gt;              // each test query's exact top-k
  const Log log;
  std::vector<MethodResult> results;
  boost::json::object operating, insert_report, sweep_report;
  IdLists op_ids;  // the graph's results at the operating point
};

// The baselines run on the key transform of the graph's build and,
// labelled, on raw keys (and centred ones when the build uses a query
// metric). Every transform ranks the keys as the raw ones for each query.
struct BaselineKeys {
  std::string transform;  // "centred", "query_metric_1|2" or "raw"
  std::string suffix;     // of the method name
  std::vector<float> rows, queries;  // keys [N, d], test queries [m, d]; empty: the raw ones
  const float* key_rows(const Dataset& x) const { return rows.empty() ? x.keys.data() : rows.data(); }
  const float* query(const Dataset& x, int64_t i) const {
    return (queries.empty() ? x.test.data() : queries.data()) + size_t(i) * size_t(x.dim);
  }
};

// The transforms fitted on the first `fit` keys and training queries (the
// insert experiment's base), applied to all N keys.
std::vector<BaselineKeys> make_baseline_keys(const BenchIndexOptions& o, const Dataset& ds, int64_t fit);
std::string baseline_label(const BaselineKeys& bk);

// A usage error of `rattn bench index` (exit status 2).
[[noreturn]] void usage_error(const std::string& m);

}  // namespace rattn::bench
