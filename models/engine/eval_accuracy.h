#pragma once
// The accuracy measures of `rattn eval` against full attention: KL divergence
// of the next-token distributions, the perplexity change with a bootstrap
// interval, and the exact check (rattn retrieving every offloaded token must
// equal full attention up to the K/V storage precision).
#include <cstdint>
#include <string>
#include <vector>

#include "models/engine/gemma.h"

namespace rattn::engine {

// KL(P || Q) in nats, P = softmax(p_logits) (the reference, full attention),
// Q = softmax(q_logits); float64 throughout.
double kl_divergence(const float* p_logits, const float* q_logits, int64_t n);
// -log softmax(logits)[target], float64.
double token_nll(const float* logits, int64_t n, int32_t target);
// Largest logit minus the second largest.
double top2_margin(const float* logits, int64_t n);

// The perplexity change exp(mean(d)) - 1 of per-token NLL differences
// d = nll_rattn - nll_full, with a percentile bootstrap 95% interval over the
// scored tokens: `resamples` resamples drawn from a generator seeded with
// `seed`, so that a run reproduces its interval.
struct PerplexityDelta {
  double delta = 0, lo = 0, hi = 0;
  bool excludes_zero() const { return lo > 0 || hi < 0; }
};
PerplexityDelta perplexity_delta(const std::vector<double>& nll_diff, int resamples = 2000, uint64_t seed = 1);

// Dense attention over an engine sequence's cache with the keys and values
// rounded to fp16 (round to nearest even, as rattn's f16 storage), in float64:
// the full attention a user of f16 storage would get with nothing dropped.
class RoundedKvAttention : public GlobalAttentionBackend {
 public:
  RoundedKvAttention(const GemmaConfig& cfg, const GemmaSequence& model_seq);
  void decode(int layer, int64_t pos, const float* q, const float* k, const float* v, float* out) override;

 private:
  const GemmaConfig& cfg_;
  const GemmaSequence& model_seq_;
  std::vector<std::vector<float>> k16_, v16_;  // per layer, rounded rows [pos, n_kv_head, d] so far
};

// One decode step of the exact check.
struct ExactCheckStep {
  double logits_rel_error = 0;   // rattn against full attention, relative L2
  double storage_rel_error = 0;  // full attention over rounded K/V against full attention, relative L2
  double storage_abs_error = 0;  // the same, largest |logit difference|
  double full_margin = 0;        // full attention's top-2 margin
  double full_max_abs = 0;       // largest |logit| of full attention
  bool argmax_equal = true;
};
// `rounded`: logits of full attention over fp16-rounded K/V, or nullptr for
// fp32 storage (no rounding to allow for).
ExactCheckStep exact_check_step(const float* full, const float* rattn, const float* rounded, int64_t vocab);

// The gates, from the storage rounding measured on the same run (its largest
// error over the steps stands for the run: its size follows the K/V and the
// attention pattern the steps share) times kSafety, plus fp32 floors:
//  - logits: relative L2 <= kFloor + kSafety * max storage_rel_error;
//  - an argmax flip fails only where full attention's top-2 margin exceeds
//    2 * (kFloor * full_max_abs + kSafety * max storage_abs_error): each of
//    the two logits can move by the rounding error, in opposite directions.
struct ExactCheckReport {
  static constexpr double kFloor = 1e-4;  // fp32 accumulation order (measured: 3.5e-6 at 32K with f32 K/V)
  static constexpr double kSafety = 2.0;  // rattn's rounding against the estimate's (same K/V, other order)
  bool pass = true;
  double logits_gate = 0, logits_rel_error_max = 0;
  double storage_rel_error_max = 0, storage_abs_error_max = 0;
  struct Tie {
    int64_t step = 0;
    double margin = 0, bound = 0;
    bool flipped = false;
  };
  std::vector<Tie> near_ties;          // steps whose margin is within the bound (flip or not)
  std::vector<int64_t> failing_flips;  // argmax flips with a margin above the bound
  std::string reason;                  // empty when it passes
};
ExactCheckReport exact_check(const std::vector<ExactCheckStep>& steps);

}  // namespace rattn::engine
