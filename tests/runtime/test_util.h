#pragma once
// Shared helpers of the runtime tests: random inputs and a float64 reference.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace rattn::testing {

inline std::vector<float> random_normal(size_t n, uint64_t seed, float scale = 1.f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Full attention of one query over rows [0, n) of keys/values ([n, d] each),
// in float64; natural-log lse.
inline void reference_attention(const float* q, const float* keys, const float* values, int64_t n,
                                int d, double* out, double* lse) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> s(static_cast<size_t>(n));
  double m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += double(q[j]) * double(keys[size_t(i) * size_t(d) + size_t(j)]);
    s[size_t(i)] = dot * scale;
    m = std::max(m, s[size_t(i)]);
  }
  double denom = 0;
  for (int j = 0; j < d; ++j) out[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = std::exp(s[size_t(i)] - m);
    denom += p;
    for (int j = 0; j < d; ++j) out[j] += p * double(values[size_t(i) * size_t(d) + size_t(j)]);
  }
  for (int j = 0; j < d; ++j) out[j] /= denom;
  *lse = m + std::log(denom);
}

// The same for `groups` queries sharing the keys (one pass over them):
// out [groups, d], lse [groups].
inline void reference_attention_group(const float* const* q, int groups, const float* keys,
                                      const float* values, int64_t n, int d, double* out, double* lse) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> s(static_cast<size_t>(n) * size_t(groups)), m(size_t(groups), -INFINITY);
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + size_t(i) * size_t(d);
    for (int g = 0; g < groups; ++g) {
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += double(q[g][j]) * double(k[j]);
      s[size_t(i) * size_t(groups) + size_t(g)] = dot * scale;
      m[size_t(g)] = std::max(m[size_t(g)], dot * scale);
    }
  }
  std::vector<double> denom(size_t(groups), 0.0);
  for (int j = 0; j < groups * d; ++j) out[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* v = values + size_t(i) * size_t(d);
    for (int g = 0; g < groups; ++g) {
      const double p = std::exp(s[size_t(i) * size_t(groups) + size_t(g)] - m[size_t(g)]);
      denom[size_t(g)] += p;
      double* o = out + size_t(g) * size_t(d);
      for (int j = 0; j < d; ++j) o[j] += p * double(v[j]);
    }
  }
  for (int g = 0; g < groups; ++g) {
    for (int j = 0; j < d; ++j) out[size_t(g) * size_t(d) + size_t(j)] /= denom[size_t(g)];
    lse[g] = m[size_t(g)] + std::log(denom[size_t(g)]);
  }
}

inline double cosine(const float* a, const double* b, int d) {
  double ab = 0, aa = 0, bb = 0;
  for (int j = 0; j < d; ++j) {
    ab += double(a[j]) * b[j];
    aa += double(a[j]) * double(a[j]);
    bb += b[j] * b[j];
  }
  return ab / std::sqrt(aa * bb + 1e-300);
}

}  // namespace rattn::testing
