#pragma once
// The index harness that `rattn tune`, `rattn eval` and `rattn bench index`
// share: per-head indexes built from calibration (or captured) queries and
// keys, the test queries' exact top-k, and a search setting's recall@k, keys
// scored and time, each search seeded as the decode step seeds it.
#include <cstdint>
#include <memory>
#include <vector>

#include "dsl/ir.h"
#include "runtime/index/key_index.h"
#include "runtime/index/projected_graph.h"

namespace rattn::harness {

// One id list per query.
using IdLists = std::vector<std::vector<int32_t>>;

// Each query's exact top-k over `keys` (queries: [m, keys.dim]), best first:
// the reference of recall@k. The queries are split over `threads`.
IdLists exact_top_k_lists(const RowsView& keys, const float* queries, int64_t m, int k, int threads = 1);

// Mean recall@k of `got` against `exact`, over the queries of `exact`.
double mean_recall(const IdLists& got, const IdLists& exact, int k);

// One query head: its index over `keys` and its test queries' exact top-k.
struct HeadIndex {
  RowsView keys;
  std::shared_ptr<KeyIndex> index;  // the group's heads share it with plan shared_graph
  const float* test = nullptr;  // [m, keys.dim]
  IdLists exact;
};

// The head's index built with `bp` from `train` ([n_train, keys.dim]
// training queries), and the exact top-`recall_k` of its `m` test queries
// (recall_k 0: none; the caller lists them).
// Adds the build's wall seconds to *build_seconds when given.
HeadIndex build_head(const RowsView& keys, const float* train, int64_t n_train, const GraphBuildParams& bp,
                     const float* test, int64_t m, int recall_k, double* build_seconds = nullptr);

// The query heads of one GQA group over the same `keys`, as the runtime
// builds them under `shared_graph`: false, one index per head from its own
// `n_train` training queries (build_head); true, one index from the group's
// pooled training queries (head after head), which every head searches.
// train[g] and test[g] are head g's rows; `group` = their count.
std::vector<HeadIndex> build_group(const RowsView& keys, const float* const* train, int64_t n_train,
                                   const float* const* test, int group, bool shared_graph, const GraphBuildParams& bp,
                                   int64_t m, int recall_k, double* build_seconds = nullptr);

// The build parameters the runtime gives `layer`'s indexes under `plan`,
// built on `threads` threads.
GraphBuildParams head_build_params(const ConcretePlan& plan, const ModelLayout& model, int layer, int threads);

// The decode step's search parameters for `s` asking for
// max(plan.top_k, recall_k) results, at most `keys`.
SearchParams decode_params(const ConcretePlan& plan, const DecodeSearch& s, int recall_k, int64_t keys);

// A search setting measured on a run of test queries.
struct SearchQuality {
  double recall = 0;           // mean recall@k
  double scored_fraction = 0;  // mean keys scored / keys indexed
  double scored_min = 0, scored_max = 0;
  double us_per_query = 0;     // mean wall time of one search, this thread
  std::vector<double> query_recall;  // recall@k of each search, in the order of the queries
};

// Searches the test queries `queries` (row indexes of `test`, in order)
// with `sp` on this thread. Each search is seeded, as the decode step seeds
// it, with the first `seeds` results of the previous query when that query
// is the one just before it. With ids_out: the best recall_k ids of each
// search, in the order of `queries`. recall_depth > 0: recall is counted
// over the best min(recall_depth, recall_k) ids (a large top-k judged by
// how it finds the heaviest keys).
SearchQuality measure_search(const KeyIndex& index, const RowsView& keys, const float* test, const IdLists& exact,
                             SearchParams sp, int seeds, const std::vector<int>& queries, int recall_k,
                             IdLists* ids_out = nullptr, int recall_depth = 0);

// 0, 1, ..., m - 1: every test query in order.
std::vector<int> all_queries(int64_t m);

}  // namespace rattn::harness
