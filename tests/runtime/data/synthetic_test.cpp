// Synthetic data: deterministic, out of distribution (Mahalanobis ratio >= 5),
// sinks score high for every query, late queries attend to recent and distant keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "tests/runtime/data/synthetic_checks.h"

namespace rattn {
namespace {

std::vector<int64_t> top_ids(const SyntheticHead& h, const float* q, int64_t upto, int k) {
  std::vector<double> s(static_cast<size_t>(upto));
  for (int64_t i = 0; i < upto; ++i) {
    double a = 0;
    for (int j = 0; j < h.head_dim; ++j) a += double(q[j]) * h.keys[size_t(i) * size_t(h.head_dim) + size_t(j)];
    s[size_t(i)] = a;
  }
  std::vector<int64_t> ids(static_cast<size_t>(upto));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
  ids.resize(size_t(k));
  return ids;
}

TEST(Synthetic, DeterministicBySeed) {
  const auto a = expect_deterministic_by_seed(spec_of<SyntheticSpec>(300, 32, 2), make_synthetic);
  EXPECT_EQ(a.queries.size(), size_t(2 * 300 * 32));
}

TEST(Synthetic, MahalanobisRatioAtLeastFiveOnDefaultSpec) {
  SyntheticSpec spec;
  spec.tokens = 4096;  // default head_dim 128, group 4
  const auto h = make_synthetic(spec);
  const double ratio = mahalanobis_ratio(h);
  RecordProperty("mahalanobis_ratio", std::to_string(ratio));
  EXPECT_GE(ratio, 5.0);
  // The keys against themselves give ratio 1 by definition.
  EXPECT_NEAR(mahalanobis_ratio(h.keys.data(), h.tokens, h.keys.data(), h.tokens, h.head_dim), 1.0, 1e-9);
}

TEST(Synthetic, MahalanobisOfShiftedGaussianMatchesTheory) {
  // Identity covariance, queries shifted by 20 along one axis: distance ~20 vs
  // sqrt(d) for keys, so the ratio is ~20 / sqrt(d - 0.5).
  const int d = 16;
  const int64_t n = 20000;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(n) * d), q(size_t(n) * d);
  for (auto& x : k) x = nd(rng);
  for (size_t i = 0; i < q.size(); ++i) q[i] = nd(rng) + (i % d == 0 ? 20.0f : 0.0f);
  const double expect = std::sqrt(400.0 + d) / std::sqrt(double(d) - 0.5);
  EXPECT_NEAR(mahalanobis_ratio(k.data(), n, q.data(), n, d), expect, 0.05 * expect);
}

TEST(Synthetic, LateQueriesBehaveLikeDecodeQueries) {
  SyntheticSpec spec;
  spec.tokens = 6000;
  spec.group = 2;
  const auto h = make_synthetic(spec);
  int sink_hits = 0, recent_hits = 0, distant_hits = 0, queries = 0;
  for (int g = 0; g < spec.group; ++g) {
    for (int64_t t = spec.tokens - 40; t < spec.tokens; ++t) {
      const auto top = top_ids(h, h.query(g, t), t + 1, 100);
      ++queries;
      sink_hits += std::count_if(top.begin(), top.end(), [&](int64_t i) { return i < spec.sink_tokens; }) > 0;
      recent_hits += std::count_if(top.begin(), top.end(), [&](int64_t i) { return t - i < 512; }) > 0;
      distant_hits += std::count_if(top.begin(), top.end(),
                                    [&](int64_t i) { return i >= spec.sink_tokens && t - i >= 512; }) > 0;
    }
  }
  EXPECT_GE(sink_hits, queries * 9 / 10);
  EXPECT_GE(recent_hits, queries * 6 / 10);
  EXPECT_GE(distant_hits, queries * 9 / 10);
}

TEST(Synthetic, RejectsBadSpec) {
  SyntheticSpec spec;
  spec.head_dim = 30;
  EXPECT_THROW(make_synthetic(spec), Error);
  spec.head_dim = 32;
  spec.tokens = 0;
  EXPECT_THROW(make_synthetic(spec), Error);
}

TEST(Synthetic, RopeIsARotationByPosition) {
  const int d = 8;
  std::vector<float> a{1, 2, 3, 4, 5, 6, 7, 8}, b{-1, 0.5, 2, -3, 1, 1, -2, 0.25};
  // <R_m a, R_n b> depends only on n - m.
  auto dot = [&](std::vector<float> x, int64_t px, std::vector<float> y, int64_t py) {
    apply_rope(x.data(), d, px, 10000.0);
    apply_rope(y.data(), d, py, 10000.0);
    double s = 0;
    for (int j = 0; j < d; ++j) s += double(x[j]) * y[j];
    return s;
  };
  EXPECT_NEAR(dot(a, 5, b, 12), dot(a, 105, b, 112), 1e-4);
  EXPECT_NEAR(dot(a, 0, b, 0), 1 * -1 + 2 * 0.5 + 3 * 2 + 4 * -3 + 5 + 6 - 14 + 2, 1e-5);
}

}  // namespace
}  // namespace rattn
