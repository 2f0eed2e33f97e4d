#pragma once
// A second synthetic distribution, made by a different generator than
// make_synthetic (runtime/data/synthetic.h), so that index results can be
// checked on two unlike constructions (docs/data.md, "Documents"):
//  - spectra: power laws over RoPE pairs (keys flatter than queries) instead
//    of exponential decays over dimensions, and no offset subspace: the
//    queries' common offset is spread over every dimension;
//  - a few "massive" key channels (large magnitudes queries ignore) instead
//    of many key-only channels;
//  - topics: hierarchical (themes with subtopics, Zipf popularity) in long
//    documents (geometric lengths, mean 384 tokens), not flat 24-token runs;
//  - queries: the current document's topic (local), an earlier token's topic
//    (recall) or a copy of one earlier key;
//  - RoPE base 10000 (500000 there); one sink plus weak "delimiter" sinks.
// Deterministic by seed on every platform.
#include <cstdint>
#include <string>

#include "runtime/data/synthetic.h"

namespace rattn {

struct DocumentSpec {
  int64_t tokens = 4096;
  int head_dim = 128;  // multiple of 4, >= 16
  int group = 4;
  uint64_t seed = 1;
  double rope_base = 10000.0;
  int64_t mean_document = 384;          // document lengths: geometric with this mean
  int themes = 12;                      // each with subtopics
  int64_t tokens_per_subtopic = 2048;   // subtopics per theme = max(4, tokens / (themes * this))
  double zipf = 1.1;                    // theme popularity ~ (rank + 1)^-zipf
  double key_power = 0.8;               // key variance of RoPE pair of rank r ~ (r + 1)^-key_power
  double query_power = 1.6;             // the same for the queries' own variance
  int massive_pairs = 1;                // RoPE pairs with large key magnitudes queries ignore
  double massive_scale = 8.0;
  double delimiter_fraction = 1.0 / 48; // tokens that act as weak sinks
  double local_query_fraction = 0.45;   // queries that target the current document's topic
  double recall_query_fraction = 0.35;  // ... an earlier token's topic; the rest copy one earlier key
};

// Returns the same structure as make_synthetic (target_topic, target_key and
// topic_of hold this construction's ground truth). Throws
// Error(invalid_argument) on a bad spec.
SyntheticHead make_document_synthetic(const DocumentSpec& spec);

// The synthetic distributions by name, for the CLI: "topics" (make_synthetic)
// and "documents" (make_document_synthetic), each with its default spec.
bool is_synthetic_distribution(const std::string& name);
SyntheticHead make_named_synthetic(const std::string& name, int64_t tokens, int head_dim, int group, uint64_t seed);
double synthetic_rope_base(const std::string& name);

}  // namespace rattn
