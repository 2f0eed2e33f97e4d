// The index harness: exact top-k lists against a float64 scan, mean recall,
// the decode step's search parameters, and measure_search's recall, keys
// scored and seed chains (through an exhaustive index and a recording one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "harness/index_harness.h"
#include "runtime/index/brute_force.h"
#include "runtime/runtime.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::harness::IdLists;
using rattn::testing::random_normal;

constexpr int kDim = 16;
constexpr int64_t kKeys = 600, kQueries = 40;

// The top-k of `q` over `keys` by float64 inner products (ties: lower id).
std::vector<int32_t> top_k_f64(const float* q, const std::vector<float>& keys, int64_t n, int k) {
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double dot = 0;
    for (int j = 0; j < kDim; ++j) dot += double(q[j]) * double(keys[size_t(i) * kDim + size_t(j)]);
    s[size_t(i)] = dot;
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)]; });
  ids.resize(size_t(k));
  return ids;
}

TEST(IndexHarness, ExactListsMatchAFloat64Scan) {
  const std::vector<float> keys = random_normal(size_t(kKeys) * kDim, 1), q = random_normal(size_t(kQueries) * kDim, 2);
  const rattn::RowsView view{keys.data(), rattn::DType::f32, kKeys, kDim};
  const IdLists one = rattn::harness::exact_top_k_lists(view, q.data(), kQueries, 10, 1);
  const IdLists two = rattn::harness::exact_top_k_lists(view, q.data(), kQueries, 10, 2);
  ASSERT_EQ(one.size(), size_t(kQueries));
  EXPECT_EQ(one, two);  // the threads only split the queries
  for (int64_t i = 0; i < kQueries; ++i)
    EXPECT_EQ(one[size_t(i)], top_k_f64(q.data() + size_t(i) * kDim, keys, kKeys, 10)) << "query " << i;
}

TEST(IndexHarness, MeanRecallIsTheMeanShareFound) {
  const IdLists exact = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  const IdLists got = {{4, 3, 2, 1}, {5, 9, 10, 6, 7}};
  // Query 0 finds all 4; query 1 finds 5 and 6 among its first 4 results.
  EXPECT_DOUBLE_EQ(rattn::harness::mean_recall(got, exact, 4), (1.0 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(rattn::harness::mean_recall({}, {}, 4), 0.0);
}

TEST(IndexHarness, DecodeParamsAskForTheLargerOfTopKAndRecallK) {
  rattn::ConcretePlan plan;
  plan.top_k = 50;
  const rattn::DecodeSearch s{200, 0, 4, 0, 0};
  EXPECT_EQ(rattn::harness::decode_params(plan, s, 100, 1000).k, 100);
  EXPECT_EQ(rattn::harness::decode_params(plan, s, 10, 1000).k, 50);
  EXPECT_EQ(rattn::harness::decode_params(plan, s, 100, 80).k, 80);  // no more than the keys
  EXPECT_EQ(rattn::harness::decode_params(plan, s, 100, 1000).queue_length, 200);
}

TEST(IndexHarness, AnExhaustiveSearchFindsEveryTopKAndScoresEveryKey) {
  const std::vector<float> keys = random_normal(size_t(kKeys) * kDim, 3), q = random_normal(size_t(kQueries) * kDim, 4);
  const rattn::RowsView view{keys.data(), rattn::DType::f32, kKeys, kDim};
  const IdLists exact = rattn::harness::exact_top_k_lists(view, q.data(), kQueries, 20);
  const auto index = rattn::make_brute_force_index(kKeys);
  rattn::SearchParams sp;
  sp.k = 20;
  const rattn::harness::SearchQuality r = rattn::harness::measure_search(
      *index, view, q.data(), exact, sp, 0, rattn::harness::all_queries(kQueries), 20);
  EXPECT_DOUBLE_EQ(r.recall, 1.0);
  EXPECT_DOUBLE_EQ(r.scored_fraction, 1.0);
  EXPECT_DOUBLE_EQ(r.scored_min, 1.0);
  EXPECT_DOUBLE_EQ(r.scored_max, 1.0);
  EXPECT_GE(r.us_per_query, 0.0);
}

// Returns ids {first key, ...} and records the seeds each search was given.
class RecordingIndex final : public rattn::KeyIndex {
 public:
  std::unique_ptr<rattn::SearchScratch> make_scratch() const override { return std::make_unique<rattn::SearchScratch>(); }
  void search(const float* query, const rattn::RowsView& keys, const rattn::SearchParams& params, rattn::SearchScratch&,
              rattn::SearchResult& out) const override {
    seeds.emplace_back(params.seeds, params.seeds + params.num_seeds);
    out.ids.clear();
    for (int i = 0; i < params.k; ++i) out.ids.push_back(int32_t(calls * 10 + i));
    out.keys_scored = keys.rows / 2;
    ++calls;
    (void)query;
  }
  void insert(int32_t, const float*, const rattn::RowsView&) override {}
  int64_t size() const override { return 0; }
  size_t memory_bytes() const override { return 0; }
  void serialize(std::string*) const override {}
  mutable std::vector<std::vector<int32_t>> seeds;
  mutable int calls = 0;
};

TEST(IndexHarness, SearchesAreSeededByThePreviousQueryOnlyWhenItIsTheOneBefore) {
  const std::vector<float> keys = random_normal(size_t(100) * kDim, 5), q = random_normal(size_t(10) * kDim, 6);
  const rattn::RowsView view{keys.data(), rattn::DType::f32, 100, kDim};
  const IdLists exact(10, std::vector<int32_t>{0, 1, 2});
  RecordingIndex index;
  rattn::SearchParams sp;
  sp.k = 5;
  // Queries 0, 1, 2 chain; 5 follows 2 (no seeds); 6 follows 5.
  const rattn::harness::SearchQuality r =
      rattn::harness::measure_search(index, view, q.data(), exact, sp, 3, {0, 1, 2, 5, 6}, 3);
  ASSERT_EQ(index.seeds.size(), 5u);
  EXPECT_TRUE(index.seeds[0].empty());
  EXPECT_EQ(index.seeds[1], (std::vector<int32_t>{0, 1, 2}));    // the first 3 of search 0's results
  EXPECT_EQ(index.seeds[2], (std::vector<int32_t>{10, 11, 12}));
  EXPECT_TRUE(index.seeds[3].empty());
  EXPECT_EQ(index.seeds[4], (std::vector<int32_t>{30, 31, 32}));
  EXPECT_DOUBLE_EQ(r.scored_fraction, 0.5);
  // Only search 0 returns ids 0, 1, 2: recall 1 there, 0 elsewhere.
  EXPECT_DOUBLE_EQ(r.recall, 1.0 / 5);
}

TEST(IndexHarness, BuildHeadIndexesTheKeysAndListsTheTestQueriesTopK) {
  const int64_t n = 400, m = 12;
  const std::vector<float> keys = random_normal(size_t(n) * kDim, 7), q = random_normal(size_t(n + m) * kDim, 8);
  const rattn::RowsView view{keys.data(), rattn::DType::f32, n, kDim};
  rattn::GraphBuildParams bp;
  bp.threads = 1;
  double build_s = 0;
  const rattn::harness::HeadIndex h =
      rattn::harness::build_head(view, q.data(), n, bp, q.data() + size_t(n) * kDim, m, 10, &build_s);
  ASSERT_NE(h.index, nullptr);
  EXPECT_EQ(h.index->size(), n);
  EXPECT_GT(build_s, 0.0);
  ASSERT_EQ(h.exact.size(), size_t(m));
  for (int64_t i = 0; i < m; ++i) EXPECT_EQ(h.exact[size_t(i)], top_k_f64(h.test + size_t(i) * kDim, keys, n, 10));
  // A queue over every key finds the exact top-k.
  rattn::SearchParams sp;
  sp.k = 10;
  sp.queue_length = int(n);
  const auto r = rattn::harness::measure_search(*h.index, h.keys, h.test, h.exact, sp, 0, rattn::harness::all_queries(m), 10);
  EXPECT_DOUBLE_EQ(r.recall, 1.0);
  // recall_depth counts only the best 3 of the 10 ids kept: against lists
  // whose first 3 are the exact ones and the other 7 keys it never finds,
  // recall@10 is 0.3 and recall over the best 3 is 1, from the same ids.
  rattn::harness::IdLists lists = h.exact, ids, ids_deep;
  for (int64_t i = 0; i < m; ++i) {
    std::vector<int32_t>& l = lists[size_t(i)];
    int32_t next = 0;
    for (size_t j = 3; j < l.size(); ++j) {
      while (std::find(h.exact[size_t(i)].begin(), h.exact[size_t(i)].end(), next) != h.exact[size_t(i)].end()) ++next;
      l[j] = next++;
    }
  }
  const auto all = rattn::harness::measure_search(*h.index, h.keys, h.test, lists, sp, 0,
                                                  rattn::harness::all_queries(m), 10, &ids);
  const auto top3 = rattn::harness::measure_search(*h.index, h.keys, h.test, lists, sp, 0,
                                                   rattn::harness::all_queries(m), 10, &ids_deep, 3);
  EXPECT_EQ(ids, ids_deep);
  for (const auto& l : ids) EXPECT_EQ(l.size(), 10u);
  EXPECT_NEAR(all.recall, 0.3, 1e-12);
  EXPECT_DOUBLE_EQ(top3.recall, 1.0);
}

// build_group: without shared_graph one index per head (each its own
// build_head); with it one index, built from the heads' training rows pooled
// head after head (the same graph as a build over the pooled rows), which
// every head holds. Each head keeps its own test queries and exact lists.
TEST(IndexHarness, BuildGroupSharesOneIndexBuiltFromThePooledQueries) {
  const int group = 3;
  const int64_t n = 300, m = 6;
  const std::vector<float> keys = random_normal(size_t(n) * kDim, 21);
  std::vector<std::vector<float>> q;
  std::vector<const float*> train, test;
  for (int g = 0; g < group; ++g) q.push_back(random_normal(size_t(n + m) * kDim, 22 + uint64_t(g)));
  for (const auto& x : q) {
    train.push_back(x.data());
    test.push_back(x.data() + size_t(n) * kDim);
  }
  const rattn::RowsView view{keys.data(), rattn::DType::f32, n, kDim};
  rattn::GraphBuildParams bp;
  bp.threads = 1;
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared" : "per head");
    double build_s = 0;
    const auto heads =
        rattn::harness::build_group(view, train.data(), n, test.data(), group, shared, bp, m, 10, &build_s);
    ASSERT_EQ(heads.size(), size_t(group));
    EXPECT_GT(build_s, 0.0);
    for (int g = 0; g < group; ++g) {
      const auto& h = heads[size_t(g)];
      ASSERT_NE(h.index, nullptr);
      EXPECT_EQ(h.index->size(), n);
      EXPECT_EQ(h.test, test[size_t(g)]);
      ASSERT_EQ(h.exact.size(), size_t(m));
      for (int64_t i = 0; i < m; ++i) EXPECT_EQ(h.exact[size_t(i)], top_k_f64(h.test + size_t(i) * kDim, keys, n, 10));
      EXPECT_EQ(h.index == heads[0].index, shared || g == 0) << "head " << g;
    }
    if (!shared) continue;
    std::vector<float> pooled;
    for (const auto& x : q) pooled.insert(pooled.end(), x.begin(), x.begin() + std::ptrdiff_t(n * kDim));
    const auto alone = rattn::build_projected_graph(view, pooled.data(), group * n, bp);
    std::string a, b;
    heads[0].index->serialize(&a);
    alone->serialize(&b);
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << "the shared index is not the pooled rows' graph";
  }
}

}  // namespace
