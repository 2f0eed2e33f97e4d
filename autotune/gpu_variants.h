#pragma once
// The static set's GPU kernel in the pass per hardware: the variants
// searched (gpu_kernel_variants, plan_tuner.h) and what a chosen one fixes.
#include <boost/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autotune/plan_tuner.h"

namespace rattn {

// Whether the model has sliding-window layers (their static sets differ
// from the global layers', so a plan-wide split count cannot suit both).
bool has_local_layers(const ModelLayout& model);

// Fixes the plan's kernel.cuda.* domains to `v`'s knobs; for the runtime's
// split count (no cuda.splits, or 0) the count it makes for a set of
// `rows` rows, left a range where the model has sliding-window layers; the
// other domains at their defaults.
void fix_gpu_kernel_knobs(const ModelLayout& model, const GpuKernelVariant& v, int64_t rows, RetrievalPlan* plan);

// Per window (rows = sinks + window), every variant's static-set step on
// the GPU present: from `recall` (the tuning database, keyed by shape, rows
// and variant) when it holds them all, else measured and handed to
// `record`. NaN: the generator refuses the variant. Empty when the GPU
// cannot be used.
std::map<int64_t, std::vector<double>> gpu_variant_times(
    const ModelLayout& model, int64_t sinks, const std::vector<int64_t>& windows,
    const std::vector<GpuKernelVariant>& variants, const std::function<void(const std::string&)>& say,
    const std::function<std::optional<boost::json::value>(const std::string&)>& recall,
    const std::function<void(const std::string&, const boost::json::value&)>& record);

}  // namespace rattn
