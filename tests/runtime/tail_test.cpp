// The sampled tail estimate of the decode step (plan.tail_samples), checked
// against float64: (a) a sample covering every offloaded token gives exact
// attention; (b) a partial sample gives exactly the estimator computed in
// float64 from the same sample (internal::draw_tail_sample) and the exact
// top-k; (c) on flat attention the estimate cuts the error of top-k alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "rattn.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"
#include "tests/runtime/api_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::random_normal;
using rattn::testing::reference_attention;
using Stream = rattn::testing::TokenStream;

struct TailCase {
  int hq = 4, hkv = 2, d = 32;
  int64_t prompt = 300;
  int steps = 40;
  int sinks = 8, window = 16, top_k = 6, tail_samples = 0, insert_batch = 1;
  uint64_t seed = 7;
  float q_scale = 1.5f;
  rattn_dtype storage = RATTN_F32;
  rattn_kernels_kind kernels = RATTN_KERNELS_REFERENCE;
  rattn_index_kind index = RATTN_INDEX_EXACT;
};

// A context + sequence through the C API, prefilled on layer 1 of 2.
struct Decoder {
  rattn_context* ctx = nullptr;
  rattn_sequence* seq = nullptr;
  Decoder(const TailCase& s, const Stream& x) {
    rattn_context_params p = rattn_context_default_params();
    p.n_layers = 2;
    p.n_q_heads = s.hq;
    p.n_kv_heads = s.hkv;
    p.head_dim = s.d;
    p.sinks = s.sinks;
    p.window = s.window;
    p.top_k = s.top_k;
    p.search_queue = 16;
    p.kv_storage = s.storage;
    p.index_kind = s.index;
    p.kernels = s.kernels;
    p.insert_batch = s.insert_batch;
    p.n_threads = 2;
    p.use_gpu = false;
    p.seed = s.seed;
    p.tail_samples = s.tail_samples;
    EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    EXPECT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
    const auto q = x.prefix(x.q, s.hq, s.prompt), k = x.prefix(x.k, s.hkv, s.prompt), v = x.prefix(x.v, s.hkv, s.prompt);
    EXPECT_EQ(rattn_sequence_prefill(seq, 1, s.prompt, q.data(), k.data(), v.data(), RATTN_F32), RATTN_OK)
        << rattn_context_last_error(ctx);
  }
  ~Decoder() {
    rattn_sequence_free(seq);
    rattn_context_free(ctx);
  }
  void step(const Stream& x, int64_t t, float* out, float* lse) {
    const auto q = x.token(x.q, x.hq, t), k = x.token(x.k, x.hkv, t), v = x.token(x.v, x.hkv, t);
    ASSERT_EQ(rattn_sequence_decode(seq, 1, q.data(), k.data(), v.data(), RATTN_F32, out, lse), RATTN_OK)
        << rattn_context_last_error(ctx);
  }
};

// The estimator in float64 for one query head at token t (insert batch 1, so
// nothing is pending): static set = tokens [0, sinks) and (t - window, t];
// U = the offloaded tokens, CPU-store row r = token sinks + r; R = U's exact
// top_k by score; S' = sample \ R, weighted (|U| - |R|) / |S'|.
void reference_estimate(const float* q, const float* keys, const float* values, int d, int64_t t, int64_t sinks,
                        int64_t window, int64_t top_k, const std::vector<int32_t>& sample, double* out, double* lse) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> s(size_t(t + 1));
  for (int64_t j = 0; j <= t; ++j) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += double(q[i]) * double(keys[size_t(j) * size_t(d) + size_t(i)]);
    s[size_t(j)] = dot * scale;
  }
  const int64_t n_off = std::max<int64_t>(0, t + 1 - sinks - window);
  std::vector<double> weight(size_t(t + 1), 0.0);
  for (int64_t j = 0; j <= t; ++j)
    if (j < sinks || j > t - window) weight[size_t(j)] = 1;
  std::vector<int32_t> rows(static_cast<size_t>(n_off));
  for (int64_t r = 0; r < n_off; ++r) rows[size_t(r)] = int32_t(r);
  const int64_t k = std::min(top_k, n_off);
  std::partial_sort(rows.begin(), rows.begin() + k, rows.end(),
                    [&](int32_t a, int32_t b) { return s[size_t(sinks + a)] > s[size_t(sinks + b)]; });
  std::set<int32_t> retrieved(rows.begin(), rows.begin() + k);
  for (int32_t r : retrieved) weight[size_t(sinks + r)] = 1;
  std::vector<int32_t> rest;
  for (int32_t r : sample)
    if (!retrieved.count(r)) rest.push_back(r);
  for (int32_t r : rest) weight[size_t(sinks + r)] = double(n_off - k) / double(rest.size());
  const double m = *std::max_element(s.begin(), s.end());
  double den = 0;
  std::fill(out, out + d, 0.0);
  for (int64_t j = 0; j <= t; ++j) {
    const double w = weight[size_t(j)] * std::exp(s[size_t(j)] - m);
    den += w;
    for (int i = 0; i < d; ++i) out[i] += w * double(values[size_t(j) * size_t(d) + size_t(i)]);
  }
  for (int i = 0; i < d; ++i) out[i] /= den;
  *lse = m + std::log(den);
}

double rel_l2(const float* got, const double* ref, int d) {
  double num = 0, den = 0;
  for (int i = 0; i < d; ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

TEST(TailSample, DrawIsSortedDistinctInRangeAndReproducible) {
  std::vector<int32_t> a, b;
  for (int64_t rows : {1, 7, 100, 1000, 12345}) {
    for (int64_t s : {1, 3, 64, 999, 20000}) {
      rattn::internal::draw_tail_sample(5, 2, 1, 777, rows, s, a);
      ASSERT_EQ(int64_t(a.size()), std::min(rows, s));
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_GE(a[i], 0);
        ASSERT_LT(a[i], rows);
        if (i > 0) {
          ASSERT_LT(a[i - 1], a[i]);
        }
      }
      rattn::internal::draw_tail_sample(5, 2, 1, 777, rows, s, b);
      EXPECT_EQ(a, b);  // a function of its arguments only
    }
  }
  // Different positions, heads, layers or seeds move the offset.
  rattn::internal::draw_tail_sample(5, 2, 1, 777, 100000, 100, a);
  for (auto [seed, layer, head, pos] : {std::tuple<uint64_t, int, int, int64_t>{6, 2, 1, 777}, {5, 3, 1, 777},
                                        {5, 2, 0, 777}, {5, 2, 1, 778}}) {
    rattn::internal::draw_tail_sample(seed, layer, head, pos, 100000, 100, b);
    EXPECT_NE(a, b) << seed << " " << layer << " " << head << " " << pos;
  }
  rattn::internal::draw_tail_sample(5, 2, 1, 777, 0, 10, a);
  EXPECT_TRUE(a.empty());
  rattn::internal::draw_tail_sample(5, 2, 1, 777, 10, 0, a);
  EXPECT_TRUE(a.empty());
}

// Every row is drawn with probability samples / rows (what makes the scaled
// sum unbiased): over 4000 positions, each of 50 rows is drawn 4000 * 0.14 =
// 560 times in expectation; the bound is > 6 binomial standard deviations.
TEST(TailSample, EveryRowEquallyLikely) {
  const int64_t rows = 50, s = 7, draws = 4000;
  std::vector<int> count(size_t(rows), 0);
  std::vector<int32_t> ids;
  for (int64_t pos = 0; pos < draws; ++pos) {
    rattn::internal::draw_tail_sample(1, 0, 0, pos, rows, s, ids);
    for (int32_t r : ids) ++count[size_t(r)];
  }
  const double expect = double(draws) * double(s) / double(rows);
  const double sd = std::sqrt(expect * (1.0 - double(s) / double(rows)));
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(count[size_t(r)], expect, 6.5 * sd) << "row " << r;
}

// (a) A sample as large as the offloaded set covers everything the top-k
// missed at scale 1: the step equals full attention (same tolerances as the
// decode tests: 2e-5 with fp32 storage; fp16 storage of fp16-rounded inputs).
void expect_full_attention(const TailCase& s, double tol) {
  Stream x(s.hq, s.hkv, s.d, s.prompt + s.steps, 42, s.q_scale);
  if (s.storage == RATTN_F16) x.round_to(rattn::DType::f16);
  Decoder dec(s, x);
  std::vector<float> out(size_t(s.hq) * size_t(s.d)), lse(size_t(s.hq));
  std::vector<double> ref(size_t(s.d));
  double max_err = 0, max_lse_err = 0;
  const int group = s.hq / s.hkv;
  for (int step = 0; step < s.steps; ++step) {
    const int64_t t = s.prompt + step;
    dec.step(x, t, out.data(), lse.data());
    for (int h = 0; h < s.hq; ++h) {
      double ref_lse;
      reference_attention(x.head(x.q, h) + size_t(t) * size_t(s.d), x.head(x.k, h / group), x.head(x.v, h / group),
                          t + 1, s.d, ref.data(), &ref_lse);
      for (int j = 0; j < s.d; ++j)
        max_err = std::max(max_err, std::abs(double(out[size_t(h) * size_t(s.d) + size_t(j)]) - ref[size_t(j)]));
      max_lse_err = std::max(max_lse_err, std::abs(double(lse[size_t(h)]) - ref_lse));
    }
  }
  EXPECT_LT(max_err, tol);
  EXPECT_LT(max_lse_err, tol * 10);
}

TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttention) {
  TailCase s;
  s.tail_samples = 1 << 16;
  expect_full_attention(s, 2e-5);
}
// Deferred insertion: pending tokens are attended exactly and left out of
// the sampled set, so nothing is counted twice.
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionWithPendingTokens) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.insert_batch = 7;
  expect_full_attention(s, 2e-5);
}
// A prompt shorter than the static set: no offloaded token (no tail) at
// first, then the window overflows and the sample grows with the store.
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionFromShortPrompt) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.prompt = 3;
  s.steps = 60;
  expect_full_attention(s, 2e-5);
}
// No retrieval at all (top_k 0): the sample alone stands for the offloaded set.
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionWithoutRetrieval) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.top_k = 0;
  expect_full_attention(s, 2e-5);
}
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionF16) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.storage = RATTN_F16;
  s.hq = 4;
  s.hkv = 1;
  s.d = 64;
  expect_full_attention(s, 2e-5);
}

// The projected graph (approximate top-k; from 2048 offloaded keys on, and
// tokens inserted as they leave the window): whatever it retrieves, the
// sample covers the rest.
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionGraphIndex) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.prompt = 2300;
  s.steps = 24;
  s.index = RATTN_INDEX_GRAPH;
  expect_full_attention(s, 2e-5);
}

// The production kernels (Halide, compiled on first use; the decode tests'
// spec, so usually cached) gather the sampled rows the same way.
TEST(TailEstimate, SampleCoveringTheTailEqualsFullAttentionHalide) {
  TailCase s;
  s.tail_samples = 1 << 16;
  s.storage = RATTN_F16;
  s.kernels = RATTN_KERNELS_HALIDE;
  s.hq = 4;
  s.hkv = 1;
  s.d = 64;
  expect_full_attention(s, 1e-4);
}

// (b) A partial sample: the step's output and lse equal the float64
// estimator over the same sample and the exact top-k, to 2e-5 (fp32 storage,
// reference kernels: only summation order and the float lse shift differ).
void expect_estimator(TailCase s) {
  Stream x(s.hq, s.hkv, s.d, s.prompt + s.steps, 43, s.q_scale);
  Decoder dec(s, x);
  std::vector<float> out(size_t(s.hq) * size_t(s.d)), lse(size_t(s.hq));
  std::vector<double> ref(size_t(s.d));
  std::vector<int32_t> sample;
  double max_err = 0, max_lse_err = 0;
  const int group = s.hq / s.hkv;
  for (int step = 0; step < s.steps; ++step) {
    const int64_t t = s.prompt + step;
    dec.step(x, t, out.data(), lse.data());
    const int64_t n_off = t + 1 - s.sinks - s.window;
    for (int h = 0; h < s.hq; ++h) {
      rattn::internal::draw_tail_sample(s.seed, 1, h / group, t, n_off, s.tail_samples, sample);
      double ref_lse;
      reference_estimate(x.head(x.q, h) + size_t(t) * size_t(s.d), x.head(x.k, h / group), x.head(x.v, h / group),
                         s.d, t, s.sinks, s.window, s.top_k, sample, ref.data(), &ref_lse);
      for (int j = 0; j < s.d; ++j)
        max_err = std::max(max_err, std::abs(double(out[size_t(h) * size_t(s.d) + size_t(j)]) - ref[size_t(j)]));
      max_lse_err = std::max(max_lse_err, std::abs(double(lse[size_t(h)]) - ref_lse));
    }
  }
  EXPECT_LT(max_err, 2e-5);
  EXPECT_LT(max_lse_err, 2e-4);
}

TEST(TailEstimate, PartialSampleEqualsFloat64Estimator) {
  TailCase s;
  s.tail_samples = 40;  // of ~280 offloaded tokens
  expect_estimator(s);
}
TEST(TailEstimate, PartialSampleEqualsFloat64EstimatorFlatAttention) {
  TailCase s;
  s.tail_samples = 25;
  s.q_scale = 0.2f;  // many tokens of similar weight: the tail carries most of the mass
  s.hq = 2;
  s.hkv = 2;
  expect_estimator(s);
}

// (c) Flat attention (small queries: the top-k holds a small share of the
// mass): the mean relative L2 error against full attention over 30 steps x 4
// heads is at least 1.5x smaller with 128 sampled tokens than with top-k
// alone (this data: 0.207 without, 0.081 with; the bound can fail).
TEST(TailEstimate, CutsTheErrorOfFlatAttention) {
  TailCase s;
  s.prompt = 3000;
  s.steps = 30;
  s.q_scale = 0.3f;
  s.top_k = 16;
  Stream x(s.hq, s.hkv, s.d, s.prompt + s.steps, 44, s.q_scale);
  // Values with a common part and a drift along the context (as real
  // values have), so that the output is not ~0 and dropping the tail biases
  // it towards the static set's tokens.
  const std::vector<float> common = random_normal(size_t(s.d), 45), drift = random_normal(size_t(s.d), 46);
  for (int h = 0; h < s.hkv; ++h)
    for (int64_t t = 0; t < x.total; ++t)
      for (int j = 0; j < s.d; ++j)
        x.v[(size_t(h) * size_t(x.total) + size_t(t)) * size_t(s.d) + size_t(j)] +=
            common[size_t(j)] + float(2.0 * double(t) / double(x.total) - 1.0) * drift[size_t(j)];
  TailCase with = s;
  with.tail_samples = 128;
  Decoder plain(s, x), tail(with, x);
  std::vector<float> out(size_t(s.hq) * size_t(s.d)), out_tail(out.size()), lse(size_t(s.hq));
  std::vector<double> ref(size_t(s.d));
  double err = 0, err_tail = 0;
  const int group = s.hq / s.hkv;
  for (int step = 0; step < s.steps; ++step) {
    const int64_t t = s.prompt + step;
    plain.step(x, t, out.data(), lse.data());
    tail.step(x, t, out_tail.data(), lse.data());
    for (int h = 0; h < s.hq; ++h) {
      double ref_lse;
      reference_attention(x.head(x.q, h) + size_t(t) * size_t(s.d), x.head(x.k, h / group), x.head(x.v, h / group),
                          t + 1, s.d, ref.data(), &ref_lse);
      err += rel_l2(out.data() + size_t(h) * size_t(s.d), ref.data(), s.d);
      err_tail += rel_l2(out_tail.data() + size_t(h) * size_t(s.d), ref.data(), s.d);
    }
  }
  err /= double(s.steps * s.hq);
  err_tail /= double(s.steps * s.hq);
  RecordProperty("mean_rel_error_topk", std::to_string(err));
  RecordProperty("mean_rel_error_tail", std::to_string(err_tail));
  EXPECT_LT(err_tail * 1.5, err) << "top-k alone " << err << ", with tail " << err_tail;
}

// The C API: -1 keeps the plan's value, >= 0 overrides it, the info reports
// it, < -1 is refused with a message naming the field.
TEST(TailEstimate, ContextParamsAndInfo) {
  rattn::testing::expect_context_override("tail_samples", 64, &rattn_context_params::tail_samples,
                                   &rattn_context_info::tail_samples);
}

}  // namespace

namespace {

// The tail estimate's rule in float64 for one query head, from its inner
// products `s` with every row (ranked_rows) over fp32 values: the sample
// less `retrieved`; a sampled row above the weakest of `scores` counts once
// (no scores: none does), the others stand for the unretrieved rows not seen
// above. `above_rows`: how many counted once.
struct Float64Tail {
  std::vector<double> out;
  double lse = 0;
  size_t above_rows = 0, below_rows = 0;
};
Float64Tail tail_f64(const std::vector<double>& s, const std::vector<float>& values, int rows, int d,
                     const std::vector<int32_t>& sample, const std::vector<int32_t>& retrieved,
                     const std::vector<float>* scores) {
  const double weakest = scores ? *std::min_element(scores->begin(), scores->end())
                                : std::numeric_limits<double>::infinity();
  const std::set<int32_t> in_top(retrieved.begin(), retrieved.end());
  std::vector<int32_t> above, below;
  for (int32_t r : sample)
    if (!in_top.count(r)) (s[size_t(r)] > weakest ? above : below).push_back(r);
  const double scale_below = double(rows - int(retrieved.size()) - int(above.size())) / double(below.size());
  const double m = *std::max_element(s.begin(), s.end()) / std::sqrt(double(d));
  Float64Tail t;
  t.out.assign(size_t(d), 0.0);
  t.above_rows = above.size();
  t.below_rows = below.size();
  double den = 0;
  auto add = [&](int32_t r, double weight) {
    const double w = weight * std::exp(s[size_t(r)] / std::sqrt(double(d)) - m);
    den += w;
    for (int i = 0; i < d; ++i) t.out[size_t(i)] += w * double(values[size_t(r) * d + size_t(i)]);
  };
  for (int32_t r : above) add(r, 1.0);
  for (int32_t r : below) add(r, scale_below);
  for (double& x : t.out) x /= den;
  t.lse = m + std::log(den);
  return t;
}

// q's inner products with every row, ranked best first.
std::vector<int32_t> ranked_rows(const float* q, const std::vector<float>& keys, int rows, int d,
                                 std::vector<double>* dots) {
  dots->assign(static_cast<size_t>(rows), 0.0);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < d; ++i) (*dots)[size_t(r)] += double(q[i]) * double(keys[size_t(r) * d + size_t(i)]);
  std::vector<int32_t> order(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) order[size_t(r)] = r;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return (*dots)[size_t(a)] > (*dots)[size_t(b)]; });
  return order;
}

// (e) A search that missed strong rows: sampled rows scoring above the
// weakest retrieved row count once; the rest stand for the unseen rows.
// internal::tail_piece + tail_finish for one head against that rule in
// float64 (fp32 rows, reference kernels; 1e-5 on out, 1e-4 on lse).
TEST(TailEstimate, SampledRowsAboveTheTopKCountOnce) {
  const int d = 32, rows = 600, top = 20, samples = 150;
  const std::vector<float> keys = random_normal(size_t(rows) * d, 61), values = random_normal(size_t(rows) * d, 62),
                           q = random_normal(size_t(d), 63, 2.0f);
  std::vector<double> s;
  const std::vector<int32_t> order = ranked_rows(q.data(), keys, rows, d, &s);
  // A poor search: every other row of the best 2 * top.
  std::vector<int32_t> retrieved;
  std::vector<float> retrieved_scores;
  for (int i = 0; i < 2 * top; i += 2) {
    retrieved.push_back(order[size_t(i)]);
    retrieved_scores.push_back(float(s[size_t(order[size_t(i)])]));
  }
  std::vector<int32_t> sample;
  rattn::internal::draw_tail_sample(7, 1, 0, 1000, rows, samples, sample);

  const rattn::KernelSpec spec{d, 1, rattn::DType::f32};
  auto kernels = rattn::make_reference_kernels(spec);
  const rattn::RowsView key_rows{keys.data(), rattn::DType::f32, rows, d}, value_rows{values.data(), rattn::DType::f32, rows, d};
  rattn::internal::TailPiece piece;
  std::vector<float> out(static_cast<size_t>(d));
  float lse = 0;
  for (const bool with_scores : {true, false}) {
    // Without the scores every row of S' stands for the unretrieved rows alike.
    const Float64Tail ref = tail_f64(s, values, rows, d, sample, retrieved,
                                     with_scores ? &retrieved_scores : nullptr);
    if (with_scores) ASSERT_GT(ref.above_rows, 0u) << "the case must sample a missed strong row";
    else ASSERT_EQ(ref.above_rows, 0u);
    ASSERT_GT(ref.below_rows, 0u);
    const rattn::internal::TailHits hits{retrieved.data(), with_scores ? retrieved_scores.data() : nullptr, top};
    rattn::internal::tail_piece(*kernels, q.data(), 1, key_rows, value_rows, sample.data(), int(sample.size()), &hits,
                                piece);
    rattn::internal::tail_finish(&piece, 1, 1, d, rows, &hits, out.data(), &lse);
    for (int i = 0; i < d; ++i) EXPECT_NEAR(out[size_t(i)], ref.out[size_t(i)], 1e-5) << with_scores << ", " << i;
    EXPECT_NEAR(lse, ref.lse, 1e-4) << with_scores;
  }
}

// (f) The group's estimate in pieces (internal::tail_piece + tail_finish, as
// the decode step runs it over threads): each of 4 query heads with its own
// poor top-k, the sample cut into 1 and 3 pieces, against the rule of (e)
// per head in float64 (fp32 rows, reference kernels; 1e-5 on out, 1e-4 on lse).
TEST(TailEstimate, GroupInPiecesEqualsEachHeadsEstimate) {
  const int d = 32, rows = 900, top = 20, samples = 300, G = 4;
  const std::vector<float> keys = random_normal(size_t(rows) * d, 71), values = random_normal(size_t(rows) * d, 72),
                           qs = random_normal(size_t(G) * d, 73, 2.0f);
  std::vector<int32_t> sample;
  rattn::internal::draw_tail_sample(9, 1, 0, 2000, rows, samples, sample);
  std::vector<std::vector<int32_t>> retrieved(G);
  std::vector<std::vector<float>> scores(G);
  std::vector<Float64Tail> ref;
  int heads_with_above = 0;
  for (int g = 0; g < G; ++g) {
    std::vector<double> s;
    const std::vector<int32_t> order = ranked_rows(qs.data() + size_t(g) * d, keys, rows, d, &s);
    // Head g keeps every (g + 2)-th row of its best rows: the heads differ.
    for (int i = 0; int(retrieved[size_t(g)].size()) < top; i += g + 2) {
      retrieved[size_t(g)].push_back(order[size_t(i)]);
      scores[size_t(g)].push_back(float(s[size_t(order[size_t(i)])]));
    }
    ref.push_back(tail_f64(s, values, rows, d, sample, retrieved[size_t(g)],
                           &scores[size_t(g)]));
    heads_with_above += ref.back().above_rows > 0;
    ASSERT_GT(ref.back().below_rows, 0u);
  }
  ASSERT_GE(heads_with_above, 2) << "the case must sample rows the searches missed";

  const rattn::KernelSpec spec{d, G, rattn::DType::f32};
  auto kernels = rattn::make_reference_kernels(spec);
  const rattn::RowsView key_rows{keys.data(), rattn::DType::f32, rows, d}, value_rows{values.data(), rattn::DType::f32, rows, d};
  std::vector<rattn::internal::TailHits> hits;
  for (int g = 0; g < G; ++g) hits.push_back({retrieved[size_t(g)].data(), scores[size_t(g)].data(), top});
  for (int pieces : {1, 3}) {
    std::vector<rattn::internal::TailPiece> state(static_cast<size_t>(pieces));
    for (int p = 0; p < pieces; ++p) {
      const int lo = samples * p / pieces, hi = samples * (p + 1) / pieces;
      rattn::internal::tail_piece(*kernels, qs.data(), G, key_rows, value_rows, sample.data() + lo, hi - lo,
                                  hits.data(), state[size_t(p)]);
    }
    std::vector<float> out(size_t(G) * d);
    std::vector<float> lse(G);
    rattn::internal::tail_finish(state.data(), pieces, G, d, rows, hits.data(), out.data(), lse.data());
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < d; ++i)
        EXPECT_NEAR(out[size_t(g) * d + size_t(i)], ref[size_t(g)].out[size_t(i)], 1e-5)
            << pieces << " pieces, head " << g << ", " << i;
      EXPECT_NEAR(lse[size_t(g)], ref[size_t(g)].lse, 1e-4) << pieces << " pieces, head " << g;
    }
  }
}

}  // namespace
