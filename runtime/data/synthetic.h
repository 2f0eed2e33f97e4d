#pragma once
// Synthetic query/key/value sets for one KV head and its GQA group of query
// heads, out of distribution the way real attention is (see docs/data.md):
//  - keys and queries have different means and covariance spectra;
//  - rotary position embedding (rotate-half layout) is applied by position;
//  - a few sink keys (the first tokens) score high for every query;
//  - keys and queries share a slowly varying "position" component in the
//    high-frequency dimensions, so queries favour recent tokens;
//  - keys carry a topic (runs of tokens share one), and many queries target
//    the topic of a distant token or one specific distant key ("needle").
// Deterministic by seed on every platform (own RNG, no std distributions).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rattn {

struct SyntheticSpec {
  int64_t tokens = 4096;
  int head_dim = 128;       // even
  int group = 4;            // query heads sharing this KV head
  uint64_t seed = 1;
  double rope_base = 500000.0;
  int sink_tokens = 4;
  int64_t tokens_per_topic = 256;   // topics = tokens / this (at least 8)
  double topic_query_fraction = 0.7;  // queries that target a distant topic
  double needle_query_fraction = 0.3; // queries that target one distant key
  int64_t min_target_distance = 512;  // targets lie at least this far back
  double key_only_std = 3.5;          // key variance in the pairs queries ignore
};

struct SyntheticHead {
  int64_t tokens = 0;
  int head_dim = 0;
  int group = 0;
  std::vector<float> keys;     // [T, d], RoPE applied
  std::vector<float> values;   // [T, d]
  std::vector<float> queries;  // [group, T, d]: the query of each token position, RoPE applied
  // Ground truth of the construction, for tests and diagnostics:
  std::vector<int32_t> topic_of;       // [T]: topic of each token
  std::vector<int32_t> target_topic;   // [group, T]: topic a query targets, -1 if none
  std::vector<int64_t> target_key;     // [group, T]: the distant key a query targets, -1 if none
  const float* query(int g, int64_t t) const {
    return queries.data() + (size_t(g) * size_t(tokens) + size_t(t)) * size_t(head_dim);
  }
};

// Throws Error(invalid_argument) on a bad spec (odd dim, tokens < 1, ...).
SyntheticHead make_synthetic(const SyntheticSpec& spec);

// Mean Mahalanobis distance of `queries` to the distribution of `keys` (mean
// and covariance estimated from at most `max_samples` evenly spaced keys,
// ridge-regularised) divided by the same mean for the keys themselves.
double mahalanobis_ratio(const float* keys, int64_t num_keys, const float* queries, int64_t num_queries,
                         int dim, int64_t max_samples = 8192);
// All query heads of the group against the keys.
double mahalanobis_ratio(const SyntheticHead& head, int64_t max_samples = 8192);

// Applies RoPE (rotate-half layout: pairs (i, i + d/2), angle pos * base^(-2i/d)) in place.
void apply_rope(float* vec, int dim, int64_t position, double base);

}  // namespace rattn
