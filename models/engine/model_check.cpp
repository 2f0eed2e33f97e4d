#include "models/engine/model_check.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <unistd.h>
#include <cmath>
#include <string>

#include "core/error.h"
#include "models/engine/eval_accuracy.h"

namespace rattn::engine {
namespace {

int32_t argmax(const float* v, int64_t n) { return int32_t(std::max_element(v, v + n) - v); }

// Rows of logits computed at once.
constexpr int64_t kHeadRows = 32;

}  // namespace

TeacherForcedText::TeacherForcedText(const GemmaModel& model, const std::vector<int32_t>& ids, int64_t positions,
                                     const std::function<void(int64_t)>& progress)
    : model_(model),
      prefix_(int64_t(ids.size()) - positions),
      seq_(model, int64_t(ids.size()) + 1) {
  if (positions < 1 || prefix_ < 1)
    fail(Status::invalid_argument, "model check: " + std::to_string(positions) + " scored positions need a text of more than " +
                                       std::to_string(positions) + " tokens (have " + std::to_string(ids.size()) + ")");
  const GemmaConfig& c = model.config();
  qkv_.init(c, prefix_);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + prefix_);
  tail_.assign(ids.begin() + prefix_, ids.end());
  const std::vector<float> h_last = seq_.prefill(prefix, {prefix_ - 1}, 512, qkv_.hook(), progress);
  // Full attention at every scored position in one batched pass: what
  // token-by-token teacher-forced decoding computes.
  std::vector<float> h(size_t(positions) * size_t(c.d_model));
  std::copy(h_last.begin(), h_last.end(), h.begin());
  if (positions > 1) {
    std::vector<int64_t> rows(size_t(positions - 1));
    for (int64_t i = 0; i + 1 < positions; ++i) rows[size_t(i)] = i;
    const std::vector<float> h_tail = seq_.prefill(std::vector<int32_t>(tail_.begin(), tail_.end() - 1), rows, 512);
    std::copy(h_tail.begin(), h_tail.end(), h.begin() + c.d_model);
  }
  seq_.truncate(prefix_);
  full_logits_.resize(size_t(positions) * size_t(c.vocab));
  for (int64_t r0 = 0; r0 < positions; r0 += kHeadRows)
    model.output_head(&h[size_t(r0) * size_t(c.d_model)], std::min(kHeadRows, positions - r0),
                      &full_logits_[size_t(r0) * size_t(c.vocab)]);
}

TeacherForcedText::~TeacherForcedText() {
  for (const auto& [key, path] : states_) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

PlanCheck TeacherForcedText::check(const RattnAttentionParams& params, int64_t max_disagreements,
                                   const std::function<void(int64_t)>& step, const std::string& build_key) {
  const GemmaConfig& c = model_.config();
  // The shared prefill stays as it was, whatever happens here.
  struct Rewind {
    GemmaSequence& seq;
    int64_t to;
    ~Rewind() { seq.truncate(to); }
  } rewind{seq_, prefix_};
  RattnAttentionParams p = params;
  const auto saved = build_key.empty() ? states_.end() : states_.find(build_key);
  if (saved != states_.end()) p.load_state = saved->second;
  RattnAttention backend(c, p, qkv_, nullptr);
  if (!build_key.empty() && saved == states_.end()) {
    static std::atomic<uint64_t> serial{0};
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("rattn_model_check." + std::to_string(::getpid()) + "." + std::to_string(serial++) +
                               ".rattnseq"))
                                 .string();
    backend.save_state(path);
    states_[build_key] = path;
  }
  PlanCheck r;
  double nll_rattn = 0, nll_full = 0, kl = 0;
  // Position 0 is the prefill's own output.
  std::vector<float> logits(full_logits_.begin(), full_logits_.begin() + c.vocab);
  const int64_t S = positions();
  for (int64_t i = 0; i < S; ++i) {
    const float* full = &full_logits_[size_t(i) * size_t(c.vocab)];
    ++r.positions;
    if (argmax(logits.data(), c.vocab) == argmax(full, c.vocab)) ++r.agreeing;
    nll_rattn += token_nll(logits.data(), c.vocab, tail_[size_t(i)]);
    nll_full += token_nll(full, c.vocab, tail_[size_t(i)]);
    kl += kl_divergence(full, logits.data(), c.vocab);
    if (step) step(i + 1);
    if (max_disagreements >= 0 && r.disagreeing() > max_disagreements) {
      r.stopped_early = i + 1 < S;
      break;
    }
    // Teacher forcing: the next input is the text's token, not a prediction.
    if (i + 1 < S) logits = seq_.decode(tail_[size_t(i)], &backend);
  }
  r.perplexity_ratio = std::exp((nll_rattn - nll_full) / double(r.positions));
  r.kl_mean = kl / double(r.positions);
  return r;
}

}  // namespace rattn::engine
