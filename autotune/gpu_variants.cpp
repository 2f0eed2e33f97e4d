// The static set's GPU kernel settings the pass searches, their times
// (measured or predicted) and the knobs a chosen one fixes in the plan.
#include "autotune/gpu_variants.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "autotune/plan_measure.h"
#include "codegen/cuda/gpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace rattn {

bool has_local_layers(const ModelLayout& model) {
  for (const LayerSpec& l : model.layers)
    if (!l.global) return true;
  return false;
}

std::vector<GpuKernelVariant> gpu_kernel_variants(const Program& program) {
  // cuda.splits 0 stands for the runtime's split count for the set's size.
  std::vector<GpuKernelVariant> grid(1);
  std::map<std::string, double> untuned;  // what the runtime runs for the plan as written
  for (const auto& [key, domain] : program.plan.kernel) {
    if (key.rfind("cuda.", 0) != 0) continue;
    if (key == "cuda.splits" && has_local_layers(program.model)) continue;
    std::vector<double> values = domain.candidates();
    untuned[key] = domain.default_value();
    // A split range left open runs with the runtime's count (dsl/ir.cpp).
    if (key == "cuda.splits" && !domain.is_fixed() && !domain.preferred)
      values.insert(values.begin(), 0.0), untuned[key] = 0.0;
    std::vector<GpuKernelVariant> next;
    for (const GpuKernelVariant& v : grid)
      for (double x : values) {
        next.push_back(v);
        next.back().knobs[key] = x;
      }
    grid = std::move(next);
  }
  std::vector<GpuKernelVariant> out(1);
  for (GpuKernelVariant& v : grid)
    if (!v.knobs.empty() && v.knobs != untuned) out.push_back(std::move(v));
  return out;
}

StaticSetWork GpuKernelVariant::work(const ModelLayout& model, int64_t rows) const {
  const auto s = knobs.find("cuda.splits"), w = knobs.find("cuda.warps");
  return static_set_work(model, rows, s != knobs.end() ? int(s->second) : 0,
                         w != knobs.end() ? int(w->second) : StaticSetWork{}.warps);
}

std::string GpuKernelVariant::text() const {
  if (knobs.empty()) return "the runtime's choice";
  std::string out;
  for (const auto& [key, value] : knobs) {
    char buf[64];
    if (key == "cuda.splits" && value == 0)
      std::snprintf(buf, sizeof buf, "%scuda.splits auto", out.empty() ? "" : ", ");
    else
      std::snprintf(buf, sizeof buf, "%s%s %g", out.empty() ? "" : ", ", key.c_str(), value);
    out += buf;
  }
  return out;
}

double TuningRun::gpu_step_us(const ModelLayout& model, int64_t rows, int* variant, bool* measured) const {
  if (!gpu || gpu_variants.empty()) fail(Status::internal, "tune: gpu_step_us without a target GPU and its variants");
  const auto m = gpu_measured_us.find(rows);
  const bool have = m != gpu_measured_us.end();
  double best = std::numeric_limits<double>::infinity();
  int best_v = 0;
  for (size_t v = 0; v < gpu_variants.size(); ++v) {
    const double us = !have                     ? predict_static_set(*gpu, gpu_variants[v].work(model, rows)).total_us()
                      : v < m->second.size() ? m->second[v]
                                              : std::numeric_limits<double>::quiet_NaN();
    if (std::isfinite(us) && us < best) best = us, best_v = int(v);
  }
  if (!std::isfinite(best)) fail(Status::internal, "tune: no GPU kernel variant built for " + std::to_string(rows) + " rows");
  if (variant) *variant = best_v;
  if (measured) *measured = have;
  return best;
}

void fix_gpu_kernel_knobs(const ModelLayout& model, const GpuKernelVariant& v, int64_t rows, RetrievalPlan* plan) {
  for (auto it = plan->kernel.begin(); it != plan->kernel.end(); ++it) {
    const std::string& key = it->first;
    if (key.rfind("cuda.", 0) != 0) continue;
    const auto chosen = v.knobs.find(key);
    const bool rule = key == "cuda.splits" && (chosen == v.knobs.end() || chosen->second == 0);
    if (rule) {
      if (!has_local_layers(model))
        it->second = ParamDomain::fixed_value(static_set_splits(rows, model.num_kv_heads));
    } else {
      it->second = ParamDomain::fixed_value(chosen != v.knobs.end() ? chosen->second : it->second.default_value());
    }
  }
}

std::map<int64_t, std::vector<double>> gpu_variant_times(
    const ModelLayout& model, int64_t sinks, const std::vector<int64_t>& windows,
    const std::vector<GpuKernelVariant>& variants, const std::function<void(const std::string&)>& say,
    const std::function<std::optional<boost::json::value>(const std::string&)>& recall,
    const std::function<void(const std::string&, const boost::json::value&)>& record) {
  auto item = [&](int64_t rows, const GpuKernelVariant& v) {
    return "static set d" + std::to_string(model.head_dim) + " g" + std::to_string(model.group_size()) + " kv" +
           std::to_string(model.num_kv_heads) + " " + dtype_name(model.kv_dtype) + " rows " + std::to_string(rows) +
           "; " + v.text();
  };
  std::vector<std::map<std::string, double>> knobs;
  for (const GpuKernelVariant& v : variants) knobs.push_back(v.knobs);
  std::map<int64_t, std::vector<double>> out;
  for (int64_t w : windows) {
    const int64_t rows = sinks + w;
    std::vector<double> times;
    for (const GpuKernelVariant& v : variants) {
      const auto r = recall(item(rows, v));
      if (!r) break;
      const auto& o = r->as_object();
      times.push_back(o.contains("us") ? o.at("us").to_number<double>() : std::numeric_limits<double>::quiet_NaN());
    }
    if (times.size() != variants.size()) {
      const auto measured = measure_gpu_static_set(model, sinks, {w}, knobs, say);
      if (measured.empty()) return {};
      times = measured.begin()->second;
      for (size_t v = 0; v < times.size(); ++v) {
        boost::json::object rec;
        if (std::isfinite(times[v])) rec["us"] = times[v];
        else rec["not_built"] = true;
        record(item(rows, variants[v]), rec);
      }
    }
    out[rows] = std::move(times);
  }
  return out;
}

}  // namespace rattn
