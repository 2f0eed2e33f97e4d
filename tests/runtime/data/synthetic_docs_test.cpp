// The document distribution: deterministic; its statistics are the ones its
// header states (power-law key spectrum, steeper query spectrum, RoPE base,
// document lengths, sinks) and differ from the topics generator's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rope.h"
#include "runtime/data/synthetic_docs.h"
#include "tests/runtime/data/synthetic_checks.h"

namespace rattn {
namespace {

// Variance of each RoPE pair (sum over its two dims) over rows [r0, r1);
// a rotation within a pair keeps the pair's energy, so this is RoPE-invariant.
std::vector<double> pair_variances(const float* rows, int64_t r0, int64_t r1, int d) {
  const int h = d / 2;
  std::vector<double> mean(static_cast<size_t>(d), 0.0), var(static_cast<size_t>(h), 0.0);
  for (int64_t t = r0; t < r1; ++t)
    for (int j = 0; j < d; ++j) mean[size_t(j)] += rows[size_t(t) * size_t(d) + size_t(j)];
  for (auto& m : mean) m /= double(r1 - r0);
  for (int64_t t = r0; t < r1; ++t)
    for (int j = 0; j < d; ++j) {
      const double x = rows[size_t(t) * size_t(d) + size_t(j)] - mean[size_t(j)];
      var[size_t(j % h)] += x * x;
    }
  for (auto& v : var) v /= double(r1 - r0 - 1);
  return var;
}

// Least-squares slope of log(variance) against log(rank + 1) over the sorted
// variances, ranks [skip, n).
double log_log_slope(std::vector<double> v, int skip) {
  std::sort(v.begin(), v.end(), std::greater<>());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int n = 0;
  for (size_t r = size_t(skip); r < v.size(); ++r) {
    const double x = std::log(double(r - size_t(skip) + 1)), y = std::log(v[r]);
    sx += x, sy += y, sxx += x * x, sxy += x * y, ++n;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

TEST(DocumentSynthetic, DeterministicBySeed) {
  const auto a = expect_deterministic_by_seed(spec_of<DocumentSpec>(600, 32, 2), make_document_synthetic);
  EXPECT_EQ(a.queries.size(), size_t(2 * 600 * 32));
  // A different generator: not the topics set with the same seed.
  EXPECT_NE(make_named_synthetic("topics", 600, 32, 2, 1).keys, a.keys);
  EXPECT_EQ(make_named_synthetic("documents", 600, 32, 2, 1).keys, a.keys);
}

TEST(DocumentSynthetic, BadSpecThrows) {
  DocumentSpec spec;
  spec.head_dim = 30;
  EXPECT_THROW(make_document_synthetic(spec), Error);
  spec = DocumentSpec{};
  spec.local_query_fraction = 0.8;
  spec.recall_query_fraction = 0.5;
  EXPECT_THROW(make_document_synthetic(spec), Error);
  spec = DocumentSpec{};
  spec.massive_pairs = 40;
  EXPECT_THROW(make_document_synthetic(spec), Error);
  EXPECT_THROW(make_named_synthetic("nope", 100, 32, 1, 1), Error);
  EXPECT_THROW(synthetic_rope_base("nope"), Error);
  EXPECT_FALSE(is_synthetic_distribution("nope"));
  EXPECT_TRUE(is_synthetic_distribution("documents"));
}

TEST(DocumentSynthetic, KeySpectrumFollowsItsPowerLawAndQueriesDecaySteeper) {
  auto spec = spec_of<DocumentSpec>(8192, 128, 1);
  spec.massive_pairs = 1;
  spec.delimiter_fraction = 0;  // sinks would add their own direction
  const auto h = make_document_synthetic(spec);
  // Keys past the sink; the massive pair (largest variance) is skipped.
  const double key_slope = log_log_slope(pair_variances(h.keys.data(), 1, h.tokens, h.head_dim), 1);
  RecordProperty("key_slope", std::to_string(key_slope));
  EXPECT_NEAR(key_slope, -spec.key_power, 0.2);
  // Queries carry topic and key copies too (key-shaped), so their measured
  // slope lies between the two powers, but clearly steeper than the keys'.
  const double q_slope = log_log_slope(pair_variances(h.queries.data(), 0, h.tokens, h.head_dim), 1);
  RecordProperty("query_slope", std::to_string(q_slope));
  EXPECT_LT(q_slope, key_slope - 0.15);
  // The topics generator decays exponentially per dimension: its sorted key
  // variances fit no such power law (the log-log slope of its flat floor is
  // far from -0.8).
  const auto other = make_named_synthetic("topics", 8192, 128, 1, 1);
  const double other_slope = log_log_slope(pair_variances(other.keys.data(), 4, other.tokens, 128), 1);
  RecordProperty("topics_key_slope", std::to_string(other_slope));
  EXPECT_GT(std::abs(other_slope - key_slope), 0.2);
}

// Keys carry a pre-RoPE component shared by every token: un-rotating them
// with the generator's base makes it coherent (a large mean), another base
// leaves it spinning (a small mean). Pair 0 turns by the position whatever
// the base, so only pairs 1 .. d/8 (fast, but base-dependent) count.
double unrotated_mean_norm(const SyntheticHead& h, double base) {
  const int d = h.head_dim;
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  std::vector<float> k(static_cast<size_t>(d));
  for (int64_t t = 1; t < h.tokens; ++t) {
    RopeAngles(d, -double(t), base).rotate(h.keys.data() + size_t(t) * size_t(d), k.data(), false);
    for (int j = 0; j < d; ++j) mean[size_t(j)] += k[size_t(j)];
  }
  double n2 = 0;
  for (int i = 1; i <= d / 8; ++i)
    for (int j : {i, i + d / 2}) n2 += (mean[size_t(j)] / double(h.tokens - 1)) * (mean[size_t(j)] / double(h.tokens - 1));
  return std::sqrt(n2);
}

TEST(DocumentSynthetic, RopeBaseIsTheStatedOne) {
  auto spec = spec_of<DocumentSpec>(8192, 64, 1);
  const auto h = make_document_synthetic(spec);
  EXPECT_EQ(synthetic_rope_base("documents"), 10000.0);
  EXPECT_EQ(synthetic_rope_base("topics"), 500000.0);
  const double right = unrotated_mean_norm(h, 10000.0), wrong = unrotated_mean_norm(h, 500000.0);
  RecordProperty("right_base_mean", std::to_string(right));
  RecordProperty("wrong_base_mean", std::to_string(wrong));
  EXPECT_GT(right, 3.0 * wrong);
  // With base 10000 the slow pairs turn much faster than with 500000.
  spec.rope_base = 500000.0;
  const auto h5 = make_document_synthetic(spec);
  EXPECT_GT(unrotated_mean_norm(h5, 500000.0), 3.0 * unrotated_mean_norm(h5, 10000.0));
}

TEST(DocumentSynthetic, DocumentsAreLongRunsAndQueriesFindTheirTargets) {
  const auto spec = spec_of<DocumentSpec>(20000, 64, 1);
  const auto h = make_document_synthetic(spec);
  // Runs of one topic: geometric lengths with mean 384 (two documents may
  // draw the same topic, so runs are slightly longer).
  int64_t runs = 1;
  for (int64_t t = 1; t < h.tokens; ++t) runs += h.topic_of[size_t(t)] != h.topic_of[size_t(t - 1)];
  const double mean_run = double(h.tokens) / double(runs);
  EXPECT_GT(mean_run, 0.75 * double(spec.mean_document));
  EXPECT_LT(mean_run, 1.6 * double(spec.mean_document));
  // Theme popularity is Zipf: theme 0 holds more tokens than the last one.
  const int64_t subs = std::max<int64_t>(4, spec.tokens / (int64_t(spec.themes) * spec.tokens_per_subtopic));
  std::vector<int64_t> per_theme(size_t(spec.themes), 0);
  for (int32_t c : h.topic_of) ++per_theme[size_t(c / subs)];
  EXPECT_GT(per_theme.front(), 2 * per_theme.back());
  // Query mix and the sink: the sink (key 0) is among the top-10 of almost
  // every late query; a copy query ranks its key in its top-100 mostly (the
  // delimiters, weak sinks, crowd the first places).
  int copies = 0, copy_hits = 0, sink_hits = 0, late = 0;
  const int d = h.head_dim;
  for (int64_t t = h.tokens - 400; t < h.tokens; ++t) {
    const float* q = h.query(0, t);
    std::vector<std::pair<double, int64_t>> s(static_cast<size_t>(t + 1));
    for (int64_t j = 0; j <= t; ++j) {
      double a = 0;
      for (int c = 0; c < d; ++c) a += double(q[c]) * h.keys[size_t(j) * size_t(d) + size_t(c)];
      s[size_t(j)] = {-a, j};
    }
    std::partial_sort(s.begin(), s.begin() + 100, s.end());
    ++late;
    const int64_t target = h.target_key[size_t(t)];
    bool sink = false, hit = false;
    for (int i = 0; i < 100; ++i) {
      sink |= i < 10 && s[size_t(i)].second == 0;
      hit |= s[size_t(i)].second == target;
    }
    sink_hits += sink;
    if (target >= 0) {
      ++copies;
      copy_hits += hit;
    }
  }
  EXPECT_GE(sink_hits, late * 9 / 10);
  EXPECT_GT(copies, late / 10);
  EXPECT_LT(copies, late * 3 / 10);
  RecordProperty("copy_hits", std::to_string(copy_hits) + "/" + std::to_string(copies));
  EXPECT_GE(copy_hits, copies * 7 / 10);
}

}  // namespace
}  // namespace rattn
