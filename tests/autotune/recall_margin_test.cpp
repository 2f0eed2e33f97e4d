// The tuner's guard against choosing on noise: a recall's standard error
// from runs of consecutive queries, the one-sided margin a tuning recall
// must clear, and the index size each window's static set leaves.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "autotune/plan_measure.h"
#include "autotune/search_tuner.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "harness/index_harness.h"

namespace rattn {
namespace {

constexpr int kDim = 32;

std::vector<float> random_normal(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

TEST(RecallMargin, ConfidenceIsTheOneSidedNormalQuantile) {
  EXPECT_NEAR(confidence_z(0.5), 0.0, 1e-9);
  EXPECT_NEAR(confidence_z(0.95), 1.6448536, 1e-6);
  EXPECT_NEAR(confidence_z(0.975), 1.9599640, 1e-6);
  EXPECT_NEAR(confidence_z(0.999), 3.0902323, 1e-6);
  EXPECT_THROW(confidence_z(0.4), Error);
  EXPECT_THROW(confidence_z(1.0), Error);
  EXPECT_THROW(confidence_z(std::nan("")), Error);
  SearchTrial t;
  t.recall = 0.96;
  t.recall_se = 0.01;
  EXPECT_NEAR(recall_lower_bound(t, 0.95), 0.96 - 0.016448536, 1e-8);
  EXPECT_DOUBLE_EQ(recall_lower_bound(t, 0.5), 0.96);
}

// The model check's agreement bound: Wilson's lower bound, checked against
// the bound found another way (bisecting for the rate p < hits/n at which
// the observed rate is z standard errors of p above it), and the most
// misses it allows.
TEST(RecallMargin, TheAgreementBoundIsWilsonsLowerBound) {
  const double z = confidence_z(0.95);
  auto bisected = [&](int64_t hits, int64_t n) {
    const double observed = double(hits) / double(n);
    double lo = 0, hi = observed;
    for (int i = 0; i < 200; ++i) {
      const double p = 0.5 * (lo + hi);
      ((observed - p) > z * std::sqrt(p * (1 - p) / double(n)) ? lo : hi) = p;
    }
    return 0.5 * (lo + hi);
  };
  for (const auto& [hits, n] : std::vector<std::pair<int64_t, int64_t>>{{1024, 1024}, {1019, 1024}, {250, 256},
                                                                          {3, 10}, {0, 7}})
    EXPECT_NEAR(rate_lower_bound(hits, n, 0.95), bisected(hits, n), 1e-9) << hits << " of " << n;
  EXPECT_DOUBLE_EQ(rate_lower_bound(9, 10, 0.5), 0.9);
  EXPECT_LT(rate_lower_bound(256, 256, 0.95), 0.99);  // no flip in 256 does not show 0.99
  EXPECT_THROW(rate_lower_bound(5, 4, 0.95), Error);
  EXPECT_THROW(rate_lower_bound(0, 0, 0.95), Error);
  for (int64_t n : {256, 512, 1024, 4096}) {
    const int64_t m = most_misses_allowed(n, 0.99, 0.95);
    if (m >= 0) {
      EXPECT_GE(rate_lower_bound(n - m, n, 0.95), 0.99) << n;
    }
    EXPECT_LT(rate_lower_bound(n - m - 1, n, 0.95), 0.99) << n;
  }
  EXPECT_EQ(most_misses_allowed(256, 0.99, 0.95), -1);
  EXPECT_EQ(most_misses_allowed(512, 0.99, 0.95), 1);
  EXPECT_EQ(most_misses_allowed(1024, 0.99, 0.95), 5);
  EXPECT_EQ(most_misses_allowed(100, 0.9, 0.5), 10);
}

// The standard error evaluate_search reports is that of the means of runs
// of kRecallRunLength consecutive queries (each query's recall the mean over
// the heads), recomputed here in float64 from the ids it returned.
TEST(RecallMargin, TheStandardErrorIsThatOfTheRunsMeans) {
  const int64_t n = 600, m = 64;
  const int k = 10;
  const std::vector<float> keys = random_normal(size_t(n) * kDim, 3);
  const RowsView view{keys.data(), DType::f32, n, kDim};
  std::vector<std::vector<float>> queries;
  std::vector<harness::HeadIndex> heads;
  GraphBuildParams bp;
  bp.threads = 1;
  bp.degree = 8;
  for (int h = 0; h < 2; ++h) {
    queries.push_back(random_normal(size_t(n + m) * kDim, 10 + uint64_t(h)));
    heads.push_back(harness::build_head(view, queries.back().data(), n, bp, queries.back().data() + size_t(n) * kDim, m, k));
  }
  const ConcretePlan plan = default_concrete_plan(RetrievalPlan{});
  std::vector<int> order;
  for (int i = 0; i < m; ++i) order.push_back(i);
  // A short queue: recall varies from query to query.
  const DecodeSearch s{12, 0, 0, 0, 0};
  std::vector<harness::IdLists> ids;
  const SearchTrial t = evaluate_search(heads, s, plan, order, k, &ids);
  std::vector<double> per_query(size_t(m), 0.0);
  for (size_t h = 0; h < heads.size(); ++h)
    for (int64_t i = 0; i < m; ++i) {
      const std::set<int32_t> want(heads[h].exact[size_t(i)].begin(), heads[h].exact[size_t(i)].begin() + k);
      int found = 0;
      for (int32_t id : ids[h][size_t(i)]) found += int(want.count(id));
      per_query[size_t(i)] += double(found) / k / double(heads.size());
    }
  std::vector<double> runs;
  for (int64_t j = 0; j + kRecallRunLength <= m; j += kRecallRunLength) {
    double sum = 0;
    for (int64_t i = j; i < j + kRecallRunLength; ++i) sum += per_query[size_t(i)];
    runs.push_back(sum / kRecallRunLength);
  }
  double mean = 0, var = 0;
  for (double r : runs) mean += r / double(runs.size());
  for (double r : runs) var += (r - mean) * (r - mean) / double(runs.size() - 1);
  EXPECT_NEAR(t.recall, mean, 1e-12);
  ASSERT_GT(var, 0.0) << "the data should give recalls that vary";
  EXPECT_NEAR(t.recall_se, std::sqrt(var / double(runs.size())), 1e-12);
  // Fewer queries than two runs: no estimate, no margin.
  const SearchTrial one = evaluate_search(heads, s, plan, {0, 1, 2}, k);
  EXPECT_EQ(one.recall_se, 0.0);
}

// The runtime indexes the tokens before a window's static set; windows whose
// indexes differ by at most kIndexShareTolerance share the larger one.
TEST(RecallMargin, EachWindowIndexesTheKeysBeforeItsStaticSet) {
  const int64_t n = 130816;
  const auto w = index_keys_per_window(n, {8192, 512, 32768, 2048}, 500);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w.at(512), n - 511);
  EXPECT_EQ(w.at(2048), n - 511);  // within 15% of n - 511
  EXPECT_EQ(w.at(8192), n - 511);
  EXPECT_EQ(w.at(32768), n - 32767);
  // A window past the keys leaves the floor: a quarter of them.
  const auto big = index_keys_per_window(65280, {512, 65536}, 100);
  EXPECT_EQ(big.at(512), 65280 - 511);
  EXPECT_EQ(big.at(65536), 65280 / 4);
  // A small context: at least 4 top_k keys.
  EXPECT_EQ(index_keys_per_window(1000, {900}, 200).at(900), 800);
}

}  // namespace
}  // namespace rattn
