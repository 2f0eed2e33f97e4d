#include "harness/index_harness.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "runtime/index/brute_force.h"
#include "runtime/runtime.h"

namespace rattn::harness {

IdLists exact_top_k_lists(const RowsView& keys, const float* queries, int64_t m, int k, int threads) {
  IdLists exact(static_cast<size_t>(m));
#pragma omp parallel for num_threads(std::max(threads, 1)) schedule(dynamic, 8)
  for (int64_t i = 0; i < m; ++i) exact_top_k(queries + size_t(i) * size_t(keys.dim), keys, keys.rows, k, &exact[size_t(i)]);
  return exact;
}

double mean_recall(const IdLists& got, const IdLists& exact, int k) {
  double sum = 0;
  for (size_t i = 0; i < exact.size(); ++i) sum += recall_at(got[i], exact[i], k);
  return exact.empty() ? 0.0 : sum / double(exact.size());
}

HeadIndex build_head(const RowsView& keys, const float* train, int64_t n_train, const GraphBuildParams& bp,
                     const float* test, int64_t m, int recall_k, double* build_seconds) {
  HeadIndex h;
  h.keys = keys;
  h.test = test;
  const auto t0 = std::chrono::steady_clock::now();
  h.index = build_projected_graph(keys, train, n_train, bp);
  if (build_seconds) *build_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (recall_k > 0) h.exact = exact_top_k_lists(keys, test, m, recall_k);
  return h;
}

std::vector<HeadIndex> build_group(const RowsView& keys, const float* const* train, int64_t n_train,
                                   const float* const* test, int group, bool shared_graph, const GraphBuildParams& bp,
                                   int64_t m, int recall_k, double* build_seconds) {
  std::vector<HeadIndex> heads;
  if (!shared_graph) {
    for (int g = 0; g < group; ++g)
      heads.push_back(build_head(keys, train[g], n_train, bp, test[g], m, recall_k, build_seconds));
    return heads;
  }
  std::vector<float> pooled;
  pooled.reserve(size_t(group) * size_t(n_train) * size_t(keys.dim));
  for (int g = 0; g < group; ++g) pooled.insert(pooled.end(), train[g], train[g] + size_t(n_train) * size_t(keys.dim));
  heads.push_back(build_head(keys, pooled.data(), int64_t(group) * n_train, bp, test[0], m, recall_k, build_seconds));
  for (int g = 1; g < group; ++g) {
    HeadIndex h;
    h.keys = keys;
    h.test = test[g];
    h.index = heads[0].index;
    if (recall_k > 0) h.exact = exact_top_k_lists(keys, test[g], m, recall_k);
    heads.push_back(std::move(h));
  }
  return heads;
}

GraphBuildParams head_build_params(const ConcretePlan& plan, const ModelLayout& model, int layer, int threads) {
  GraphBuildParams bp = internal::graph_build_params(plan, model, layer);
  bp.threads = threads;
  return bp;
}

SearchParams decode_params(const ConcretePlan& plan, const DecodeSearch& s, int recall_k, int64_t keys) {
  return internal::decode_search_params(plan, s, int(std::min<int64_t>(std::max<int64_t>(plan.top_k, recall_k), keys)));
}

SearchQuality measure_search(const KeyIndex& index, const RowsView& keys, const float* test, const IdLists& exact,
                             SearchParams sp, int seeds, const std::vector<int>& queries, int recall_k,
                             IdLists* ids_out, int recall_depth) {
  SearchQuality q;
  const int depth = recall_depth > 0 ? std::min(recall_depth, recall_k) : recall_k;
  const size_t m = queries.size();
  if (ids_out) ids_out->assign(m, {});
  if (m == 0) return q;
  const double n = double(keys.rows);
  auto scratch = index.make_scratch();
  SearchResult res;
  std::vector<int32_t> seed_ids;
  double recall = 0, scored = 0, total_us = 0;
  q.scored_min = 1;
  for (size_t j = 0; j < m; ++j) {
    const int i = queries[j];
    if (j == 0 || queries[j - 1] != i - 1) res.ids.clear();
    seed_ids.assign(res.ids.begin(), res.ids.begin() + std::ptrdiff_t(std::min<size_t>(res.ids.size(), size_t(std::max(seeds, 0)))));
    sp.seeds = seed_ids.data();
    sp.num_seeds = int(seed_ids.size());
    const auto t0 = std::chrono::steady_clock::now();
    index.search(test + size_t(i) * size_t(keys.dim), keys, sp, *scratch, res);
    total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    q.query_recall.push_back(recall_at(res.ids, exact[size_t(i)], depth));
    recall += q.query_recall.back();
    if (ids_out)
      (*ids_out)[j].assign(res.ids.begin(), res.ids.begin() + std::ptrdiff_t(std::min<size_t>(res.ids.size(), size_t(recall_k))));
    const double share = double(res.keys_scored) / n;
    scored += share;
    q.scored_min = std::min(q.scored_min, share);
    q.scored_max = std::max(q.scored_max, share);
  }
  q.recall = recall / double(m);
  q.scored_fraction = scored / double(m);
  q.us_per_query = total_us / double(m);
  return q;
}

std::vector<int> all_queries(int64_t m) {
  std::vector<int> q(static_cast<size_t>(m));
  std::iota(q.begin(), q.end(), 0);
  return q;
}

}  // namespace rattn::harness
