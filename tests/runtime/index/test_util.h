#pragma once
// Shared helpers of the index tests: small random key sets, a float64
// oracle, and search_many() against one search() per job.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_store.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/key_index.h"

namespace rattn::testing {

// A synthetic head (d = 64, `group` query heads) whose first tokens - m keys
// are in a store: the context; the last m positions' queries test it.
struct SyntheticSet {
  SyntheticHead head;
  int64_t context = 0, m = 0;
  RowStore keys{DType::f32, 64};
};

inline SyntheticSet make_synthetic_set(int64_t tokens, int64_t m, int group, uint64_t seed) {
  SyntheticSpec spec;
  spec.tokens = tokens;
  spec.head_dim = 64;
  spec.group = group;
  spec.seed = seed;
  SyntheticSet s{make_synthetic(spec), tokens - m, m, RowStore(DType::f32, 64)};
  s.keys.append_f32(s.head.keys.data(), s.context);
  return s;
}

inline std::vector<float> random_rows(int64_t n, int d, uint64_t seed, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(mean, 1.0f);
  std::vector<float> v(static_cast<size_t>(n) * size_t(d));
  for (auto& x : v) x = nd(rng);
  return v;
}

// Exact top-k ids by float64 inner product (score desc, ties by id).
inline std::vector<int32_t> oracle_top_k(const float* q, const RowStore& keys, int64_t n, int k) {
  std::vector<double> s(static_cast<size_t>(n));
  std::vector<float> row(size_t(keys.dim()));
  for (int64_t i = 0; i < n; ++i) {
    keys.row_f32(i, row.data());
    double acc = 0;
    for (int j = 0; j < keys.dim(); ++j) acc += double(q[j]) * double(row[size_t(j)]);
    s[size_t(i)] = acc;
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const int kk = int(std::min<int64_t>(k, n));
  std::partial_sort(ids.begin(), ids.begin() + kk, ids.end(), [&](int32_t a, int32_t b) {
    return s[size_t(a)] > s[size_t(b)] || (s[size_t(a)] == s[size_t(b)] && a < b);
  });
  ids.resize(size_t(kk));
  return ids;
}

inline double recall(const std::vector<int32_t>& got, const std::vector<int32_t>& truth) {
  std::vector<int32_t> a(got), b(truth);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return truth.empty() ? 1.0 : double(both.size()) / double(truth.size());
}

// Mean recall@k of `index` at queue length L over the queries query_at(i),
// i in [0, m), against the exact top-k of keys [0, n_keys); scored_share
// (may be null): the keys scored per query, as a share of n_keys.
template <class QueryAt>
double mean_recall(const KeyIndex& index, const RowStore& keys, int64_t n_keys, int64_t m, int k, int L,
                   const QueryAt& query_at, double* scored_share = nullptr) {
  auto scratch = index.make_scratch();
  SearchParams sp;
  sp.k = k;
  sp.queue_length = L;
  SearchResult r;
  double sum = 0, scored = 0;
  for (int64_t i = 0; i < m; ++i) {
    const float* q = query_at(i);
    index.search(q, keys.view(), sp, *scratch, r);
    sum += recall(r.ids, oracle_top_k(q, keys, n_keys, k));
    scored += double(r.keys_scored);
  }
  if (scored_share) *scored_share = scored / double(m) / double(n_keys);
  return sum / double(m);
}

// Runs search_many() over jobs[0, n) (each with its own scratch and result),
// then each job alone through search() (its own seeds, a fresh scratch):
// every job's ids, scores and keys scored equal, and none is empty.
inline void expect_many_equals_single(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& sp) {
  search_many(jobs, n, keys, sp);
  for (int j = 0; j < n; ++j) {
    const SearchJob& job = jobs[j];
    auto scratch = job.index->make_scratch();
    SearchResult single;
    job.index->search(job.query, keys, internal::job_params(sp, job), *scratch, single);
    EXPECT_FALSE(job.out->ids.empty()) << "job " << j;
    EXPECT_EQ(job.out->ids, single.ids) << "job " << j;
    EXPECT_EQ(job.out->scores, single.scores) << "job " << j;
    EXPECT_EQ(job.out->keys_scored, single.keys_scored) << "job " << j;
  }
}

}  // namespace rattn::testing
