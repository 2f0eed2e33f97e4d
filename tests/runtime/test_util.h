#pragma once
// Shared helpers of the runtime tests: random inputs and a float64 reference.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

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

// K/V [hkv, total, d] and Q [hq, total, d] for a whole stream of tokens
// (queries scaled by q_scale: smaller gives flatter attention).
struct TokenStream {
  int hq, hkv, d;
  int64_t total;
  std::vector<float> k, v, q;
  TokenStream(int hq_, int hkv_, int d_, int64_t total_, uint64_t seed, float q_scale = 1.5f)
      : hq(hq_), hkv(hkv_), d(d_), total(total_),
        k(random_normal(size_t(hkv_) * size_t(total_) * size_t(d_), seed)),
        v(random_normal(size_t(hkv_) * size_t(total_) * size_t(d_), seed + 1)),
        q(random_normal(size_t(hq_) * size_t(total_) * size_t(d_), seed + 2, q_scale)) {}
  // Head h of x, [total, d].
  const float* head(const std::vector<float>& x, int h) const { return x.data() + size_t(h) * size_t(total) * size_t(d); }
  // Tokens [first, first + n) packed as [heads, n, d].
  std::vector<float> rows(const std::vector<float>& x, int heads, int64_t first, int64_t n) const {
    std::vector<float> out(size_t(heads) * size_t(n) * size_t(d));
    for (int h = 0; h < heads; ++h)
      std::memcpy(out.data() + size_t(h) * size_t(n) * size_t(d), head(x, h) + size_t(first) * size_t(d),
                  size_t(n) * size_t(d) * sizeof(float));
    return out;
  }
  // The first n tokens packed as [heads, n, d].
  std::vector<float> prefix(const std::vector<float>& x, int heads, int64_t n) const { return rows(x, heads, 0, n); }
  // Token t of every head, [heads, d].
  std::vector<float> token(const std::vector<float>& x, int heads, int64_t t) const {
    std::vector<float> out(size_t(heads) * size_t(d));
    for (int h = 0; h < heads; ++h)
      std::memcpy(out.data() + size_t(h) * size_t(d), head(x, h) + size_t(t) * size_t(d), size_t(d) * sizeof(float));
    return out;
  }
  // Rounds every value through a 16-bit dtype (what storage in it keeps).
  void round_to(DType t) {
    for (auto* x : {&k, &v, &q})
      for (auto& e : *x) {
        if (t == DType::f16) e = f16_to_f32(f32_to_f16(e));
        if (t == DType::bf16) e = bf16_to_f32(f32_to_bf16(e));
      }
  }
};

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
