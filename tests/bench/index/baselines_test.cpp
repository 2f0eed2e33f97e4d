// The baselines of `rattn bench index` on the graph build's key transform:
// on keys that share a large mean, hnswlib built on the centred keys must
// find the exact inner-product top-k at least as well as built on raw keys
// (the mean dominates every key-to-key inner product hnswlib's build uses).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "bench/index/baselines.h"
#include "runtime/index/brute_force.h"

namespace rattn::bench {
namespace {

struct Data {
  int d = 32;
  int64_t n = 4000, m = 200;
  std::vector<float> keys, queries;
};

// Gaussian keys plus a common offset of norm 40 (per-coordinate spread 1:
// |mean| is 7x the keys' spread |k - mean| ~ 5.7, as on real Gemma-3 layers
// where |mean| 107 against 78), Gaussian queries.
Data make_data(uint32_t seed) {
  Data x;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> mean(static_cast<size_t>(x.d));
  for (float& v : mean) v = nd(rng);
  const float norm = std::sqrt(std::inner_product(mean.begin(), mean.end(), mean.begin(), 0.0f));
  for (float& v : mean) v *= 40.0f / norm;
  x.keys.resize(size_t(x.n) * size_t(x.d));
  for (int64_t i = 0; i < x.n; ++i)
    for (int j = 0; j < x.d; ++j) x.keys[size_t(i) * size_t(x.d) + size_t(j)] = mean[size_t(j)] + nd(rng);
  x.queries.resize(size_t(x.m) * size_t(x.d));
  for (float& v : x.queries) v = nd(rng);
  return x;
}

// Exact top-k by inner product in float64 (ties by id).
std::vector<int32_t> exact_top_k(const float* q, const float* keys, int64_t n, int d, int k) {
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int j = 0; j < d; ++j) acc += double(q[j]) * double(keys[size_t(i) * size_t(d) + size_t(j)]);
    s[size_t(i)] = acc;
  }
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return s[size_t(a)] > s[size_t(b)] || (s[size_t(a)] == s[size_t(b)] && a < b); });
  ids.resize(size_t(k));
  return ids;
}

TEST(Baselines, CentringKeepsTheExactTopKAndRemovesTheMean) {
  const Data x = make_data(3);
  std::vector<float> mean;
  const std::vector<float> c = centred_rows(x.keys.data(), x.n, x.d, &mean);
  for (int j = 0; j < x.d; ++j) {
    double col = 0;
    for (int64_t i = 0; i < x.n; ++i) col += c[size_t(i) * size_t(x.d) + size_t(j)];
    EXPECT_NEAR(col / double(x.n), 0.0, 1e-4) << "column " << j;  // float rows: about 1e-6 of |mean| = 40 per row
  }
  // The same top-10 for every query (ranks differ only within float rounding
  // of near-equal scores; none at this spread).
  for (int64_t i = 0; i < 50; ++i) {
    const float* q = x.queries.data() + size_t(i) * size_t(x.d);
    EXPECT_EQ(exact_top_k(q, x.keys.data(), x.n, x.d, 10), exact_top_k(q, c.data(), x.n, x.d, 10)) << "query " << i;
  }
}

TEST(Baselines, QueryMetricKeepsInnerProductsAndMeasuresKeysByTheQueries) {
  const Data x = make_data(7);
  const int d = x.d;
  const QueryMetric qm(x.queries.data(), x.m, d, /*covariance=*/true, 1e-3);
  const std::vector<float> k = qm.keys(x.keys.data(), 20), q = qm.queries(x.queries.data(), 20);
  // <L^-1 q, L' k> = <q, k>: relative to |q| |k| (~5.7 x 40), float rounding of d = 32 terms.
  for (int i = 0; i < 20; ++i)
    for (int j = 0; j < 20; ++j) {
      double want = 0, got = 0, nq = 0, nk = 0;
      for (int t = 0; t < d; ++t) {
        const size_t a = size_t(i) * size_t(d) + size_t(t), b = size_t(j) * size_t(d) + size_t(t);
        want += double(x.queries[a]) * double(x.keys[b]);
        got += double(q[a]) * double(k[b]);
        nq += double(x.queries[a]) * x.queries[a];
        nk += double(x.keys[b]) * x.keys[b];
      }
      EXPECT_NEAR(got, want, 1e-5 * std::sqrt(nq * nk)) << i << "," << j;
    }
  // <L' k1, L' k2> = k1' S k2 with S the queries' covariance plus the ridge (float64 reference).
  std::vector<double> mean(static_cast<size_t>(d), 0.0), S(size_t(d) * size_t(d), 0.0);
  for (int64_t i = 0; i < x.m; ++i)
    for (int t = 0; t < d; ++t) mean[size_t(t)] += x.queries[size_t(i) * size_t(d) + size_t(t)] / double(x.m);
  for (int64_t i = 0; i < x.m; ++i)
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        S[size_t(a) * size_t(d) + size_t(b)] += (x.queries[size_t(i) * size_t(d) + size_t(a)] - mean[size_t(a)]) *
                                                 (x.queries[size_t(i) * size_t(d) + size_t(b)] - mean[size_t(b)]);
  double tr = 0;
  for (int a = 0; a < d; ++a) tr += S[size_t(a) * size_t(d) + size_t(a)];
  for (int a = 0; a < d; ++a) S[size_t(a) * size_t(d) + size_t(a)] += 1e-3 * tr / d + 1e-12;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) {
      double want = 0, got = 0, scale = 0;
      for (int a = 0; a < d; ++a) {
        got += double(k[size_t(i) * size_t(d) + size_t(a)]) * k[size_t(j) * size_t(d) + size_t(a)];
        for (int b = 0; b < d; ++b) {
          const double t = x.keys[size_t(i) * size_t(d) + size_t(a)] * S[size_t(a) * size_t(d) + size_t(b)] *
                           x.keys[size_t(j) * size_t(d) + size_t(b)];
          want += t;
          scale += std::fabs(t);
        }
      }
      EXPECT_NEAR(got, want, 1e-5 * scale) << i << "," << j;
    }
}

TEST(Baselines, HnswlibOnCentredKeysRecallsAtLeastAsMuchAsOnRawKeys) {
  const Data x = make_data(5);
  const int k = 10;
  std::vector<float> mean;
  const std::vector<float> c = centred_rows(x.keys.data(), x.n, x.d, &mean);
  // One build thread: hnswlib's graph is then deterministic for the seed.
  HnswIp raw(x.d, x.n, 16, 100, 1), centred(x.d, x.n, 16, 100, 1);
  raw.add(x.keys.data(), 0, x.n, 1);
  centred.add(c.data(), 0, x.n, 1);
  int64_t last_centred = 0;
  for (int ef : {10, 20, 40}) {
    double r_raw = 0, r_centred = 0;
    int64_t s_raw = 0, s_centred = 0;
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < x.m; ++i) {
      const float* q = x.queries.data() + size_t(i) * size_t(x.d);
      const std::vector<int32_t> truth = exact_top_k(q, x.keys.data(), x.n, x.d, k);
      raw.search(q, k, ef, &ids, &s_raw);
      r_raw += recall_at(ids, truth, k);
      centred.search(q, k, ef, &ids, &s_centred);
      r_centred += recall_at(ids, truth, k);
    }
    r_raw /= double(x.m);
    r_centred /= double(x.m);
    std::printf("ef %d: recall@%d raw %.3f (%.1f keys scored), centred %.3f (%.1f)\n", ef, k, r_raw,
                double(s_raw) / double(x.m), r_centred, double(s_centred) / double(x.m));
    EXPECT_GE(r_centred, r_raw) << "ef " << ef;
    // Keys scored: each search scores at least its k results and at most
    // every key; a wider beam scores more.
    for (const int64_t s : {s_raw, s_centred}) {
      EXPECT_GE(s, int64_t(k) * x.m) << "ef " << ef;
      EXPECT_LE(s, x.n * x.m) << "ef " << ef;
    }
    EXPECT_GT(s_centred, last_centred) << "ef " << ef;
    last_centred = s_centred;
  }
}

}  // namespace
}  // namespace rattn::bench
