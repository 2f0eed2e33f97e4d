#pragma once
// `rattn tune --model-check N`: the pass's candidates run through the real
// model (the reference engine, Gemma-3 GGUF) on check texts, teacher-forced
// against full attention (models/engine/model_check.h).
#include <cstdint>
#include <string>
#include <vector>

#include "autotune/plan_tuner.h"
#include "rattn.h"

namespace rattn::cli {

struct ModelCheckConfig {
  std::string gguf;                // the model file
  std::vector<std::string> texts;  // check texts: never the ones the choice is validated on
  int64_t positions = 512;         // scored positions per text, the last ones of its context
  int64_t tokens = 0;              // the text's context; 0: the pass's deployment context
  // Greedy next-token agreement with full attention, pooled over the texts,
  // met at `confidence` (rate_lower_bound).
  double min_agreement = 0.99;
  double confidence = 0.95;
  double max_perplexity_change = 0.01;  // |perplexity ratio - 1|, every text
  // A plan the candidates must be about as accurate as ("": none): checked
  // once on the texts; a candidate's KL pooled over them may be at most
  // max_kl_ratio times the reference's. The KL sees every position, where
  // agreement counts only the rare flips.
  std::string reference_plan;
  double max_kl_ratio = 1.5;
  int threads = 2;
  rattn_dtype kv_storage = RATTN_F16;
};

// What an outcome depends on besides the plan: the model file (name, size),
// each text's content hash, positions, tokens, bounds, threads, K/V storage.
std::string model_check_scope(const ModelCheckConfig& config);

// PlanTuneOptions::check_model for `config`: the model loads and each text
// prefills once (at the first check; kept for the later ones).
decltype(PlanTuneOptions::check_model) make_model_check(const ModelCheckConfig& config);

}  // namespace rattn::cli
