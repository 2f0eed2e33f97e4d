#pragma once
// What the tuning pass writes besides the plan: tuned.json (every choice,
// time and accuracy figure, the fingerprint) and report.md (the summary, the
// time/accuracy frontier per sampled layer as SVG, the choice on other GPU
// targets from the same measurements, the GPU model against the GPU when
// one was measured, and with --build the build recipes and why the chosen
// one won).
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "autotune/plan_tuner.h"

namespace rattn {

// One line: the choice, its per-token time, the baseline's and the ratio.
std::string plan_tuning_summary(const TuningRun& t);

boost::json::object plan_tuning_json(const Program& program, const PlanTuneOptions& opt, const TuningRun& t);

// `others`: the same measurements chosen for other targets (choose_plan).
std::string plan_tuning_report(const Program& program, const PlanTuneOptions& opt, const TuningRun& t,
                               const std::vector<TuningRun>& others);

// The GPU time model against static-set steps measured on `gpu`: one entry
// per measured set size and kernel variant (`measured`: rows -> us per
// variant, NaN where the variant was not built), as JSON and as a markdown
// table (`chosen`: the variant marked "(chosen)", -1 none).
boost::json::array gpu_model_check_json(const GpuSpec& gpu, const ModelLayout& model,
                                        const std::vector<GpuKernelVariant>& variants,
                                        const std::map<int64_t, std::vector<double>>& measured);
std::string gpu_model_check_table(const GpuSpec& gpu, const ModelLayout& model,
                                  const std::vector<GpuKernelVariant>& variants,
                                  const std::map<int64_t, std::vector<double>>& measured, int chosen = -1);

// The paper's figure the report compares with: the whole Llama-3-8B model at
// 128K tokens on a 10-core CPU + RTX 4090 (RetrievalAttention, arXiv
// 2409.10516, its later version; ../shared/docs/algorithm.md).
inline constexpr double kPaperTokenSeconds = 0.107;

}  // namespace rattn
