#include "runtime/data/synthetic_docs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/data/rng.h"
#include "runtime/data/synthetic_head.h"

namespace rattn {
namespace {

using data::Rng;

// Per-dimension standard deviations whose RoPE-pair variances follow
// scale * (rank + 1)^-power over a random ranking of the pairs.
std::vector<double> pair_power_law(Rng& rng, int d, double scale, double power) {
  const int h = d / 2;
  std::vector<int> rank(static_cast<size_t>(h));
  std::iota(rank.begin(), rank.end(), 0);
  for (int i = h - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[size_t(rng.below(i + 1))]);
  std::vector<double> sd(static_cast<size_t>(d));
  for (int i = 0; i < h; ++i) {
    // Pair variance v split evenly over its two dimensions.
    const double v = scale * std::pow(double(rank[size_t(i)] + 1), -power);
    sd[size_t(i)] = sd[size_t(i + h)] = std::sqrt(v / 2.0);
  }
  return sd;
}

}  // namespace

SyntheticHead make_document_synthetic(const DocumentSpec& spec) {
  const int d = spec.head_dim, h = d / 2;
  const int64_t T = spec.tokens;
  data::check_head_shape("document synthetic", T, d, 16, spec.group);
  if (spec.mean_document < 1 || spec.themes < 1 || spec.tokens_per_subtopic < 1 || !(spec.rope_base > 1.0))
    fail(Status::invalid_argument, "document synthetic: bad document, theme or RoPE spec");
  if (spec.massive_pairs < 0 || spec.massive_pairs >= h / 2)
    fail(Status::invalid_argument, "document synthetic: massive_pairs must be in [0, head_dim / 4)");
  if (!(spec.local_query_fraction >= 0 && spec.recall_query_fraction >= 0 &&
        spec.local_query_fraction + spec.recall_query_fraction <= 1.0))
    fail(Status::invalid_argument, "document synthetic: query fractions must be >= 0 and sum to <= 1");
  Rng rng(spec.seed ^ 0xd0c5);
  SyntheticHead out = data::allocate_head(T, d, spec.group);

  // Key content (noise, topics, position) shares one power-law shape, so the
  // keys' pair variances follow it; queries get a steeper one of their own.
  const std::vector<double> sk = pair_power_law(rng, d, 2.0, spec.key_power);
  std::vector<uint8_t> massive(static_cast<size_t>(d), 0);
  for (int n = 0; n < spec.massive_pairs;) {
    const int pair = int(rng.below(h));
    if (massive[size_t(pair)]) continue;
    massive[size_t(pair)] = massive[size_t(pair + h)] = 1;
    ++n;
  }
  std::vector<double> mu_k(static_cast<size_t>(d)), pos(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) {
    mu_k[size_t(j)] = 0.5 * sk[size_t(j)] * rng.normal();
    pos[size_t(j)] = 0.7 * sk[size_t(j)] * rng.normal();  // pre-RoPE: recency after rotation
  }
  // Themes and their subtopics; a topic id is theme * subtopics + subtopic.
  const int64_t subs = std::max<int64_t>(4, T / (int64_t(spec.themes) * spec.tokens_per_subtopic));
  const int64_t num_topics = int64_t(spec.themes) * subs;
  std::vector<double> topic(size_t(num_topics) * size_t(d));
  {
    std::vector<double> theme(size_t(spec.themes) * size_t(d));
    for (auto& x : theme) x = rng.normal();
    for (int64_t c = 0; c < num_topics; ++c)
      for (int j = 0; j < d; ++j)
        topic[size_t(c) * size_t(d) + size_t(j)] =
            sk[size_t(j)] * (0.8 * theme[size_t(c / subs) * size_t(d) + size_t(j)] + 0.6 * rng.normal());
  }
  std::vector<double> theme_cdf(static_cast<size_t>(spec.themes));
  {
    double acc = 0;
    for (int a = 0; a < spec.themes; ++a) theme_cdf[size_t(a)] = acc += std::pow(double(a + 1), -spec.zipf);
    for (auto& c : theme_cdf) c /= acc;
  }
  // Documents: geometric lengths, each one topic.
  std::vector<int32_t> topic_of(static_cast<size_t>(T));
  {
    int32_t cur = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t == 0 || rng.uniform() < 1.0 / double(spec.mean_document)) {
        const double u = rng.uniform();
        const int64_t a = std::lower_bound(theme_cdf.begin(), theme_cdf.end(), u) - theme_cdf.begin();
        cur = int32_t(std::min<int64_t>(a, spec.themes - 1) * subs + rng.below(subs));
      }
      topic_of[size_t(t)] = cur;
    }
  }
  // The queries' common offset: spread over every non-massive dimension,
  // position-independent (added after RoPE); sinks align with it.
  std::vector<double> mu_qc(static_cast<size_t>(d), 0.0);
  double offset_norm = 0;
  for (int j = 0; j < d; ++j)
    if (!massive[size_t(j)]) {
      mu_qc[size_t(j)] = 0.9 * rng.normal();
      offset_norm += mu_qc[size_t(j)] * mu_qc[size_t(j)];
    }
  offset_norm = std::sqrt(std::max(offset_norm, 1e-12));

  // Keys: RoPE(mean + content noise + position) + topic + massive channels;
  // token 0 is the sink, delimiters weak sinks.
  std::vector<float> pre(static_cast<size_t>(d));
  for (int64_t t = 0; t < T; ++t) {
    float* k = out.keys.data() + size_t(t) * size_t(d);
    const double* tc = topic.data() + size_t(topic_of[size_t(t)]) * size_t(d);
    const bool delimiter = t > 0 && rng.uniform() < spec.delimiter_fraction;
    const double content = (t == 0 || delimiter) ? 0.3 : 1.0;
    for (int j = 0; j < d; ++j)
      pre[size_t(j)] = float(content * (mu_k[size_t(j)] + sk[size_t(j)] * rng.normal()) + pos[size_t(j)]);
    apply_rope(pre.data(), d, t, spec.rope_base);
    // Delimiters score below a key of the query's own topic (~1.2 |topic|^2)
    // and above an unrelated one: weak sinks, not the whole top-k.
    const double sink = t == 0 ? 12.0 : delimiter ? 2.0 : 0.0;
    for (int j = 0; j < d; ++j) {
      double x = double(pre[size_t(j)]) + content * tc[j] + sink * mu_qc[size_t(j)] / offset_norm;
      if (massive[size_t(j)]) x += j < h ? spec.massive_scale * (1.0 + 0.25 * rng.normal()) : 0.5 * rng.normal();
      k[j] = float(x);
    }
    float* v = out.values.data() + size_t(t) * size_t(d);
    for (int j = 0; j < d; ++j) v[j] = float(rng.normal());
  }

  out.target_topic.assign(size_t(spec.group) * size_t(T), -1);
  out.target_key.assign(size_t(spec.group) * size_t(T), -1);
  for (int g = 0; g < spec.group; ++g) {
    const std::vector<double> sq = pair_power_law(rng, d, 1.5, spec.query_power);
    std::vector<double> mu_q(static_cast<size_t>(d));
    for (int j = 0; j < d; ++j) mu_q[size_t(j)] = 0.3 * rng.normal();
    for (int64_t t = 0; t < T; ++t) {
      float* q = out.queries.data() + (size_t(g) * size_t(T) + size_t(t)) * size_t(d);
      for (int j = 0; j < d; ++j) q[j] = float(mu_q[size_t(j)] + sq[size_t(j)] * rng.normal() + 2.0 * pos[size_t(j)]);
      apply_rope(q, d, t, spec.rope_base);
      for (int j = 0; j < d; ++j) q[j] += float(mu_qc[size_t(j)]);
      const size_t at = size_t(g) * size_t(T) + size_t(t);
      const double u = rng.uniform();
      int64_t src = -1;  // a token whose topic the query targets
      if (u < spec.local_query_fraction) {
        src = t;
      } else if (u < spec.local_query_fraction + spec.recall_query_fraction) {
        if (t > 256) src = rng.below(t - 256);
      } else if (t > 65) {
        // Copy: one earlier key (its direction over the dimensions queries see).
        const int64_t j0 = 1 + rng.below(t - 65);
        const float* kj = out.keys.data() + size_t(j0) * size_t(d);
        double n2 = 0;
        for (int j = 0; j < d; ++j)
          if (!massive[size_t(j)]) n2 += double(kj[j]) * kj[j];
        const double scale = 7.0 / std::sqrt(std::max(n2, 1e-12));
        for (int j = 0; j < d; ++j)
          if (!massive[size_t(j)]) q[j] += float(scale * kj[j]);
        out.target_key[at] = j0;
      }
      if (src >= 0) {
        const double* tc = topic.data() + size_t(topic_of[size_t(src)]) * size_t(d);
        for (int j = 0; j < d; ++j) q[j] += float(1.2 * tc[j]);
        out.target_topic[at] = topic_of[size_t(src)];
      }
      for (int j = 0; j < d; ++j)
        if (massive[size_t(j)]) q[j] *= 0.02f;
    }
  }
  out.topic_of = std::move(topic_of);
  return out;
}

bool is_synthetic_distribution(const std::string& name) { return name == "topics" || name == "documents"; }

namespace {

[[noreturn]] void unknown_distribution(const std::string& name) {
  fail(Status::invalid_argument, "unknown synthetic distribution '" + name + "' (expected topics or documents)");
}

// A default spec (SyntheticSpec or DocumentSpec) of this shape and seed.
template <class Spec>
Spec shaped(int64_t tokens, int head_dim, int group, uint64_t seed) {
  Spec s;
  s.tokens = tokens;
  s.head_dim = head_dim;
  s.group = group;
  s.seed = seed;
  return s;
}

}  // namespace

SyntheticHead make_named_synthetic(const std::string& name, int64_t tokens, int head_dim, int group, uint64_t seed) {
  if (name == "topics") return make_synthetic(shaped<SyntheticSpec>(tokens, head_dim, group, seed));
  if (name == "documents") return make_document_synthetic(shaped<DocumentSpec>(tokens, head_dim, group, seed));
  unknown_distribution(name);
}

double synthetic_rope_base(const std::string& name) {
  if (name == "documents") return DocumentSpec{}.rope_base;
  if (name == "topics") return SyntheticSpec{}.rope_base;
  unknown_distribution(name);
}

}  // namespace rattn
