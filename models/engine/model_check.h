#pragma once
// The model in the loop: a text's last positions decoded teacher-forced with
// a rattn plan on the global layers, against full attention, from one
// prefill shared by every plan checked. `rattn tune --model-check` ranks its
// candidates by this: a layer's attention error does not always order two
// settings the way the model's next token does.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "models/engine/gemma.h"
#include "models/engine/rattn_attention.h"

namespace rattn::engine {

struct PlanCheck {
  int64_t positions = 0;  // scored positions decoded (fewer when stopped early)
  int64_t agreeing = 0;   // where rattn's greedy next token equals full attention's
  int64_t disagreeing() const { return positions - agreeing; }
  double agreement() const { return positions > 0 ? double(agreeing) / double(positions) : 1.0; }
  // exp(mean NLL under rattn - mean NLL under full attention) over the
  // positions decoded: the perplexity ratio.
  double perplexity_ratio = 1;
  double kl_mean = 0;  // KL(full attention's next-token distribution || rattn's), mean over the positions
  bool stopped_early = false;  // more disagreements than `max_disagreements`
};

class TeacherForcedText {
 public:
  // Prefills all but the last `positions` tokens of `ids` (keeping the
  // global layers' Q/K/V for the index builds) and scores full attention at
  // the last `positions`: its logits (positions x vocabulary floats: 256 MiB
  // for 256 positions of Gemma-3's 262144 tokens).
  // `progress(done)` counts prefilled tokens.
  TeacherForcedText(const GemmaModel& model, const std::vector<int32_t>& ids, int64_t positions,
                    const std::function<void(int64_t)>& progress = nullptr);
  TeacherForcedText(const TeacherForcedText&) = delete;
  TeacherForcedText& operator=(const TeacherForcedText&) = delete;

  int64_t positions() const { return int64_t(tail_.size()); }
  int64_t context() const { return prefix_; }

  // The plan's rattn on the global layers (index builds from the kept
  // prefill), decoding the scored positions teacher-forced. Stops once more
  // than `max_disagreements` positions disagree (< 0: never). `step(i)`
  // after each position.
  // `build_key` names the plan's prefilled state (its layout, sinks,
  // window and index build: not its searches, top_k or tail); plans of one
  // key after the first load the first's saved state instead of building
  // their indexes again. "": always built.
  PlanCheck check(const RattnAttentionParams& params, int64_t max_disagreements = -1,
                  const std::function<void(int64_t)>& step = nullptr, const std::string& build_key = "");
  ~TeacherForcedText();

 private:
  std::map<std::string, std::string> states_;  // build key -> saved state file
  const GemmaModel& model_;
  std::vector<int32_t> tail_;  // the scored positions' targets
  int64_t prefix_ = 0;
  GemmaSequence seq_;
  GlobalQkv qkv_;
  std::vector<float> full_logits_;   // [positions, vocab]: full attention's
};

}  // namespace rattn::engine
