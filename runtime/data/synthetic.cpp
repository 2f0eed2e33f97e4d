#include "runtime/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/rope.h"
#include "runtime/data/rng.h"
#include "runtime/data/synthetic_head.h"

namespace rattn {
namespace {

using data::Rng;

// A decaying spectrum over a random permutation of the dimensions.
std::vector<double> spectrum(Rng& rng, int d, double floor, double peak, double decay) {
  std::vector<int> rank(static_cast<size_t>(d));
  std::iota(rank.begin(), rank.end(), 0);
  for (int i = d - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[size_t(rng.below(i + 1))]);
  std::vector<double> s(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) s[size_t(i)] = floor + peak * std::exp(-double(rank[size_t(i)]) / decay);
  return s;
}

// Dimension roles (rotate-half layout: dims i and i + d/2 form RoPE pair i,
// pair 0 rotates fastest). High-frequency pairs carry the position component;
// the lowest-frequency pairs form the "offset" subspace where keys barely vary
// and queries sit far away (what makes them out of distribution, and what sink
// keys align with); the remaining low-frequency pairs carry topics.
enum class Role { position, topic, offset };
Role role_of(int dim_index, int d) {
  const int h = d / 2, pair = dim_index % h;
  const int offset_pairs = std::max(1, h * 3 / 16);
  if (pair >= h - offset_pairs) return Role::offset;
  if (pair >= h / 2) return Role::topic;
  return Role::position;
}

}  // namespace

void apply_rope(float* v, int d, int64_t pos, double base) {
  RopeAngles(d, double(pos), base).rotate(v, v, /*interleaved=*/false);
}

SyntheticHead make_synthetic(const SyntheticSpec& spec) {
  const int d = spec.head_dim;
  const int64_t T = spec.tokens;
  data::check_head_shape("synthetic", T, d, 8, spec.group);
  if (spec.sink_tokens < 0 || spec.tokens_per_topic < 1)
    fail(Status::invalid_argument, "synthetic: bad sink or topic size");
  Rng rng(spec.seed);
  SyntheticHead out = data::allocate_head(T, d, spec.group);

  // Key distribution: its own mean and spectrum; almost no spread in the
  // offset subspace.
  std::vector<double> mu_k(static_cast<size_t>(d)), sk = spectrum(rng, d, 0.25, 1.2, 20.0);
  for (int j = 0; j < d; ++j) {
    mu_k[size_t(j)] = 0.6 * rng.normal();
    if (role_of(j, d) == Role::offset) {
      mu_k[size_t(j)] = 0.0;
      sk[size_t(j)] = 0.1;
    }
  }
  // Shared position component in the high-frequency pairs: after RoPE its
  // contribution to q.k is large for nearby tokens and averages out far away.
  std::vector<double> pos_vec(static_cast<size_t>(d), 0.0);
  for (int j = 0; j < d; ++j)
    if (role_of(j, d) == Role::position && j % (d / 2) >= d / 32) pos_vec[size_t(j)] = 0.6 * rng.normal();
  const int64_t num_topics = std::max<int64_t>(8, T / spec.tokens_per_topic);
  std::vector<double> topics(size_t(num_topics) * size_t(d), 0.0);
  for (int64_t c = 0; c < num_topics; ++c)
    for (int j = 0; j < d; ++j)
      if (role_of(j, d) != Role::offset) topics[size_t(c) * size_t(d) + size_t(j)] = 0.9 * rng.normal();
  // Key-only pairs: 3/4 of the low-frequency (topic) RoPE pairs, where keys
  // carry large variance that queries do not look at (as the outlier channels
  // of real keys). Key-to-key similarity is then dominated by directions that
  // do not matter for attention: what defeats indexes built on keys alone.
  std::vector<uint8_t> key_only(static_cast<size_t>(d), 0);
  for (int pair = 0; pair < d / 2; ++pair)
    if (role_of(pair, d) == Role::topic && rng.uniform() < 0.75) key_only[size_t(pair)] = key_only[size_t(pair + d / 2)] = 1;
  // Topic of each token: runs (segments of text), mean length ~24 tokens.
  std::vector<int32_t> topic_of(static_cast<size_t>(T));
  int32_t cur = int32_t(rng.below(num_topics));
  for (int64_t t = 0; t < T; ++t) {
    if (rng.uniform() < 1.0 / 24.0) cur = int32_t(rng.below(num_topics));
    topic_of[size_t(t)] = cur;
  }

  // Query heads: a common large mean in the offset subspace (what sinks
  // align with), per-head offsets and spectra unlike the keys'.
  std::vector<double> mu_q_common(static_cast<size_t>(d), 0.0);
  for (int j = 0; j < d; ++j)
    if (role_of(j, d) == Role::offset) mu_q_common[size_t(j)] = 3.5 * (rng.uniform() < 0.5 ? -1.0 : 1.0);
  std::vector<std::vector<double>> mu_q(size_t(spec.group)), sq(size_t(spec.group));
  for (int g = 0; g < spec.group; ++g) {
    mu_q[size_t(g)] = mu_q_common;
    for (int j = 0; j < d; ++j) mu_q[size_t(g)][size_t(j)] += 0.2 * rng.normal();
    sq[size_t(g)] = spectrum(rng, d, 0.15, 0.9, 6.0);
  }

  // Keys (pre-RoPE), sinks, RoPE; values.
  double sink_norm = 0;
  for (double x : mu_q_common) sink_norm += x * x;
  sink_norm = std::sqrt(std::max(sink_norm, 1e-12));
  for (int64_t t = 0; t < T; ++t) {
    float* k = out.keys.data() + size_t(t) * size_t(d);
    const double* tc = topics.data() + size_t(topic_of[size_t(t)]) * size_t(d);
    for (int j = 0; j < d; ++j) k[j] = float(mu_k[size_t(j)] + sk[size_t(j)] * rng.normal() + pos_vec[size_t(j)]);
    if (t < spec.sink_tokens)
      for (int j = 0; j < d; ++j) k[j] = float(0.2 * rng.normal() + 0.5 * pos_vec[size_t(j)]);
    apply_rope(k, d, t, spec.rope_base);
    if (t < spec.sink_tokens)
      for (int j = 0; j < d; ++j) k[j] += float(10.0 * mu_q_common[size_t(j)] / sink_norm);
    // The topic is a position-independent component (added after RoPE), as
    // the semantic directions of long-context models behave over long ranges.
    if (t >= spec.sink_tokens)
      for (int j = 0; j < d; ++j) k[j] += float(tc[j] + (key_only[size_t(j)] ? spec.key_only_std * rng.normal() : 0.0));
    float* v = out.values.data() + size_t(t) * size_t(d);
    for (int j = 0; j < d; ++j) v[j] = float(0.1 + rng.normal());
  }

  out.target_topic.assign(size_t(spec.group) * size_t(T), -1);
  out.target_key.assign(size_t(spec.group) * size_t(T), -1);
  for (int g = 0; g < spec.group; ++g) {
    for (int64_t t = 0; t < T; ++t) {
      float* q = out.queries.data() + (size_t(g) * size_t(T) + size_t(t)) * size_t(d);
      const std::vector<double>& mu = mu_q[size_t(g)];
      const std::vector<double>& s = sq[size_t(g)];
      for (int j = 0; j < d; ++j)
        q[j] = float(mu[size_t(j)] - mu_q_common[size_t(j)] + s[size_t(j)] * rng.normal() + 2.5 * pos_vec[size_t(j)]);
      apply_rope(q, d, t, spec.rope_base);
      // The common offset is position-independent (added after RoPE): even the
      // slowest RoPE pair turns by ~1 rad over 128K tokens, and real sinks stay
      // sinks at every position.
      for (int j = 0; j < d; ++j) q[j] += float(mu_q_common[size_t(j)]);
      const int64_t far_end = t - spec.min_target_distance;  // targets lie in [0, far_end)
      if (far_end > 0 && rng.uniform() < spec.topic_query_fraction) {
        const int64_t src = rng.below(far_end);
        const double* tc = topics.data() + size_t(topic_of[size_t(src)]) * size_t(d);
        for (int j = 0; j < d; ++j) q[j] += float(1.1 * tc[j]);
        out.target_topic[size_t(g) * size_t(T) + size_t(t)] = topic_of[size_t(src)];
      }
      for (int j = 0; j < d; ++j)
        if (key_only[size_t(j)]) q[j] *= 0.05f;
      if (far_end > spec.sink_tokens && rng.uniform() < spec.needle_query_fraction) {
        // One specific distant key: add its (RoPE'd) direction.
        const int64_t j0 = spec.sink_tokens + rng.below(far_end - spec.sink_tokens);
        const float* kj = out.keys.data() + size_t(j0) * size_t(d);
        double n2 = 0;
        for (int j = 0; j < d; ++j)
          if (!key_only[size_t(j)]) n2 += double(kj[j]) * kj[j];
        const double scale = 9.0 / std::sqrt(std::max(n2, 1e-12));
        for (int j = 0; j < d; ++j)
          if (!key_only[size_t(j)]) q[j] += float(scale * kj[j]);
        out.target_key[size_t(g) * size_t(T) + size_t(t)] = j0;
      }
    }
  }
  out.topic_of = std::move(topic_of);
  return out;
}

double mahalanobis_ratio(const float* keys, int64_t nk, const float* queries, int64_t nq, int d,
                         int64_t max_samples) {
  if (nk < 2 || nq < 1 || d < 1) fail(Status::invalid_argument, "mahalanobis_ratio: need >= 2 keys and >= 1 query");
  const int64_t ks = std::min(nk, max_samples), qs = std::min(nq, max_samples);
  const auto pick = [](int64_t i, int64_t s, int64_t n) { return (i * n) / s; };
  std::vector<double> mean(static_cast<size_t>(d), 0.0), cov(static_cast<size_t>(d) * size_t(d), 0.0);
  for (int64_t i = 0; i < ks; ++i) {
    const float* k = keys + size_t(pick(i, ks, nk)) * size_t(d);
    for (int a = 0; a < d; ++a) mean[size_t(a)] += k[a];
  }
  for (auto& m : mean) m /= double(ks);
  std::vector<double> x(static_cast<size_t>(d));
  for (int64_t i = 0; i < ks; ++i) {
    const float* k = keys + size_t(pick(i, ks, nk)) * size_t(d);
    for (int a = 0; a < d; ++a) x[size_t(a)] = k[a] - mean[size_t(a)];
    for (int a = 0; a < d; ++a)
      for (int b = 0; b <= a; ++b) cov[size_t(a) * size_t(d) + size_t(b)] += x[size_t(a)] * x[size_t(b)];
  }
  double trace = 0;
  for (int a = 0; a < d; ++a) trace += cov[size_t(a) * size_t(d) + size_t(a)] / double(ks - 1);
  const double ridge = 1e-6 * trace / double(d) + 1e-12;
  // Cholesky of the (lower-triangular stored) covariance.
  std::vector<double> L(size_t(d) * size_t(d), 0.0);
  for (int a = 0; a < d; ++a) {
    for (int b = 0; b <= a; ++b) {
      double s = cov[size_t(a) * size_t(d) + size_t(b)] / double(ks - 1) + (a == b ? ridge : 0.0);
      for (int c = 0; c < b; ++c) s -= L[size_t(a) * size_t(d) + size_t(c)] * L[size_t(b) * size_t(d) + size_t(c)];
      if (a == b) {
        L[size_t(a) * size_t(d) + size_t(a)] = std::sqrt(std::max(s, 1e-300));
      } else {
        L[size_t(a) * size_t(d) + size_t(b)] = s / L[size_t(b) * size_t(d) + size_t(b)];
      }
    }
  }
  // distance = |L^{-1}(v - mean)| by forward substitution.
  const auto dist = [&](const float* v) {
    double s2 = 0;
    for (int a = 0; a < d; ++a) {
      double s = v[a] - mean[size_t(a)];
      for (int c = 0; c < a; ++c) s -= L[size_t(a) * size_t(d) + size_t(c)] * x[size_t(c)];
      x[size_t(a)] = s / L[size_t(a) * size_t(d) + size_t(a)];
      s2 += x[size_t(a)] * x[size_t(a)];
    }
    return std::sqrt(s2);
  };
  double dk = 0, dq = 0;
  for (int64_t i = 0; i < ks; ++i) dk += dist(keys + size_t(pick(i, ks, nk)) * size_t(d));
  for (int64_t i = 0; i < qs; ++i) dq += dist(queries + size_t(pick(i, qs, nq)) * size_t(d));
  return (dq / double(qs)) / (dk / double(ks));
}

double mahalanobis_ratio(const SyntheticHead& h, int64_t max_samples) {
  return mahalanobis_ratio(h.keys.data(), h.tokens, h.queries.data(), int64_t(h.group) * h.tokens, h.head_dim,
                           max_samples);
}

}  // namespace rattn
