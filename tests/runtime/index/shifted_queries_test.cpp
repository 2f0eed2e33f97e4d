// RoPE-shifted training queries (GraphBuildParams::shift_queries): the copies
// equal the raw query rotated at the later position (float64 reference, both
// RoPE pairings); the build takes them (count, sampling) and they lift the
// recall of decode-position queries on the synthetic set; bad combinations
// are rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

// RoPE of `raw` at `position` in float64: pairs (i, i + d/2) or (2i, 2i + 1).
std::vector<double> rope64(const std::vector<double>& raw, int64_t position, double base, bool interleaved) {
  const int d = int(raw.size()), half = d / 2;
  std::vector<double> out(raw);
  for (int i = 0; i < half; ++i) {
    const double angle = double(position) * std::pow(base, -2.0 * i / d);
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    out[size_t(a)] = raw[size_t(a)] * std::cos(angle) - raw[size_t(b)] * std::sin(angle);
    out[size_t(b)] = raw[size_t(a)] * std::sin(angle) + raw[size_t(b)] * std::cos(angle);
  }
  return out;
}

class ShiftedCopies : public ::testing::TestWithParam<bool> {};

// Copy j of query t (shift s_j) must be the raw query at position t + s_j.
TEST_P(ShiftedCopies, EqualTheRawQueryRotatedAtTheLaterPosition) {
  const bool interleaved = GetParam();
  constexpr int d = 64;
  constexpr int64_t n = 50, first_position = 30000;
  GraphBuildParams p;
  p.shift_queries = 20;  // the last 20 of 50
  p.shift_span = 1000;   // shifts 125, 250, 500, 1000
  p.rope_base = 1e6;
  p.rope_interleaved = interleaved;
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd(0.0, 3.0);
  std::vector<std::vector<double>> raw(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(d)));
  std::vector<float> queries(size_t(n) * d);
  for (int64_t t = 0; t < n; ++t) {
    for (double& x : raw[size_t(t)]) x = nd(rng);
    const std::vector<double> q = rope64(raw[size_t(t)], first_position + t, p.rope_base, interleaved);
    for (int j = 0; j < d; ++j) queries[size_t(t) * d + size_t(j)] = float(q[size_t(j)]);
  }
  const std::vector<float> copies = internal::rope_shifted_queries(queries.data(), n, d, p);
  ASSERT_EQ(copies.size(), size_t(4 * 20 * d));
  const int shifts[4] = {125, 250, 500, 1000};
  double worst = 0;
  for (int c = 0; c < 4; ++c)
    for (int64_t i = 0; i < 20; ++i) {
      const int64_t t = n - 20 + i;
      const std::vector<double> want = rope64(raw[size_t(t)], first_position + t + shifts[c], p.rope_base, interleaved);
      const float* got = &copies[(size_t(c) * 20 + size_t(i)) * d];
      for (int j = 0; j < d; ++j) worst = std::max(worst, std::abs(double(got[j]) - want[size_t(j)]));
    }
  // |q| components ~3: float32 rounding of the input and output, plus the
  // float32 input rotated again (about 1e-6 relative per step).
  EXPECT_LT(worst, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Pairs, ShiftedCopies, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "gptj" : "neox"; });

TEST(ShiftedQueries, OffByDefaultAndCappedAtTheQueryCount) {
  GraphBuildParams p;
  const std::vector<float> q = testing::random_rows(10, 8, 1);
  EXPECT_TRUE(internal::rope_shifted_queries(q.data(), 10, 8, p).empty());
  p.shift_queries = 1000;
  EXPECT_EQ(internal::rope_shifted_queries(q.data(), 10, 8, p).size(), size_t(4 * 10 * 8));
}

struct Set {
  SyntheticHead head;
  int64_t context, m;
  RowStore keys{DType::f32, 128};
};

Set make_set() {
  SyntheticSpec spec;  // rope base 500000, d 128, queries targeting distant keys
  spec.tokens = 16384;
  spec.group = 1;
  spec.seed = 1;
  Set s{make_synthetic(spec), 16384 - 256, 256};
  s.keys.append_f32(s.head.keys.data(), s.context);
  return s;
}

double recall_at(const KeyIndex& index, const Set& s, int L) {
  return testing::mean_recall(index, s.keys, s.context, s.m, 100, L,
                              [&](int64_t i) { return s.head.query(0, s.context + i); });
}

// The decode queries are the 256 positions after the context; the copies of
// the last 1024 training queries moved 64..512 positions stand in for them.
// Measured: recall@100 at L = 100 0.931 -> 0.957 (`rattn bench index
// --synthetic 16384 --queries 256 --key-metric 2 ...`, the same set).
TEST(ShiftedQueries, LiftRecallOfDecodePositionQueries) {
  const Set s = make_set();
  GraphBuildParams p;
  p.key_metric = 2;
  p.sample_fraction = 0.2;
  p.repair_fraction = 1.0;
  p.rope_base = SyntheticSpec{}.rope_base;
  const auto plain = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, p);
  p.shift_queries = 1024;
  p.shift_span = 512;
  const auto shifted = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, p);
  const GraphInfo info = projected_graph_info(*shifted);
  EXPECT_EQ(info.shifted_queries, 4 * 1024);
  // A 20% sample of context + 4096 queries.
  EXPECT_NEAR(double(info.training_queries), 0.2 * double(s.context + 4096), 1.0);
  EXPECT_EQ(projected_graph_info(*plain).shifted_queries, 0);
  const double r_plain = recall_at(*plain, s, 100), r_shifted = recall_at(*shifted, s, 100);
  EXPECT_GT(r_shifted, r_plain + 0.01) << "plain " << r_plain << ", shifted " << r_shifted;
}

TEST(ShiftedQueries, BadCombinationsAreRejected) {
  const std::vector<float> keys = testing::random_rows(300, 16, 2);
  const std::vector<float> queries = testing::random_rows(300, 16, 3);
  const RowsView kv{keys.data(), DType::f32, 300, 16};
  GraphBuildParams p;
  p.degree = 8;
  p.query_neighbors = 10;
  p.shift_queries = 50;
  auto expect_invalid = [&](const GraphBuildParams& bad) {
    try {
      build_projected_graph(kv, queries.data(), 300, bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    }
  };
  GraphBuildParams causal = p;
  causal.causal = true;
  expect_invalid(causal);
  GraphBuildParams short_span = p;
  short_span.shift_span = 4;
  expect_invalid(short_span);
  GraphBuildParams bad_base = p;
  bad_base.rope_base = 0.5;
  expect_invalid(bad_base);
  GraphBuildParams negative = p;
  negative.shift_queries = -1;
  expect_invalid(negative);
  const std::vector<float> odd_keys = testing::random_rows(300, 15, 2), odd_q = testing::random_rows(300, 15, 3);
  try {
    build_projected_graph(RowsView{odd_keys.data(), DType::f32, 300, 15}, odd_q.data(), 300, p);
    ADD_FAILURE() << "odd head dim accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument);
  }
  // The valid plan builds and reports its copies.
  EXPECT_EQ(projected_graph_info(*build_projected_graph(kv, queries.data(), 300, p)).shifted_queries, 200);
}

}  // namespace
}  // namespace rattn
