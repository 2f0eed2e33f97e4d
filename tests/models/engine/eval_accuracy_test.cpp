// `rattn eval`'s accuracy measures against float64 references: KL divergence,
// top-2 margin, the bootstrap interval of the perplexity change, and the
// exact check's gates.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/stats.h"
#include "models/engine/eval_accuracy.h"

namespace rattn::engine {
namespace {

TEST(EvalAccuracy, KlDivergenceMatchesTheDefinition) {
  const std::vector<float> p{2.0f, 1.0f, -1.0f, 0.5f}, q{1.5f, 1.2f, -0.5f, 0.0f};
  // Reference: softmax and sum p log(p/q), long double.
  auto softmax = [](const std::vector<float>& x) {
    long double s = 0;
    for (float v : x) s += std::exp((long double)v);
    std::vector<long double> out;
    for (float v : x) out.push_back(std::exp((long double)v) / s);
    return out;
  };
  const auto P = softmax(p), Q = softmax(q);
  long double ref = 0;
  for (size_t i = 0; i < P.size(); ++i) ref += P[i] * std::log(P[i] / Q[i]);
  EXPECT_NEAR(kl_divergence(p.data(), q.data(), 4), double(ref), 1e-12);
  EXPECT_EQ(kl_divergence(p.data(), p.data(), 4), 0.0);
  // A constant shift of the logits is the same distribution.
  std::vector<float> shifted(p);
  for (float& v : shifted) v += 3.0f;
  EXPECT_NEAR(kl_divergence(p.data(), shifted.data(), 4), 0.0, 1e-12);
  EXPECT_NEAR(token_nll(p.data(), 4, 1), -double(std::log(P[1])), 1e-12);
}

TEST(EvalAccuracy, TopTwoMarginAndQuantile) {
  const std::vector<float> x{0.5f, 3.0f, 2.75f, -1.0f};
  EXPECT_DOUBLE_EQ(top2_margin(x.data(), 4), 0.25);
  const std::vector<float> tie{1.0f, 1.0f};
  EXPECT_DOUBLE_EQ(top2_margin(tie.data(), 2), 0.0);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 1.0), 4.0);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.0), 1.0);
}

TEST(EvalAccuracy, PerplexityDeltaIntervalIsSeededAndCoversTheNoise) {
  // Zero-mean noise of sd 0.5 over 256 tokens: the change's interval must
  // include zero; a shift of +0.2 nats per token must exclude it.
  std::mt19937 rng(11);
  std::normal_distribution<double> nd(0.0, 0.5);
  std::vector<double> noise(256);
  for (double& v : noise) v = nd(rng);
  double m = 0;
  for (double v : noise) m += v;
  m /= 256;
  for (double& v : noise) v -= m;  // exactly zero mean: delta 0
  const PerplexityDelta a = perplexity_delta(noise, 2000, 1), b = perplexity_delta(noise, 2000, 1);
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
  EXPECT_NEAR(a.delta, 0.0, 1e-12);
  EXPECT_LT(a.lo, 0.0);
  EXPECT_GT(a.hi, 0.0);
  EXPECT_FALSE(a.excludes_zero());
  // The standard error of the mean is 0.5 / 16 = 0.031 nats: the 95% interval
  // spans about +-1.96 of it (bootstrap: within 20%).
  EXPECT_NEAR(std::log1p(a.hi) - std::log1p(a.lo), 2 * 1.96 * 0.5 / 16, 0.2 * 2 * 1.96 * 0.5 / 16);
  std::vector<double> shifted(noise);
  for (double& v : shifted) v += 0.2;
  const PerplexityDelta c = perplexity_delta(shifted, 2000, 1);
  EXPECT_NEAR(c.delta, std::expm1(0.2), 1e-12);
  EXPECT_TRUE(c.excludes_zero());
  EXPECT_GT(c.lo, 0.0);
}

ExactCheckStep step(double err, double margin, bool equal, double storage_rel = 0, double storage_abs = 0) {
  ExactCheckStep s;
  s.logits_rel_error = err;
  s.full_margin = margin;
  s.argmax_equal = equal;
  s.storage_rel_error = storage_rel;
  s.storage_abs_error = storage_abs;
  s.full_max_abs = 20.0;
  return s;
}

TEST(EvalAccuracy, ExactCheckGatesFollowTheStorageRounding) {
  // fp32 storage (no rounding measured): the floors, 1e-4 rel. and a tie
  // bound of 2 * 1e-4 * 20 = 4e-3.
  ExactCheckReport r = exact_check({step(3e-6, 1.0, true), step(5e-6, 0.003, false)});
  EXPECT_TRUE(r.pass) << r.reason;
  EXPECT_DOUBLE_EQ(r.logits_gate, 1e-4);
  ASSERT_EQ(r.near_ties.size(), 1u);
  EXPECT_EQ(r.near_ties[0].step, 1);
  EXPECT_TRUE(r.near_ties[0].flipped);
  EXPECT_NEAR(r.near_ties[0].bound, 4e-3, 1e-15);
  // A flip on a clear margin fails; so does an error over the floor.
  r = exact_check({step(3e-6, 1.0, true), step(5e-6, 0.5, false)});
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.failing_flips, std::vector<int64_t>{1});
  r = exact_check({step(1.1e-3, 1.0, true)});
  EXPECT_FALSE(r.pass);
  // f16 storage: the rounding's own error (rel. 6e-4, abs. 0.02 at some
  // step) widens both: gate 1e-4 + 2 * 6e-4, bound 2 * (2e-3 + 2 * 0.02).
  r = exact_check({step(1.1e-3, 1.0, true, 6e-4, 0.01), step(9e-4, 0.05, false, 5e-4, 0.02)});
  EXPECT_TRUE(r.pass) << r.reason;
  EXPECT_DOUBLE_EQ(r.logits_gate, 1e-4 + 2 * 6e-4);
  ASSERT_EQ(r.near_ties.size(), 1u);
  EXPECT_NEAR(r.near_ties[0].bound, 2 * (2e-3 + 2 * 0.02), 1e-15);
  // ... but not to a dropped token's error.
  r = exact_check({step(5e-3, 1.0, true, 6e-4, 0.01)});
  EXPECT_FALSE(r.pass);
}

}  // namespace
}  // namespace rattn::engine
