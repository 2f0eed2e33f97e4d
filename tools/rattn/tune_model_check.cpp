#include "tools/rattn/tune_model_check.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "autotune/calib_sets.h"
#include "autotune/search_tuner.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "models/engine/model_check.h"
#include "models/engine/text_util.h"

namespace rattn::cli {

std::string model_check_scope(const ModelCheckConfig& config) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(config.gguf, ec);
  std::string s = "model " + std::filesystem::path(config.gguf).filename().string() + " bytes " +
                  std::to_string(ec ? 0 : size);
  for (const std::string& t : config.texts) {
    const std::string text = engine::read_text_file(t);
    s += "; text " + std::filesystem::path(t).filename().string() + " " + hex64(fnv1a64(text.data(), text.size()));
  }
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "; positions %lld tokens %lld agreement %.6f at %.6f perplexity %.6f threads %d kv %d",
                static_cast<long long>(config.positions), static_cast<long long>(config.tokens), config.min_agreement,
                config.confidence, config.max_perplexity_change, config.threads, int(config.kv_storage));
  s += buf;
  if (!config.reference_plan.empty()) {
    const std::string ref = engine::read_text_file(config.reference_plan);
    std::snprintf(buf, sizeof buf, "; reference %s KL ratio %.6f", hex64(fnv1a64(ref.data(), ref.size())).c_str(),
                  config.max_kl_ratio);
    s += buf;
  }
  return s;
}

namespace {

// What a plan's prefilled state depends on: the plan with its decode-time
// values (searches, tail sample, top_k beyond retrieval on or off) set
// aside. Plans of one key share one index build per text.
std::string build_key(const std::string& plan_text) {
  Program p = parse_program(plan_text, "model-check.ra");
  RetrievalPlan& plan = p.plan;
  const bool retrieves = plan.top_k.default_value() > 0;
  for (ParamDomain* decode_only : {&plan.top_k, &plan.tail_samples, &plan.search_queue, &plan.search_patience,
                                   &plan.search_seeds, &plan.search_expand_first, &plan.search_full_expand})
    *decode_only = ParamDomain::fixed_value(0);
  plan.top_k = ParamDomain::fixed_value(retrieves ? 1 : 0);
  plan.layer_search.clear();
  return format_program(p);
}

struct CheckState {
  ModelCheckConfig config;
  std::unique_ptr<engine::GemmaModel> model;
  std::vector<std::unique_ptr<engine::TeacherForcedText>> texts;  // prepared at the first check
  double reference_kl = -1;  // the reference plan's KL pooled over the texts; < 0: not yet checked
};

}  // namespace

decltype(PlanTuneOptions::check_model) make_model_check(const ModelCheckConfig& config) {
  auto state = std::make_shared<CheckState>();
  state->config = config;
  return [state](const std::string& plan_text, int64_t context,
                 const std::function<void(double, const std::string&)>& progress) {
    const ModelCheckConfig& cfg = state->config;
    const double n_texts = double(cfg.texts.size());
    if (!state->model) {
      engine::set_engine_threads(cfg.threads);
      state->model = engine::GemmaModel::load(cfg.gguf);
    }
    const int64_t tokens = cfg.tokens > 0 ? cfg.tokens : context;
    // The plan as a file: the C API takes a path.
    const std::string plan_path = (std::filesystem::temp_directory_path() /
                                   ("rattn_model_check." + std::to_string(::getpid()) + ".ra"))
                                      .string();
    write_file_atomic(plan_path, plan_text);
    struct Remove {
      std::string path;
      ~Remove() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
      }
    } remove{plan_path};
    engine::RattnAttentionParams params;
    params.plan_path = plan_path;
    params.kv_storage = cfg.kv_storage;
    params.threads = cfg.threads;
    // Disagreements the texts together may have and still pass.
    const int64_t pooled = cfg.positions * int64_t(cfg.texts.size());
    const int64_t allowed = most_misses_allowed(pooled, cfg.min_agreement, cfg.confidence);
    int64_t disagreeing = 0;
    // Each text prefilled once, at its first use.
    auto text_at = [&](size_t i, double share_of_check) -> engine::TeacherForcedText& {
      if (state->texts.size() <= i) {
        const std::string name = std::filesystem::path(cfg.texts[i]).filename().string();
        const std::string text = engine::read_text_file(cfg.texts[i]);
        const std::vector<int32_t> ids = engine::tokenize_prefix(*state->model, text, tokens,
                                                                 "rattn tune: --check-text '" + cfg.texts[i] + "'");
        const int64_t prefix = tokens - cfg.positions;
        state->texts.push_back(std::make_unique<engine::TeacherForcedText>(
            *state->model, ids, cfg.positions, [&](int64_t done) {
              progress((double(i) + share_of_check * double(done) / double(prefix)) / n_texts,
                       name + ": prefill " + std::to_string(done) + " / " + std::to_string(prefix));
            }));
      }
      return *state->texts[i];
    };
    if (!cfg.reference_plan.empty() && state->reference_kl < 0) {
      engine::RattnAttentionParams ref = params;
      ref.plan_path = cfg.reference_plan;
      // Keyed like a candidate, so that one with the reference's index
      // build loads it rather than building again.
      const std::string ref_key = build_key(engine::read_text_file(cfg.reference_plan));
      double kl = 0;
      for (size_t i = 0; i < cfg.texts.size(); ++i) {
        const engine::PlanCheck r = text_at(i, 0.5).check(
            ref, -1,
            [&](int64_t step) {
              if (step % 16 == 0)
                progress(double(i) / n_texts, "the reference plan: text " + std::to_string(i + 1) + ", step " +
                                                  std::to_string(step) + " / " + std::to_string(cfg.positions));
            },
            ref_key);
        kl += r.kl_mean / n_texts;  // every text decodes all its positions: the pooled mean
      }
      state->reference_kl = kl;
    }
    const std::string key = build_key(plan_text);
    ModelCheckOutcome outcome;
    outcome.passed = allowed >= 0;
    outcome.confidence = cfg.confidence;
    for (size_t i = 0; i < cfg.texts.size() && outcome.passed; ++i) {
      const std::string name = std::filesystem::path(cfg.texts[i]).filename().string();
      const double base = state->texts.size() <= i ? 0.5 : 0;  // the share a prefill takes
      const engine::PlanCheck r = text_at(i, base).check(
          params, allowed - disagreeing,
          [&](int64_t step) {
            if (step % 16 == 0)
              progress((double(i) + base + (1 - base) * double(step) / double(cfg.positions)) / n_texts,
                       name + ": step " + std::to_string(step) + " / " + std::to_string(cfg.positions));
          },
          key);
      ModelCheckText t;
      t.text = name;
      t.positions = r.positions;
      t.agreeing = r.agreeing;
      t.perplexity_ratio = r.perplexity_ratio;
      t.kl_mean = r.kl_mean;
      t.stopped_early = r.stopped_early;
      disagreeing += r.disagreeing();
      outcome.texts.push_back(t);
      // A failure ends the check: the later texts cannot change the outcome.
      outcome.passed = disagreeing <= allowed && !r.stopped_early &&
                       std::fabs(r.perplexity_ratio - 1) <= cfg.max_perplexity_change;
    }
    // The bound over what was decoded (all the texts when passed).
    int64_t decoded = 0;
    double kl = 0;
    for (const ModelCheckText& t : outcome.texts) decoded += t.positions, kl += t.kl_mean * double(t.positions);
    outcome.kl_mean = decoded > 0 ? kl / double(decoded) : 0.0;
    if (state->reference_kl >= 0) {
      outcome.kl_bound = cfg.max_kl_ratio * state->reference_kl;
      // Judged once every text is decoded (the reference's is over all of them).
      if (outcome.passed) outcome.passed = outcome.kl_mean <= outcome.kl_bound;
    }
    outcome.agreement_bound =
        decoded > 0 ? rate_lower_bound(decoded - disagreeing, decoded, cfg.confidence) : 0.0;
    return outcome;
  };
}

}  // namespace rattn::cli
