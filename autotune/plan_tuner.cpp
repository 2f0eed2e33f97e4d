#include "autotune/plan_tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include <unistd.h>

#include "autotune/calib_sets.h"
#include "autotune/gpu_variants.h"
#include "autotune/engine_check.h"
#include "autotune/plan_measure.h"
#include "autotune/search_tuner.h"
#include "autotune/tuning_db.h"
#include "codegen/cuda/gpu_backend.h"
#include "codegen/halide/halide_kernels.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "runtime/data/calib.h"

namespace rattn {

namespace {

// A recipe's screen in units of one sampled layer's full measurement (progress).
constexpr double kScreenUnits = 0.25;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `count` of `from`, evenly spaced, first and last included.
std::vector<int> evenly_spaced(const std::vector<int>& from, int count) {
  if (count >= int(from.size())) return from;
  std::vector<int> out;
  for (int i = 0; i < count; ++i) {
    const size_t at = count == 1 ? from.size() / 2 : size_t(std::lround(double(i) * double(from.size() - 1) / (count - 1)));
    if (out.empty() || out.back() != from[at]) out.push_back(from[at]);
  }
  return out;
}

// The weights of a decoder-only transformer of this shape, about: 12 h^2
// parameters per layer (attention and a 4x MLP) in 2-byte weights. Only a
// default for the GPU memory left to the static sets (--gpu-memory sets it).
double estimate_weights_gib(const ModelLayout& m) {
  const double hidden = double(m.num_q_heads) * m.head_dim;
  return 12.0 * m.num_layers * hidden * hidden * 2.0 / double(1ull << 30);
}

// A search's time: its keys scored times the sample's median time per key
// scored. Wall times of single settings swing with the machine's load; one
// median per sample keeps the settings' order the keys-scored order.
double us_per_key_scored(const LayerSample& s) {
  std::vector<double> ratios;
  for (const SearchPoint& p : s.points)
    if (p.scored_tune > 0 && p.us_per_search > 0) ratios.push_back(p.us_per_search / (p.scored_tune * double(p.index_keys)));
  if (ratios.empty()) return 0;
  std::nth_element(ratios.begin(), ratios.begin() + std::ptrdiff_t(ratios.size() / 2), ratios.end());
  return ratios[ratios.size() / 2];
}

double search_us(const LayerSample& s, const SearchPoint& p) {
  return us_per_key_scored(s) * p.scored_tune * double(p.index_keys);
}

// The settings that meet both constraints on the tuning queries, recall
// less z standard errors. Only the index that `window` gives counts.
std::vector<const SearchPoint*> meeting(const LayerSample& s, int top_k, int64_t window, size_t window_at,
                                        double max_error, double max_error_p95, double min_recall, double z) {
  std::vector<const SearchPoint*> out;
  const auto keys = s.window_keys.find(window);
  if (keys == s.window_keys.end()) return out;
  for (const SearchPoint& p : s.points) {
    if (p.baseline || p.top_k != top_k || p.index_keys != keys->second || p.error_tune.size() <= window_at) continue;
    if (p.recall_tune - z * p.recall_se_tune < min_recall || p.error_tune[window_at] > max_error) continue;
    if (max_error_p95 > 0 && (p.error_p95_tune.size() <= window_at || p.error_p95_tune[window_at] > max_error_p95)) continue;
    out.push_back(&p);
  }
  return out;
}

bool same_variant(const DecodeSearch& a, const DecodeSearch& b) {
  return a.patience == b.patience && a.seeds == b.seeds && a.expand_first == b.expand_first &&
         a.full_expand == b.full_expand;
}

// Of a sample's settings `met`, the one that stands for setting `x` there:
// x's variant at the longest queue no longer than x's (a longer queue walks
// a superset of the shorter one's candidates); null when none.
const SearchPoint* serving(const std::vector<const SearchPoint*>& met, const DecodeSearch& x) {
  const SearchPoint* q = nullptr;
  for (const SearchPoint* p : met)
    if (same_variant(p->search, x) && p->search.queue <= x.queue && (!q || p->search.queue > q->search.queue)) q = p;
  return q;
}

// A search's time on sample s where q stands for setting x: q's, scaled by
// the queue ratio.
double serving_us(const LayerSample& s, const SearchPoint& q, const DecodeSearch& x) {
  return search_us(s, q) * double(x.queue) / double(q.search.queue);
}

// The plan fixes one search per layer, so a layer's setting must serve
// every sample of it (several KV heads or calibration sets): the setting, among those
// met on some sample, whose slowest sample is fastest (with one sample, its
// cheapest); null when none serves them all.
const SearchPoint* layer_setting(const std::vector<std::vector<const SearchPoint*>>& met,
                                 const std::vector<const LayerSample*>& group) {
  const SearchPoint* best = nullptr;
  double best_us = 0;
  for (const std::vector<const SearchPoint*>& own : met)
    for (const SearchPoint* x : own) {
      double worst = 0;
      bool serves = true;
      for (size_t i = 0; i < group.size() && serves; ++i) {
        const SearchPoint* q = serving(met[i], x->search);
        serves = q != nullptr;
        if (serves) worst = std::max(worst, serving_us(*group[i], *q, x->search));
      }
      if (serves && (!best || worst < best_us)) best = x, best_us = worst;
    }
  return best;
}

// The product of the plan's kernel.halide.* domains, the defaults first.
std::vector<KernelSchedule> kernel_schedule_grid(const RetrievalPlan& plan) {
  std::vector<KernelSchedule> out(1), grid(1);
  for (const auto& [key, domain] : plan.kernel) {
    if (key.rfind("halide.", 0) != 0) continue;
    out.front().knobs[key] = domain.default_value();
    std::vector<KernelSchedule> next;
    for (const KernelSchedule& ks : grid)
      for (double v : domain.candidates()) {
        next.push_back(ks);
        next.back().knobs[key] = v;
      }
    grid = std::move(next);
  }
  for (KernelSchedule& ks : grid)
    if (ks.knobs != out.front().knobs) out.push_back(std::move(ks));
  return out;
}

boost::json::value model_check_json(const ModelCheckOutcome& o) {
  boost::json::array texts;
  for (const ModelCheckText& t : o.texts)
    texts.push_back(boost::json::object{{"text", t.text},
                                        {"positions", t.positions},
                                        {"agreeing", t.agreeing},
                                        {"perplexity_ratio", t.perplexity_ratio},
                                        {"kl_mean", t.kl_mean},
                                        {"stopped_early", t.stopped_early}});
  return boost::json::object{{"passed", o.passed},
                             {"agreement_bound", o.agreement_bound},
                             {"confidence", o.confidence},
                             {"kl_mean", o.kl_mean},
                             {"kl_bound", o.kl_bound},
                             {"texts", std::move(texts)}};
}

// nullopt for a record that does not read as one (then checked again).
std::optional<ModelCheckOutcome> model_check_from_json(const boost::json::value& v) try {
  ModelCheckOutcome o;
  const boost::json::object& obj = v.as_object();
  o.passed = obj.at("passed").as_bool();
  o.agreement_bound = obj.at("agreement_bound").to_number<double>();
  o.confidence = obj.at("confidence").to_number<double>();
  o.kl_mean = obj.at("kl_mean").to_number<double>();
  o.kl_bound = obj.at("kl_bound").to_number<double>();
  for (const boost::json::value& e : obj.at("texts").as_array()) {
    const boost::json::object& t = e.as_object();
    ModelCheckText text;
    text.text = std::string(t.at("text").as_string());
    text.positions = t.at("positions").to_number<int64_t>();
    text.agreeing = t.at("agreeing").to_number<int64_t>();
    text.perplexity_ratio = t.at("perplexity_ratio").to_number<double>();
    text.kl_mean = t.at("kl_mean").to_number<double>();
    text.stopped_early = t.at("stopped_early").as_bool();
    o.texts.push_back(text);
  }
  return o;
} catch (const std::exception&) {
  return std::nullopt;
}

}  // namespace

size_t TuningRun::error_slot(int64_t window, int64_t tail_samples) const {
  const size_t wi = size_t(std::find(error_windows.begin(), error_windows.end(), window) - error_windows.begin());
  const size_t ti = size_t(std::find(error_tails.begin(), error_tails.end(), tail_samples) - error_tails.begin());
  if (wi >= error_windows.size() || ti >= error_tails.size()) return std::numeric_limits<size_t>::max();
  return wi * error_tails.size() + ti;
}

const KernelTimes& TuningRun::kernel_times() const {
  const size_t at = chosen >= 0 ? size_t(candidates[size_t(chosen)].kernel_schedule) : 0;
  return kernel_schedules.at(at).times;
}

std::string KernelSchedule::text() const {
  if (knobs.empty()) return "defaults";
  std::string out;
  for (const auto& [key, value] : knobs) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %g", out.empty() ? "" : ", ", key.c_str(), value);
    out += buf;
  }
  return out;
}

static Program with_kv_storage(const Program& program, DType kv_storage) {
  Program p = program;
  p.model.kv_dtype = kv_storage;
  return p;
}

void choose_plan(const Program& given, const PlanTuneOptions& opt, TuningRun* tuning) {
  const Program program = with_kv_storage(given, opt.kv_storage);
  TuningRun& out = *tuning;
  const ModelLayout& model = program.model;
  if (out.samples.empty()) fail(Status::invalid_argument, "tune: nothing measured to choose from");
  out.candidates.clear();
  out.chosen = -1;
  out.gpu = opt.gpu == "none" ? nullptr : &find_gpu_spec(opt.gpu);
  out.target = out.gpu ? out.gpu->name + " (" + out.gpu->arch + ")" : "none";
  if (!out.gpu || (!out.gpu_measured_us.empty() && out.gpu_measured_for != out.gpu->key)) out.gpu_measured_us.clear();
  if (out.gpu_variants.empty()) out.gpu_variants = gpu_kernel_variants(program);
  out.chosen_gpu_variant = 0;
  const int64_t sinks = int64_t(program.plan.sinks.default_value());
  const double z = confidence_z(opt.confidence);
  // The output-error bound of a sampled layer: the option's, else the
  // paper's plan's own error on that layer (no less accurate than it).
  const size_t paper_wi = out.error_slot(kPaperWindow, 0);
  auto error_bound = [&](const LayerSample& s, bool validation) {
    if (opt.max_output_error > 0) return opt.max_output_error;
    for (const SearchPoint& q : s.points)
      if (q.baseline && paper_wi < q.error_tune.size()) return validation ? q.error_valid[paper_wi] : q.error_tune[paper_wi];
    return 0.0;
  };
  out.error_bounds.clear();
  for (const LayerSample& s : out.samples) out.error_bounds[s.layer] = error_bound(s, false);
  std::vector<int> global_layers;
  for (int l = 0; l < model.num_layers; ++l)
    if (model.is_global(l)) global_layers.push_back(l);
  // The GPU's memory for the static sets.
  out.weights_gib = estimate_weights_gib(model);
  if (out.gpu)
    out.gpu_budget_gib = opt.gpu_memory_gib > 0 ? opt.gpu_memory_gib : 0.9 * (out.gpu->memory_gib - out.weights_gib);

  // A token goes into each index once: one per query head, or per KV head
  // with shared_graph.
  const int indexes_per_layer =
      default_concrete_plan(program.plan).shared_graph ? model.num_kv_heads : model.num_q_heads;
  // Every (window, top_k) candidate, each layer at its cheapest setting.
  const double kv_row_bytes = double(model.num_kv_heads) * model.head_dim * 2 * double(dtype_size(model.kv_dtype));
  auto layer_time = [&](double search, int top_k, int64_t rows, int64_t tail, double insert_us, const KernelTimes& kt) {
    LayerTime t;
    const double gathered = kt.gathered_us.at(top_k);
    const double tail_us = tail > 0 ? kt.tail_us.at(tail) : 0.0;
    // A static set holding the whole context leaves nothing to retrieve.
    const bool retrieves = rows < out.context;
    double work = retrieves ? double(model.num_q_heads) * (search + gathered + kt.merge_us) +
                                  double(model.num_kv_heads) * tail_us + double(indexes_per_layer) * insert_us
                            : 0;
    if (out.gpu) {
      t.gpu_us = out.gpu_step_us(model, rows, nullptr, &t.gpu_measured);
    } else {
      work += double(model.num_kv_heads) * kt.dense_us.at(rows);
    }
    // The runtime spreads the heads' work items over its threads.
    t.cpu_us = work / double(std::min(opt.threads, model.num_q_heads));
    return t;
  };
  // The sliding-window layers: their window on the GPU, or on the CPU.
  double local_rows = 0;
  for (const LayerSpec& l : model.layers)
    if (!l.global && l.sliding_window > 0) local_rows += double(l.sliding_window);
  auto local_us = [&](const KernelTimes& kt) {
    double us = 0;
    for (const LayerSpec& l : model.layers) {
      if (l.global || l.sliding_window <= 0) continue;
      if (out.gpu)
        us += predict_static_set(*out.gpu, static_set_work(model, l.sliding_window)).total_us();
      else
        us += double(model.num_kv_heads) * kt.dense_us.at(l.sliding_window) /
              double(std::min(opt.threads, model.num_q_heads));
    }
    return us;
  };
  std::map<int, std::vector<const LayerSample*>> samples_of_layer;
  for (const LayerSample& s : out.samples) samples_of_layer[s.layer].push_back(&s);
  // A global layer's figures: its own sample, else the nearest sampled layer's.
  auto sample_for = [&](int layer) -> const LayerSample& {
    const LayerSample* best = &out.samples.front();
    for (const LayerSample& s : out.samples)
      if (std::abs(s.layer - layer) < std::abs(best->layer - layer)) best = &s;
    return *best;
  };
  auto evaluate = [&](int64_t window, int top_k, int64_t tail, bool baseline, int schedule) {
    const KernelTimes& kt = out.kernel_schedules.at(size_t(schedule)).times;
    PlanCandidate c;
    c.sinks = sinks;
    c.window = window;
    c.top_k = top_k;
    // A static set holding the whole context has nothing to sample.
    c.tail_samples = sinks + window >= out.context ? 0 : tail;
    c.kernel_schedule = schedule;
    c.feasible = true;
    const size_t wi = out.error_slot(window, c.tail_samples);
    // Nothing is retrieved when the static set holds the whole context.
    const double recall_target = sinks + window >= out.context ? 0.0 : opt.min_recall;
    // Each layer's setting, and each sample's own measurement of it.
    std::map<const LayerSample*, std::vector<const SearchPoint*>> met;
    std::map<int, const SearchPoint*> setting;
    if (!baseline)
      for (const auto& [layer, group] : samples_of_layer) {
        std::vector<std::vector<const SearchPoint*>> group_met;
        for (const LayerSample* s : group)
          group_met.push_back(met[s] = meeting(*s, top_k, window, wi, error_bound(*s, false), opt.max_output_error_p95, recall_target, z));
        setting[layer] = layer_setting(group_met, group);
      }
    c.sample_point.assign(out.samples.size(), nullptr);
    for (size_t si = 0; si < out.samples.size(); ++si) {
      const LayerSample& s = out.samples[si];
      const SearchPoint* p = nullptr;  // the layer's setting
      const SearchPoint* own = nullptr;
      if (baseline) {
        for (const SearchPoint& q : s.points)
          if (q.baseline) p = own = &q;
      } else if ((p = setting.at(s.layer))) {
        own = serving(met.at(&s), p->search);
      }
      if (!p) {
        c.feasible = false;
        if (c.why_not.empty())
          c.why_not = "layer " + std::to_string(s.layer) + ": no search setting meets recall@" +
                      std::to_string(opt.recall_depth(top_k)) + " >= " +
                      std::to_string(opt.min_recall).substr(0, 5) +
                      " and output error <= " + std::to_string(error_bound(s, false)).substr(0, 6) +
                      (opt.max_output_error_p95 > 0
                           ? " (95th percentile <= " + std::to_string(opt.max_output_error_p95).substr(0, 6) + ")"
                           : std::string());
        continue;
      }
      c.layer_point[s.layer] = p;
      c.sample_point[si] = own;
      c.output_error += own->error_tune[wi] / double(out.samples.size());
      // Keyed by layer: with several samples per layer, the slowest.
      LayerTime t = layer_time(serving_us(s, *own, p->search), p->top_k, sinks + window, c.tail_samples,
                               s.insert_us, kt);
      // The runtime's own step, where the engine check measured it: one KV
      // head's group on min(threads, group) threads, scaled to the layer.
      if (!out.gpu)
        if (const auto it = out.engine_us.find(engine_step_key(c, s.layer, *p)); it != out.engine_us.end()) {
          c.modelled_cpu_us[s.layer] = t.cpu_us;
          t.cpu_us = it->second * double(model.num_kv_heads) * double(std::min(opt.threads, model.group_size())) /
                     double(std::min(opt.threads, model.num_q_heads));
        }
      auto [it, fresh] = c.layer_time.emplace(s.layer, t);
      if (!fresh && t.step_us() > it->second.step_us()) it->second = t;
    }
    if (c.feasible) {
      double us = local_us(kt);
      for (int l : global_layers) {
        const LayerSample& s = sample_for(l);
        us += c.layer_time.at(s.layer).step_us();
      }
      c.token_ms = us / 1000;
    }
    c.gpu_static_gib = out.gpu ? opt.sequences * (double(global_layers.size()) * double(sinks + window) + local_rows) *
                                     kv_row_bytes / double(1ull << 30)
                               : 0;
    if (out.gpu && c.gpu_static_gib > out.gpu_budget_gib) {
      c.feasible = false;
      c.why_not = "the static sets need " + std::to_string(c.gpu_static_gib) + " GiB of the GPU's " +
                  std::to_string(out.gpu_budget_gib) + " GiB";
    }
    return c;
  };
  // Each candidate at its fastest kernel schedule.
  for (int64_t w : out.windows)
    for (int k : out.top_ks)
      for (int64_t tail : out.tails) {
        // The whole context static: one candidate (the first top_k, no tail),
        // since nothing is retrieved; copies would keep modelled times beside
        // the engine check's measurement of the same plan.
        if ((tail != out.tails.front() || k != out.top_ks.front()) && sinks + w >= out.context) continue;
        // A candidate the engine check measured keeps the kernel schedule it
        // was measured with: the others' modelled times would undercut it.
        if (const auto e = out.engine_schedule.find({w, k, tail}); e != out.engine_schedule.end() && !out.gpu) {
          out.candidates.push_back(evaluate(w, k, tail, false, e->second));
          continue;
        }
        PlanCandidate best = evaluate(w, k, tail, false, 0);
        for (size_t ki = 1; ki < out.kernel_schedules.size(); ++ki) {
          PlanCandidate c = evaluate(w, k, tail, false, int(ki));
          if (c.feasible && c.token_ms < best.token_ms) best = std::move(c);
        }
        out.candidates.push_back(std::move(best));
      }
  // Per-layer candidates. A layer's step time and its constraints are its
  // own, so per window and kernel schedule each sampled layer can take the
  // fastest (top_k, tail_samples) that meets them there (at a tie, the
  // most accurate): layers whose
  // attention spreads differently need not pay for the neediest one. Built
  // from the candidates above as they stand (a measured candidate at its
  // measured schedule), so an engine-checked layer keeps its measured time.
  const size_t uniform = out.candidates.size();
  std::set<std::pair<int64_t, int>> window_schedules;
  for (size_t i = 0; i < uniform; ++i)
    window_schedules.insert({out.candidates[i].window, out.candidates[i].kernel_schedule});
  for (const auto& [w, schedule] : window_schedules) {
    if (sinks + w >= out.context) continue;  // nothing retrieved: one candidate already
    PlanCandidate c;
    c.sinks = sinks;
    c.window = w;
    c.kernel_schedule = schedule;
    c.feasible = true;
    c.sample_point.assign(out.samples.size(), nullptr);
    std::map<int, const PlanCandidate*> pick;  // sampled layer -> the candidate it takes its setting from
    for (const auto& [layer, group] : samples_of_layer) {
      // The layer's mean error under candidate u, over its samples.
      auto layer_error = [&, layer = layer](const PlanCandidate& u) {
        double sum = 0;
        int n = 0;
        for (size_t si = 0; si < out.samples.size(); ++si)
          if (out.samples[si].layer == layer && u.sample_point[si])
            sum += u.sample_point[si]->error_tune[out.error_slot(w, u.tail_samples)], ++n;
        return n > 0 ? sum / n : 0.0;
      };
      // As for whole plans: of the settings within kTimeTolerance of the
      // layer's fastest, the most accurate.
      std::vector<const PlanCandidate*> serving_layer;
      double fastest_us = std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < uniform; ++i) {
        const PlanCandidate& u = out.candidates[i];
        if (u.window != w || u.kernel_schedule != schedule || !u.layer_time.count(layer)) continue;
        serving_layer.push_back(&u);
        fastest_us = std::min(fastest_us, u.layer_time.at(layer).step_us());
      }
      const PlanCandidate* best = nullptr;
      for (const PlanCandidate* u : serving_layer)
        if (u->layer_time.at(layer).step_us() <= fastest_us * (1 + kTimeTolerance) &&
            (!best || layer_error(*u) < layer_error(*best)))
          best = u;
      if (!best) {
        c.feasible = false;
        c.why_not = "layer " + std::to_string(layer) + ": no top_k and tail_samples meet its constraints";
        break;
      }
      pick[layer] = best;
    }
    if (!c.feasible) continue;
    // Plan-wide: the setting most global layers take (a layer not sampled
    // takes its nearest sampled layer's); the others get their own.
    std::map<std::pair<int, int64_t>, int> uses;
    for (int l : global_layers) {
      const PlanCandidate* u = pick.at(sample_for(l).layer);
      ++uses[{u->top_k, u->tail_samples}];
    }
    const auto common = std::max_element(uses.begin(), uses.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    if (common->second == int(global_layers.size())) continue;  // one setting for all: a candidate above
    c.top_k = common->first.first;
    c.tail_samples = common->first.second;
    for (const auto& [layer, u] : pick) {
      if (u->top_k != c.top_k || u->tail_samples != c.tail_samples) c.layer_retrieval[layer] = {u->top_k, u->tail_samples};
      c.layer_point[layer] = u->layer_point.at(layer);
      c.layer_time[layer] = u->layer_time.at(layer);
      if (const auto m = u->modelled_cpu_us.find(layer); m != u->modelled_cpu_us.end()) c.modelled_cpu_us[layer] = m->second;
      c.gpu_static_gib = u->gpu_static_gib;
      if (!u->feasible && u->why_not.rfind("the static sets need", 0) == 0) {
        c.feasible = false;
        c.why_not = u->why_not;
      }
    }
    for (size_t si = 0; si < out.samples.size(); ++si) {
      const LayerSample& s = out.samples[si];
      const PlanCandidate* u = pick.at(s.layer);
      c.sample_point[si] = u->sample_point[si];
      c.output_error += u->sample_point[si]->error_tune[out.error_slot(w, u->tail_samples)] / double(out.samples.size());
    }
    double us = local_us(out.kernel_schedules.at(size_t(schedule)).times);
    for (int l : global_layers) us += c.layer_time.at(sample_for(l).layer).step_us();
    c.token_ms = us / 1000;
    out.candidates.push_back(std::move(c));
  }
  // Candidates the model check failed (tune_plan) are out.
  if (!out.model_checks.empty())
    for (PlanCandidate& c : out.candidates) {
      if (!c.feasible) continue;
      const auto it = out.model_checks.find(model_check_key(given, out, c));
      if (it != out.model_checks.end() && !it->second.passed) {
        c.feasible = false;
        c.why_not = "the model check: " + it->second.summary();
      }
    }
  // The most accurate of the candidates within kTimeTolerance of the
  // fastest: a larger window the GPU serves behind the CPU's work costs
  // nothing and lowers the error.
  double fastest = std::numeric_limits<double>::infinity();
  for (const PlanCandidate& c : out.candidates)
    if (c.feasible) fastest = std::min(fastest, c.token_ms);
  for (size_t i = 0; i < out.candidates.size(); ++i) {
    const PlanCandidate& c = out.candidates[i];
    if (!c.feasible || c.token_ms > fastest * (1 + kTimeTolerance)) continue;
    if (out.chosen < 0 || c.output_error < out.candidates[size_t(out.chosen)].output_error) out.chosen = int(i);
  }
  // The baseline keeps the plan's default kernels (schedule 0).
  out.baseline = evaluate(kPaperWindow, kPaperTopK, 0, true, 0);
  out.baseline_met = out.baseline.feasible;
  for (const LayerSample& s : out.samples)
    for (const SearchPoint& q : s.points)
      if (q.baseline && q.recall_valid < opt.min_recall) out.baseline_met = false;
  out.baseline_within_error = true;
  for (const LayerSample& s : out.samples)
    for (const SearchPoint& q : s.points)
      if (q.baseline && paper_wi < q.error_valid.size() && q.error_valid[paper_wi] > error_bound(s, true))
        out.baseline_within_error = false;

  if (out.chosen >= 0) {
    const PlanCandidate& c = out.candidates[size_t(out.chosen)];
    if (out.gpu) out.gpu_step_us(model, c.sinks + c.window, &out.chosen_gpu_variant);
    out.validation_recall_min = 1;
    out.validation_error_max = 0;
    out.validation_met = true;
    for (size_t si = 0; si < out.samples.size(); ++si) {
      const LayerSample& s = out.samples[si];
      const SearchPoint* p = c.sample_point[si];
      const size_t wi = out.error_slot(c.window, c.tail_at(s.layer));
      out.validation_recall_min = std::min(out.validation_recall_min, p->recall_valid);
      out.validation_error_max = std::max(out.validation_error_max, p->error_valid[wi]);
      const bool retrieves = c.sinks + c.window < out.context;
      if ((retrieves && p->recall_valid < opt.min_recall) || p->error_valid[wi] > error_bound(s, true))
        out.validation_met = false;
      if (opt.max_output_error_p95 > 0 && wi < p->error_p95_valid.size() && p->error_p95_valid[wi] > opt.max_output_error_p95)
        out.validation_met = false;
    }
  }
}

TuningRun tune_plan(const Program& given, const PlanTuneOptions& opt) {
  const auto t_start = std::chrono::steady_clock::now();
  // Measured as the runtime will store K/V; tuned.ra keeps the model's kv_dtype
  // (apply_plan_choice takes the caller's program).
  const Program program = with_kv_storage(given, opt.kv_storage);
  const ModelLayout& model = program.model;
  auto say = [&](const std::string& s) {
    if (opt.log) opt.log(s);
  };
  if (opt.threads < 1) fail(Status::invalid_argument, "tune: threads must be >= 1");
  if (!(opt.max_output_error >= 0)) fail(Status::invalid_argument, "tune: max_output_error must be >= 0");
  if (!(opt.max_output_error_p95 >= 0)) fail(Status::invalid_argument, "tune: max_output_error_p95 must be >= 0");
  if (opt.sample_layers < 1 || opt.sample_kv_heads < 1 || opt.sequences < 1)
    fail(Status::invalid_argument, "tune: sample_layers, sample_kv_heads and sequences must be >= 1");
  if (opt.build_finalists < 1) fail(Status::invalid_argument, "tune: build_finalists must be >= 1");
  if (!(opt.max_index_memory >= 0)) fail(Status::invalid_argument, "tune: max_index_memory must be >= 0");
  if (opt.max_index_memory > 0 && !opt.search_build)
    fail(Status::invalid_argument, "tune: a maximum index memory needs the build-recipe search (--build)");
  TuningRun out;
  out.fingerprint = host_fingerprint();
  if (opt.gpu != "none") out.gpu = &find_gpu_spec(opt.gpu);
  out.target = out.gpu ? out.gpu->name + " (" + out.gpu->arch + ")" : "none";

  // What the pass searches.
  const RetrievalPlan& plan = program.plan;
  const int64_t sinks = int64_t(plan.sinks.default_value());
  for (double w : plan.window.candidates()) out.windows.push_back(int64_t(w));
  for (double k : plan.top_k.candidates()) out.top_ks.push_back(int(k));

  // The data.
  MeasureInputs in;
  in.program = &program;
  in.threads = opt.threads;
  in.min_recall = opt.min_recall;
  in.recall_k = opt.recall_k;
  in.confidence = opt.confidence;
  in.test_queries = opt.test_queries;
  in.q_heads = opt.sample_q_heads;
  in.holdout = opt.holdout;
  in.holdout_block = opt.holdout_block;
  in.sinks = sinks;
  in.windows = out.windows;
  if (std::find(in.windows.begin(), in.windows.end(), kPaperWindow) == in.windows.end())
    in.windows.push_back(kPaperWindow);  // the baseline's
  in.top_ks = out.top_ks;
  out.error_windows = in.windows;
  for (double t : plan.tail_samples.candidates()) out.tails.push_back(int64_t(t));
  out.error_tails = {0};  // the baseline's
  for (int64_t t : out.tails)
    if (t > 0) out.error_tails.push_back(t);
  in.tails = out.error_tails;
  std::vector<int> global_layers;
  std::string data_id;
  // The calibration sets (one "set" of no name for the synthetic generator).
  std::vector<CalibSet> sets(1);
  if (opt.synthetic) {
    in.synthetic = true;
    in.distribution = opt.distribution;
    in.seed = opt.seed;
    const int64_t model_ctx = model.max_context > 0 ? model.max_context : 131072;
    in.context = opt.context > 0 ? opt.context : std::min<int64_t>(model_ctx, 131072);
    for (int l = 0; l < model.num_layers; ++l)
      if (model.is_global(l)) global_layers.push_back(l);
    data_id = "synthetic seed " + std::to_string(opt.seed) +
              (opt.distribution == "topics" ? std::string(" generator 1") : " generator " + opt.distribution);
  } else {
    sets = read_calib_sets(model, opt.calib_dirs, opt.context, &in.context);
    global_layers = common_global_layers(model, sets);
    for (int l : sets.front().manifest.layers)
      if (model.is_global(l) && std::find(global_layers.begin(), global_layers.end(), l) == global_layers.end())
        say("layer " + std::to_string(l) + " is not in every calibration set: it is not sampled");
  }
  if (global_layers.empty())
    fail(Status::invalid_argument, "tune: the data holds no global layer of the model" +
                                       std::string(sets.size() > 1 ? " that every calibration set holds" : ""));
  const int64_t min_window = *std::min_element(in.windows.begin(), in.windows.end());
  if (in.context <= sinks + min_window + opt.test_queries + 1000)
    fail(Status::invalid_argument, "tune: a context of " + std::to_string(in.context) +
                                       " tokens is too short for the plan's static set and " +
                                       std::to_string(opt.test_queries) + " test queries");
  out.context = in.context;
  const std::vector<int> layers = evenly_spaced(global_layers, opt.sample_layers);
  std::vector<int> kv_all(static_cast<size_t>(model.num_kv_heads));
  std::iota(kv_all.begin(), kv_all.end(), 0);
  const std::vector<int> kv_heads = opt.synthetic ? std::vector<int>{0} : evenly_spaced(kv_all, opt.sample_kv_heads);

  // A set's inputs; with several sets a record's item names its set.
  auto set_inputs = [&](const MeasureInputs& base, size_t set) {
    MeasureInputs pin = base;
    if (!opt.synthetic) pin.calib_dir = sets[set].dir, pin.manifest = sets[set].manifest;
    if (sets.size() > 1) pin.set_name = sets[set].name;
    return pin;
  };

  // The database scope of a set's measurements: everything that changes
  // what they give, the set's own identity among it, so that a run on
  // several sets reuses what a run on any one of them measured.
  auto scope_of = [&](const std::string& data) {
    const std::string text = format_program(program) + "\n" + data + "\ncontext " + std::to_string(in.context) +
                             " queries " + std::to_string(opt.test_queries) + " holdout " +
                             std::to_string(opt.holdout) + "/" + std::to_string(opt.holdout_block) + " min_recall " +
                             std::to_string(opt.min_recall) + " confidence " + std::to_string(opt.confidence) +
                             " q_heads " + std::to_string(opt.sample_q_heads) + " measure 7" +
                             (opt.recall_k > 0 ? " recall_k " + std::to_string(opt.recall_k) : std::string());
    return hex64(fnv1a64(text.data(), text.size()));
  };
  std::vector<std::string> set_scope;
  for (const CalibSet& c : sets) set_scope.push_back(scope_of(opt.synthetic ? data_id : "calib " + c.id));
  TuningDb db(opt.db_path);
  if (db.skipped_lines() > 0)
    say("the tuning database " + opt.db_path + " has " + std::to_string(db.skipped_lines()) +
        " unreadable lines (a killed run's last write?); they are ignored");
  const std::string fp = out.fingerprint.hash(), fp_text = out.fingerprint.text();
  // The kernels' times depend on the machine and the kernel set only.
  const std::string kernel_scope = "cpu kernels";
  auto reuse = [&](const std::string& item_scope, const std::string& item) -> std::optional<boost::json::value> {
    std::string foreign;
    auto v = db.find(item_scope, item, fp, &foreign);
    if (v) {
      ++out.db_reused;
    } else if (!foreign.empty()) {
      ++out.db_foreign;
      say("the database holds " + item + " measured on another machine (" + foreign +
          "); this machine is " + fp_text + ": measured again, not reused");
    }
    return v;
  };

  // With --build: every recipe of the plan's build domains, its program and
  // its index memory; the samples it is screened on and the global layers
  // each stands for.
  std::vector<Program> recipe_programs;
  std::vector<std::tuple<int, int, size_t>> screen_samples;  // (layer, KV head, set)
  std::vector<double> sample_weight;
  double build_units = 0;
  if (opt.search_build) {
    for (const BuildRecipe& r : recipe_grid(plan)) {
      recipe_programs.push_back(with_recipe(program, r));
      RecipeResult rr;
      rr.recipe = r;
      rr.memory_ratio = index_memory_ratio(program, r, in.context);
      out.recipes.push_back(std::move(rr));
    }
    for (int layer : layers) {
      double nearest = 0;
      for (int g : global_layers) {
        int best = layers.front();
        for (int l : layers)
          if (std::abs(l - g) < std::abs(best - g)) best = l;
        nearest += best == layer ? 1 : 0;
      }
      for (int kv : kv_heads)
        for (size_t set = 0; set < sets.size(); ++set) {
          screen_samples.emplace_back(layer, kv, set);
          sample_weight.push_back(nearest / double(kv_heads.size() * sets.size()));
        }
    }
    // Progress: a screen counts a quarter of a full sample's measurement.
    size_t alive = 0;
    for (const RecipeResult& r : out.recipes)
      alive += opt.max_index_memory <= 0 || r.memory_ratio <= opt.max_index_memory ? 1 : 0;
    const size_t finals = size_t(std::max(opt.build_finalists, 1));
    const size_t kept = std::min(alive, std::max(finals, (alive + 1) / 2));
    build_units = alive <= finals ? double(alive * screen_samples.size())
                                  : kScreenUnits * double(alive + kept * (screen_samples.size() - 1)) +
                                        double(std::min(finals, kept) * screen_samples.size());
  }

  // Progress in units of one sampled layer (the kernels count a tenth).
  // The engine check: a prefill per sampled layer (its steps count little).
  const double engine_units = opt.engine_check > 0 && !out.gpu ? double(layers.size()) : 0;
  // The model check: a few texts through the whole model, as long as a few sampled layers.
  const double model_units = opt.model_check > 0 && opt.check_model ? 2.0 * double(layers.size()) : 0;
  const double total_units = (opt.search_build ? build_units : double(layers.size() * kv_heads.size() * sets.size())) +
                             0.1 + (out.gpu ? 0.05 : 0) + engine_units + model_units;
  double done_units = 0;
  auto progress = [&](double units, const std::string& now) {
    done_units += units;
    if (opt.progress) opt.progress(done_units, total_units, now);
  };
  progress(0, "CPU kernel times");

  // CPU kernel times.
  {
    std::vector<int64_t> gathered, dense, tails;
    for (int64_t t : out.error_tails)
      if (t > 0) tails.push_back(t);
    for (int k : in.top_ks) gathered.push_back(k);
    gathered.push_back(kPaperTopK);
    for (int64_t w : in.windows) dense.push_back(sinks + w);
    for (const LayerSpec& l : model.layers)
      if (!l.global && l.sliding_window > 0) dense.push_back(l.sliding_window);
    out.kernel_schedules = kernel_schedule_grid(program.plan);
    for (KernelSchedule& ks : out.kernel_schedules) {
      const std::string item = "kernels d" + std::to_string(model.head_dim) + " g" + std::to_string(model.group_size()) +
                               " " + dtype_name(model.kv_dtype) + "; " + halide_fingerprint() +
                               (ks.knobs.empty() ? std::string() : "; " + ks.text());
      bool have = false;
      if (auto v = reuse(kernel_scope, item)) {
        ks.times = kernel_times_from_json(*v);
        have = std::all_of(gathered.begin(), gathered.end(), [&](int64_t n) { return ks.times.gathered_us.count(n); }) &&
               std::all_of(dense.begin(), dense.end(), [&](int64_t n) { return ks.times.dense_us.count(n); }) &&
               std::all_of(tails.begin(), tails.end(), [&](int64_t n) { return ks.times.tail_us.count(n); });
      }
      if (!have) {
        say("timing the CPU kernels (" + ks.text() + ")");
        ks.times = measure_kernel_times(model, gathered, dense, tails, ks.knobs);
        db.put(kernel_scope, item, fp, fp_text, kernel_times_to_json(ks.times));
        ++out.db_measured;
      }
      progress(0.1 / double(out.kernel_schedules.size()), "CPU kernel times");
    }
  }

  // Every sampled layer and KV head on every set, measured under `p` (a
  // recipe's program: the item names the recipe unless it is the plan's
  // default). --minutes skips a layer and KV head on every set or on none.
  auto measure_samples = [&](const Program& p, const std::string& recipe_item) {
    std::vector<LayerSample> samples;
    for (int layer : layers)
      for (int kv : kv_heads) {
        const bool skip = opt.minutes > 0 && !samples.empty() && seconds_since(t_start) > 60 * opt.minutes;
        for (size_t set = 0; set < sets.size(); ++set) {
          const std::string item =
              "layer " + std::to_string(layer) + " kv " + std::to_string(kv) + recipe_item;
          const std::string what = item + (sets[set].name.empty() ? std::string() : " (" + sets[set].name + ")");
          if (auto v = reuse(set_scope[set], item)) {
            samples.push_back(layer_sample_from_json(*v));
            samples.back().calib = sets[set].name;
            progress(1, what + " (from the database)");
            continue;
          }
          if (skip) {
            say("--minutes reached: " + what + " is not measured; it takes the nearest measured layer's figures");
            progress(1, what + " skipped");
            continue;
          }
          MeasureInputs pin = set_inputs(in, set);
          pin.program = &p;
          samples.push_back(measure_layer_sample(pin, layer, kv, progress));
          samples.back().calib = sets[set].name;
          db.put(set_scope[set], item, fp, fp_text, layer_sample_to_json(samples.back()));
          ++out.db_measured;
        }
      }
    return samples;
  };

  // The target GPU present: its static-set time measured for each window.
  auto measure_gpu = [&] {
    if (out.gpu && opt.measure_gpu && out.fingerprint.gpu != "none") {
      const GpuSpec* present = gpu_spec_for_device(out.fingerprint.gpu);
      if (present == out.gpu) {
        if (out.gpu_variants.empty()) out.gpu_variants = gpu_kernel_variants(program);
        const std::string gpu_scope = "gpu static set 1";
        out.gpu_measured_us = gpu_variant_times(
            model, sinks, out.windows, out.gpu_variants, say,
            [&](const std::string& item) { return reuse(gpu_scope, item); },
            [&](const std::string& item, const boost::json::value& v) {
              db.put(gpu_scope, item, fp, fp_text, v);
              ++out.db_measured;
            });
        out.gpu_measured_for = out.gpu->key;
      } else {
        say("the GPU present (" + out.fingerprint.gpu + ") is not the target " + out.target +
            ": the static set's time is predicted");
      }
    }
    if (out.gpu) progress(0.05, "GPU static set");
  };

  if (!opt.search_build) {
    out.samples = measure_samples(program, "");
    measure_gpu();
    choose_plan(program, opt, &out);
  } else {
    measure_gpu();  // the finalists' choices need it
    // Screens: the default top_k on the smallest window's index (the
    // largest), priced by the cost model at the default window.
    const int top_k = int(plan.top_k.default_value());
    const int64_t window = int64_t(plan.window.default_value());
    int kmax = kPaperTopK;
    for (int k : in.top_ks) kmax = std::max(kmax, k);
    const int64_t index_keys = index_keys_per_window(in.context - opt.test_queries, in.windows, kmax)
                                   .at(*std::min_element(out.windows.begin(), out.windows.end()));
    const KernelTimes& kt = out.kernel_schedules.front().times;
    auto screen_cost = [&](const RecipeScreen& sc, const BuildRecipe& r, double us_per_key) {
      if (!sc.met) return std::numeric_limits<double>::infinity();
      const int indexes = r.shared_graph ? model.num_kv_heads : model.num_q_heads;
      double work = double(model.num_q_heads) *
                        (us_per_key * sc.scored * double(sc.index_keys) + kt.gathered_us.at(top_k) + kt.merge_us) +
                    double(indexes) * sc.insert_us;
      if (!out.gpu) work += double(model.num_kv_heads) * kt.dense_us.at(sinks + window);
      return work / double(std::min(opt.threads, model.num_q_heads));
    };
    std::optional<GroupData> data;  // the sample being screened, loaded once for every recipe
    std::tuple<int, int, size_t> data_of{-1, -1, 0};
    std::vector<std::vector<LayerSample>> full(out.recipes.size());
    RecipeSearchHooks hooks;
    hooks.screen = [&](size_t r, size_t si) {
      const auto [layer, kv, set] = screen_samples[si];
      const BuildRecipe& recipe = out.recipes[r].recipe;
      const std::string item = "screen layer " + std::to_string(layer) + " kv " + std::to_string(kv) + " top_k " +
                               std::to_string(top_k) + " keys " + std::to_string(index_keys) + "; " + recipe.text();
      RecipeScreen sc;
      if (auto v = reuse(set_scope[set], item)) {
        sc = recipe_screen_from_json(*v);
      } else {
        if (!data || data_of != screen_samples[si]) {
          data.reset();
          data = load_group(set_inputs(in, set), layer, kv);
          data_of = screen_samples[si];
        }
        MeasureInputs pin = set_inputs(in, set);
        pin.program = &recipe_programs[r];
        progress(0, "screening " + recipe.text() + " on layer " + std::to_string(layer));
        sc = measure_recipe_screen(pin, *data, layer, kv, top_k, index_keys);
        db.put(set_scope[set], item, fp, fp_text, recipe_screen_to_json(sc));
        ++out.db_measured;
      }
      sc.calib = sets[set].name;
      progress(kScreenUnits, "screened " + recipe.text() + " on layer " + std::to_string(layer));
      return sc;
    };
    // A search's time: keys scored times the median time per key scored
    // over the recipes that walk the same rows (the keys, or codes of one
    // kind) on this sample. Single wall times swing with a shared machine's
    // load; one figure per walk keeps those recipes' order their keys-scored
    // and insertion order.
    hooks.price = [&](std::vector<RecipeResult>& rs, const std::vector<size_t>& ids, size_t si) {
      std::map<std::pair<bool, int>, std::vector<double>> per_key;
      auto walk = [&](size_t i) { return std::make_pair(rs[i].recipe.traversal_codes, rs[i].recipe.code_dims); };
      for (size_t i : ids)
        if (rs[i].screens[si].us_per_key > 0) per_key[walk(i)].push_back(rs[i].screens[si].us_per_key);
      for (auto& [kind, v] : per_key) std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
      for (size_t i : ids) {
        const auto it = per_key.find(walk(i));
        RecipeScreen& sc = rs[i].screens[si];
        sc.cpu_us = screen_cost(sc, rs[i].recipe, it == per_key.end() ? 0.0 : it->second[it->second.size() / 2]);
      }
    };
    const BuildRecipe plain = default_recipe(plan);
    hooks.full = [&](size_t r, RecipeResult& rr) {
      data.reset();
      full[r] = measure_samples(recipe_programs[r], rr.recipe == plain ? std::string() : "; " + rr.recipe.text());
      TuningRun trial = out;
      trial.samples = full[r];
      choose_plan(recipe_programs[r], opt, &trial);
      rr.feasible = trial.chosen >= 0;
      rr.token_ms = rr.feasible ? trial.candidates[size_t(trial.chosen)].token_ms : 0;
      for (const LayerSample& ls : full[r]) rr.build_s += ls.build_s;
    };
    out.chosen_recipe = search_recipes(out.recipes, sample_weight, opt.build_finalists, opt.max_index_memory, hooks);
    if (out.chosen_recipe < 0)  // no feasible plan: the best-ranked finalist's measurements
      for (size_t i = 0; i < out.recipes.size(); ++i)
        if (out.recipes[i].round == 3 &&
            (out.chosen_recipe < 0 || out.recipes[i].score_us < out.recipes[size_t(out.chosen_recipe)].score_us))
          out.chosen_recipe = int(i);
    out.samples = std::move(full[size_t(out.chosen_recipe)]);
    choose_plan(recipe_programs[size_t(out.chosen_recipe)], opt, &out);
  }
  out.model_chosen = out.chosen;
  if (opt.engine_check > 0 && out.gpu)
    say("--engine-check times the CPU's decode step: not for a GPU target (" + out.target + "); skipped");
  const bool engine_on = opt.engine_check > 0 && !out.gpu && out.chosen >= 0;
  const bool model_on = opt.model_check > 0 && opt.check_model && out.chosen >= 0;
  if (engine_on || model_on) {
    // The runtime's decode step for the candidates the model ranks fastest,
    // then for each new choice until the chosen one is measured.
    const Program base = measured_program(program, out);
    // A step's record: the candidate and search (the key), the build recipe
    // and the threads it ran on.
    const std::string recipe_item =
        (out.chosen_recipe >= 0 ? "; " + out.recipes[size_t(out.chosen_recipe)].recipe.text() : std::string()) +
        "; threads " + std::to_string(opt.threads);
    double engine_done = 0;  // progress units of the prefills done
    std::map<std::pair<int, int>, GroupData> group_data;   // (layer, kv) of the first set
    std::map<std::tuple<int, int, int64_t>, std::string> states;  // (layer, kv, window) -> prefilled state file
    namespace fs = std::filesystem;
    const std::string state_dir =
        (fs::temp_directory_path() / ("rattn_engine_check." + std::to_string(::getpid()) + "." +
                                      std::to_string(std::random_device{}())))
            .string();
    if (engine_on) fs::create_directories(state_dir);
    auto remove_tree = [](const std::string& dir) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    };
    auto measured = [&](const PlanCandidate& c) {
      for (const auto& [layer, p] : c.layer_point)
        if (!out.engine_us.count(engine_step_key(c, layer, *p))) return false;
      return true;
    };
    // Times a batch of candidates: per sampled layer, every candidate's step
    // not in the database yet, interleaved step by step (time_engine_steps),
    // so that the machine's drift over the batch weighs on each alike. The
    // paper's plan (`baseline`, not a candidate) may ride along: the ratio
    // against it then compares measured steps with measured steps.
    auto measure = [&](const std::vector<const PlanCandidate*>& batch, const PlanCandidate* baseline = nullptr) {
      std::vector<Program> programs;
      programs.reserve(batch.size());
      for (const PlanCandidate* c : batch) programs.push_back(apply_candidate(base, out, *c));
      struct Pending {
        size_t candidate;  // index into batch
        std::string key;
      };
      std::map<int, std::vector<Pending>> by_layer;
      for (size_t b = 0; b < batch.size(); ++b)
        for (const auto& [layer, p] : batch[b]->layer_point) {
          const std::string key = engine_step_key(*batch[b], layer, *p);
          if (out.engine_us.count(key)) continue;
          if (auto v = reuse(set_scope[0], key + recipe_item)) {
            out.engine_us[key] = v->as_double();
            continue;
          }
          std::vector<Pending>& pending = by_layer[layer];  // the baseline may be a candidate's twin
          if (std::none_of(pending.begin(), pending.end(), [&](const Pending& e) { return e.key == key; }))
            pending.push_back({b, key});
        }
      for (const auto& [layer, pending] : by_layer) {
        // The layer's first sample: the first set's.
        const int kv = std::find_if(out.samples.begin(), out.samples.end(),
                                    [&](const LayerSample& ls) { return ls.layer == layer; })->kv_head;
        auto data = group_data.find({layer, kv});
        if (data == group_data.end()) data = group_data.emplace(std::make_pair(layer, kv), load_group(set_inputs(in, 0), layer, kv)).first;
        std::vector<EngineStepSetup> setups;
        std::vector<std::string> state_paths;
        for (const Pending& e : pending) {
          const PlanCandidate& c = *batch[e.candidate];
          EngineStepSetup setup;
          setup.program = &programs[e.candidate];
          setup.layer = layer;
          setup.prefix = data->second.tokens - opt.test_queries;
          setup.threads = opt.threads;
          std::string& state = states[{layer, kv, c.window}];
          if (state.empty()) {
            state = state_dir + "/layer" + std::to_string(layer) + "-kv" + std::to_string(kv) + "-w" +
                    std::to_string(c.window) + ".rattnseq";
            progress(0, "engine check: prefilling layer " + std::to_string(layer) + " (window " +
                            std::to_string(c.window) + ") through the runtime");
            prefill_engine_state(setup, data->second, state);
            progress(engine_units > 0 ? std::min(1.0, engine_units - engine_done) : 0, "engine check: layer " +
                                                                                    std::to_string(layer) + " prefilled");
            engine_done += 1;
          }
          setups.push_back(setup);
          state_paths.push_back(state);
        }
        progress(0, "engine check: timing layer " + std::to_string(layer) + ", " + std::to_string(setups.size()) +
                        " candidate" + (setups.size() == 1 ? "" : "s") + " interleaved");
        const std::vector<double> us = time_engine_steps(setups, data->second, state_paths);
        for (size_t i = 0; i < pending.size(); ++i) {
          out.engine_us[pending[i].key] = us[i];
          db.put(set_scope[0], pending[i].key + recipe_item, fp, fp_text, boost::json::value(us[i]));
          ++out.db_measured;
        }
      }
      for (const PlanCandidate* c : batch) {
        if (c == baseline) continue;
        if (!c->per_layer()) out.engine_schedule[{c->window, c->top_k, c->tail_samples}] = c->kernel_schedule;
        ++out.engine_checked;
      }
    };
    // Until the chosen candidate's step is measured (at most engine_check more).
    auto settle_engine = [&]() {
      if (!engine_on) return;
      for (int extra = 0; extra < opt.engine_check && out.chosen >= 0 && !measured(out.candidates[size_t(out.chosen)]);
           ++extra) {
        measure({&out.candidates[size_t(out.chosen)]});
        choose_plan(base, opt, &out);
      }
    };
    try {
      if (engine_on) {
        std::vector<size_t> order;
        for (size_t i = 0; i < out.candidates.size(); ++i)
          if (out.candidates[i].feasible) order.push_back(i);
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return out.candidates[a].token_ms < out.candidates[b].token_ms; });
        order.resize(std::min(order.size(), size_t(opt.engine_check)));
        std::vector<const PlanCandidate*> first;
        for (size_t i : order) first.push_back(&out.candidates[i]);
        if (out.baseline.feasible) first.push_back(&out.baseline);
        measure(first, &out.baseline);
        choose_plan(base, opt, &out);
        settle_engine();
      }
      if (model_on) {
        // The model in the loop: the choice's whole plan through the real
        // model; a failure excludes it (choose_plan) and the next choice is
        // checked, up to model_check candidates.
        const std::string check_scope = "model check; " + opt.model_check_scope;
        for (int checked = 0; checked < opt.model_check && out.chosen >= 0; ++checked) {
          const PlanCandidate& c = out.candidates[size_t(out.chosen)];
          const std::string key = model_check_key(base, out, c);
          if (out.model_checks.count(key)) break;  // checked and passed: a failed one is not chosen
          TuningRun::ModelCheckEntry entry{c.label(), c.token_ms, key, false};
          const double check_units = model_units / double(opt.model_check);
          double check_done = 0;  // this check's fraction reported
          ModelCheckOutcome outcome;
          std::optional<ModelCheckOutcome> recorded;
          if (auto v = reuse(check_scope, key)) recorded = model_check_from_json(*v);
          if (recorded) {
            outcome = *recorded;
            entry.reused = true;
          } else {
            char ms[32];
            std::snprintf(ms, sizeof ms, "%.2f", c.token_ms);
            say("model check " + std::to_string(checked + 1) + ": " + entry.label + " (" + ms + " ms per token)");
            outcome = opt.check_model(key, out.context, [&](double fraction, const std::string& now) {
              const double to = std::clamp(fraction, check_done, 1.0);
              progress((to - check_done) * check_units, "model check " + std::to_string(checked + 1) + ": " + now);
              check_done = to;
            });
            db.put(check_scope, key, fp, fp_text, model_check_json(outcome));
            ++out.db_measured;
          }
          progress((1 - check_done) * check_units, "model check: " + entry.label + (outcome.passed ? ": passed" : ": failed"));
          say("model check of " + entry.label + ": " + (outcome.passed ? "passed" : "failed") + " (" + outcome.summary() + ")");
          out.model_checks[key] = outcome;
          out.model_check_log.push_back(entry);
          if (outcome.passed) break;
          choose_plan(base, opt, &out);
          settle_engine();
        }
        out.model_check_met =
            out.chosen >= 0 && [&] {
              const auto it = out.model_checks.find(model_check_key(base, out, out.candidates[size_t(out.chosen)]));
              return it != out.model_checks.end() && it->second.passed;
            }();
      }
    } catch (...) {
      remove_tree(state_dir);
      throw;
    }
    remove_tree(state_dir);
  }
  out.seconds = seconds_since(t_start);
  return out;
}

int PlanCandidate::top_k_at(int layer) const {
  const auto it = layer_retrieval.find(layer);
  return it == layer_retrieval.end() ? top_k : it->second.first;
}

int64_t PlanCandidate::tail_at(int layer) const {
  const auto it = layer_retrieval.find(layer);
  return it == layer_retrieval.end() ? tail_samples : it->second.second;
}

std::string PlanCandidate::retrieval_text() const {
  std::string text = tail_samples > 0 ? ", tail_samples " + std::to_string(tail_samples) : std::string();
  for (const auto& [layer, own] : layer_retrieval)
    text += "; layer " + std::to_string(layer) + ": top_k " + std::to_string(own.first) + ", tail_samples " +
            std::to_string(own.second);
  return text;
}

std::string PlanCandidate::label() const {
  return "window " + std::to_string(window) + ", top_k " + std::to_string(top_k) + retrieval_text();
}

std::string ModelCheckOutcome::summary() const {
  std::string s;
  char buf[160];
  for (const ModelCheckText& t : texts) {
    std::snprintf(buf, sizeof buf, "%s: agreement %.2f%% of %lld%s, perplexity %+.2f%%, KL %.2e", t.text.c_str(),
                  100 * t.agreement(), static_cast<long long>(t.positions),
                  t.stopped_early ? " (stopped: the bound out of reach)" : "", 100 * (t.perplexity_ratio - 1),
                  t.kl_mean);
    s += (s.empty() ? "" : "; ") + std::string(buf);
  }
  int64_t positions = 0, agreeing = 0;
  for (const ModelCheckText& t : texts) positions += t.positions, agreeing += t.agreeing;
  if (texts.size() > 1 || confidence > 0.5) {
    std::snprintf(buf, sizeof buf, "; pooled %.2f%% of %lld, lower bound %.2f%% at %.0f%%",
                  positions > 0 ? 100.0 * double(agreeing) / double(positions) : 100.0,
                  static_cast<long long>(positions), 100 * agreement_bound, 100 * confidence);
    s += buf;
  }
  if (kl_bound > 0) {
    std::snprintf(buf, sizeof buf, "; pooled KL %.2e against a bound of %.2e", kl_mean, kl_bound);
    s += buf;
  }
  return s;
}

std::string model_check_key(const Program& program, const TuningRun& t, const PlanCandidate& c) {
  Program p = apply_candidate(program, t, c);
  p.target.gpu_arch = "none";
  for (auto it = p.plan.kernel.begin(); it != p.plan.kernel.end();)
    it = it->first.rfind("cuda.", 0) == 0 ? p.plan.kernel.erase(it) : std::next(it);
  return format_program(p);
}

// A layer's step depends on that layer's own top_k and tail_samples only,
// so a per-layer candidate shares its layers' records with the candidates
// it was composed from.
std::string engine_step_key(const PlanCandidate& c, int layer, const SearchPoint& p) {
  return "engine step layer " + std::to_string(layer) + "; sinks " + std::to_string(c.sinks) + " window " +
         std::to_string(c.window) + " top_k " + std::to_string(c.top_k_at(layer)) + " tail " +
         std::to_string(c.tail_at(layer)) +
         " kernels " + std::to_string(c.kernel_schedule) + "; queue " + std::to_string(p.search.queue) + " patience " +
         std::to_string(p.search.patience) + " seeds " + std::to_string(p.search.seeds) + " expand " +
         std::to_string(p.search.expand_first) + "/" + std::to_string(p.search.full_expand);
}

Program measured_program(const Program& program, const TuningRun& t) {
  if (t.chosen_recipe < 0 || size_t(t.chosen_recipe) >= t.recipes.size()) return program;
  return with_recipe(program, t.recipes[size_t(t.chosen_recipe)].recipe);
}

Program apply_plan_choice(const Program& program, const TuningRun& t) {
  if (t.chosen < 0) return program;
  return apply_candidate(measured_program(program, t), t, t.candidates[size_t(t.chosen)]);
}

Program apply_candidate(const Program& program, const TuningRun& t, const PlanCandidate& c) {
  Program p = program;
  p.plan.sinks = ParamDomain::fixed_value(double(c.sinks));
  p.plan.window = ParamDomain::fixed_value(double(c.window));
  p.plan.top_k = ParamDomain::fixed_value(c.top_k);
  p.plan.tail_samples = ParamDomain::fixed_value(double(c.tail_samples));
  // The plan-wide queue serves layers without a block; it must hold the top-k.
  if (p.plan.search_queue.default_value() < c.top_k) p.plan.search_queue = ParamDomain::fixed_value(c.top_k);
  p.target.gpu_arch = t.gpu ? t.gpu->arch : "none";
  if (size_t(c.kernel_schedule) < t.kernel_schedules.size())
    for (const auto& [key, value] : t.kernel_schedules[size_t(c.kernel_schedule)].knobs)
      p.plan.kernel[key] = ParamDomain::fixed_value(value);
  if (t.gpu && size_t(t.chosen_gpu_variant) < t.gpu_variants.size())
    fix_gpu_kernel_knobs(program.model, t.gpu_variants[size_t(t.chosen_gpu_variant)], c.sinks + c.window, &p.plan);
  namespace k = plan_keys;
  for (int l = 0; l < program.model.num_layers; ++l) {
    if (!program.model.is_global(l)) continue;
    // The nearest sampled layer's setting (and its own retrieval).
    const SearchPoint* best = nullptr;
    int sampled = -1, dist = std::numeric_limits<int>::max();
    for (const auto& [layer, point] : c.layer_point)
      if (std::abs(layer - l) < dist) dist = std::abs(layer - l), best = point, sampled = layer;
    if (!best) continue;
    LayerSearchDomains& own = p.plan.layer_search[l];
    if (c.top_k_at(sampled) != c.top_k || c.tail_at(sampled) != c.tail_samples) {
      own.params[k::top_k] = ParamDomain::fixed_value(c.top_k_at(sampled));
      own.params[k::tail_samples] = ParamDomain::fixed_value(double(c.tail_at(sampled)));
    }
    own.params[k::search_queue] = ParamDomain::fixed_value(best->search.queue);
    own.params[k::search_patience] = ParamDomain::fixed_value(best->search.patience);
    own.params[k::search_seeds] = ParamDomain::fixed_value(best->search.seeds);
    own.params[k::search_expand_first] = ParamDomain::fixed_value(best->search.expand_first);
    own.params[k::search_full_expand] = ParamDomain::fixed_value(best->search.full_expand);
  }
  return p;
}

}  // namespace rattn
