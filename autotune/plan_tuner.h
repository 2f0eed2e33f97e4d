#pragma once
// The autotuning pass per hardware (`rattn tune MODEL.ra ... -o OUT/`): the
// static set (window, top_k) and each layer's decode searches that give the
// lowest per-token decode time of the whole model on a CPU/GPU pair, under
// two accuracy constraints measured on held-out decode queries: recall@k of
// the retrieved top-k, and the relative L2 error of the attention output
// against full attention. docs/autotune.md describes the method.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "autotune/build_recipe.h"
#include "autotune/hardware.h"
#include "dsl/ir.h"

namespace rattn {

// Candidates this close to the fastest (relative) count as equally fast;
// the most accurate of them is chosen.
inline constexpr double kTimeTolerance = 0.01;

// The model in the loop on one text (PlanTuneOptions::check_model).
struct ModelCheckText {
  std::string text;          // its name
  int64_t positions = 0;     // scored positions decoded (fewer when stopped once the bound was out of reach)
  int64_t agreeing = 0;      // greedy next token equal to full attention's
  double perplexity_ratio = 1;
  double kl_mean = 0;        // KL(full attention || the plan), next-token distributions, mean over the positions
  bool stopped_early = false;
  double agreement() const { return positions > 0 ? double(agreeing) / double(positions) : 1.0; }
};

// Passed: every text's perplexity within its bound, and the agreement
// pooled over the texts, at the pass's confidence (rate_lower_bound), at
// least the minimum: a plan is not judged by a flip or two of chance.
struct ModelCheckOutcome {
  bool passed = false;
  std::vector<ModelCheckText> texts;
  double agreement_bound = 0;  // the pooled agreement's lower bound
  double confidence = 0.5;
  // The KL pooled over the positions decoded, and its bound (0: none): a
  // multiple of a reference plan's on the same texts.
  double kl_mean = 0, kl_bound = 0;
  std::string summary() const;  // "w3.txt: agreement 99.61% of 512, perplexity +0.12%; ...; pooled ..."
};

struct PlanTuneOptions {
  // Calibration data (rattn capture): one set or several texts of the
  // model, each measured on its own; a layer's setting serves them all.
  std::vector<std::string> calib_dirs;
  bool synthetic = false;  // or the synthetic generator (runtime/data/synthetic.h), one KV head per sampled layer
  std::string distribution = "topics";  // its distribution: topics or documents (runtime/data/synthetic_docs.h)
  uint64_t seed = 1;
  int64_t context = 0;     // deployment context; 0: the shortest set's length (calib) or the model's (synthetic)
  std::string gpu = "none";  // none, an arch or a key of gpu_specs()
  int threads = 2;         // CPU threads of the deployment (and of the index builds here)
  double min_recall = 0.95;
  // recall is counted over the best min(top_k, recall_k) keys; 0: all top_k
  // (a large top-k then needs a long queue to meet the target).
  int recall_k = 0;
  int recall_depth(int top_k) const { return recall_k > 0 ? std::min(top_k, recall_k) : top_k; }
  // recall@k meets min_recall on the tuning queries at this one-sided
  // confidence (search_tuner.h, recall_lower_bound); 0.5: the mean itself.
  double confidence = 0.95;
  // Mean relative L2 error of a layer's attention output against full
  // attention; 0: the paper's plan's own error on that layer.
  double max_output_error = 0;
  // > 0: also the 95th percentile of a layer's per-step relative L2 errors
  // (over the test queries and heads) may not exceed this.
  double max_output_error_p95 = 0;
  // The dtype the deployment's runtime stores K/V in (RuntimeConfig::kv_storage,
  // the C API's kv_storage, f16 unless the engine asks otherwise), not the
  // model's own kv_dtype: errors, kernel times and the engine check use it.
  DType kv_storage = DType::f16;
  int test_queries = 256;
  double holdout = 0.5;
  int holdout_block = 32;
  int sample_layers = 2;     // global layers measured, evenly spaced; the others take the nearest one's figures
  int sample_kv_heads = 1;   // KV heads (with their query heads) measured per sampled layer
  int sample_q_heads = 0;    // query heads measured per sampled KV head; 0: the whole group
  int sequences = 1;         // sequences whose static sets share the GPU's memory
  double gpu_memory_gib = 0; // GPU memory for the static sets; 0: the card's less the weights estimate
  std::string db_path;       // tuning database; "" = none
  bool measure_gpu = true;   // time the static set on a GPU when one is present
  double minutes = 0;        // > 0: measure no more layers once this long has passed (at least one is)
  // Also search the index build recipe over the plan's build domains
  // (build_recipe.h): successive halving, `build_finalists` measured fully.
  bool search_build = false;
  int build_finalists = 2;
  double max_index_memory = 0;  // > 0: index bytes / offloaded KV bytes a recipe may need
  // > 0 (CPU target only): the runtime's own decode step (engine_check.h)
  // timed for the fastest this many candidates on the first set's sampled
  // layers, and then for each new choice until the chosen one is measured
  // (at most twice as many); a measured layer's time replaces the model's.
  int engine_check = 0;
  // > 0: the model in the loop. The chosen candidate's whole plan is run
  // through the real model (check_model, which the CLI sets); one that
  // fails is excluded and the pass chooses again, at most this many
  // candidates checked. A layer's attention error does not always rank two
  // settings as the model's next token does.
  int model_check = 0;
  // Decodes check texts with the plan (DSL text, as tuned.ra would hold it);
  // progress(fraction of this check, note).
  // `context`: the deployment context (TuningRun::context).
  std::function<ModelCheckOutcome(const std::string& plan_text, int64_t context,
                                  const std::function<void(double, const std::string&)>& progress)>
      check_model;
  // What an outcome depends on besides the plan (the model file, the texts,
  // positions and bounds): the database keys its records by it.
  std::string model_check_scope;
  std::function<void(const std::string&)> log;                  // notes
  std::function<void(double, double, const std::string&)> progress;  // (done, total, now)
};

// One decode-search setting measured for one top_k on a sampled layer.
struct SearchPoint {
  int top_k = 0;
  DecodeSearch search;
  int64_t index_keys = 0;                      // keys the searched index holds (LayerSample::window_keys)
  double recall_tune = 0, recall_valid = 0;    // recall@top_k, mean over the query heads
  double recall_se_tune = 0;                   // the standard error of recall_tune (SearchTrial::recall_se)
  double scored_tune = 0, scored_valid = 0;    // keys scored / keys indexed
  double us_per_search = 0;                    // one query head, one thread
  bool met_tune = false;                       // recall_tune less the confidence margin meets the target
  // The baseline's setting: the plan's default search with the queue raised
  // until the held-out recall@100 meets the target (errors for its window only).
  bool baseline = false;
  // Mean relative L2 output error per static variant (TuningRun::error_slot:
  // each window of error_windows with each tail_samples of error_tails), on
  // the tuning and validation queries; measured where met_tune.
  std::vector<double> error_tune, error_valid;
  // The same slots' 95th percentile over the queries and heads: a mean can
  // hide a tail of badly served steps (a top-k that misses heavy tokens the
  // tail sample then over- or under-weights), which the model's next token
  // feels.
  std::vector<double> error_p95_tune, error_p95_valid;
};

// One KV head of a sampled layer on one calibration set. A layer's samples
// (its KV heads on each set) share one setting (layer_setting).
struct LayerSample {
  int layer = 0;
  int kv_head = 0;
  std::string calib;         // the calibration set's name (CalibSet::name); "" for the synthetic generator
  std::string label() const; // "layer 11 kv 0 (calib-32k-w4)"
  int64_t keys = 0;          // keys before the test queries
  // The keys the index holds for each window: those before the window's
  // static set, as the runtime indexes them (index_keys_per_window).
  std::map<int64_t, int64_t> window_keys;
  double build_s = 0;        // the group's index builds
  double insert_us = 0;      // one token into one index
  std::vector<SearchPoint> points;
};

// CPU kernel times on this machine (Halide kernels), one thread.
struct KernelTimes {
  std::map<int64_t, double> gathered_us;  // rows -> partial attention of one query head over that many ids
  std::map<int64_t, double> dense_us;     // rows -> dense attention of one GQA group over that many rows
  double merge_us = 0;                    // merging one query head's partial results
  // sample rows -> the tail estimate of one GQA group over that many
  // sampled rows (tail_samples; runtime/tail_estimate.cpp).
  std::map<int64_t, double> tail_us;
};

// One Halide schedule the plan's kernel.halide.* domains allow, and its
// kernels' times on this machine.
struct KernelSchedule {
  std::map<std::string, double> knobs;  // "halide.vector" -> 16, ...; empty: the library's defaults
  KernelTimes times;
  std::string text() const;             // "halide.vector 16", or "defaults"
};

// A setting of the plan's kernel.cuda.* domains for the static set's GPU
// kernel; no knobs: the runtime's own choice (static_set_splits and the
// generator's defaults).
// cuda.splits 0: the runtime's count for the set (static_set_splits).
struct GpuKernelVariant {
  std::map<std::string, double> knobs;
  std::string text() const;  // "cuda.splits 8, cuda.warps 4", "cuda.splits auto, ...", or "the runtime's choice"
  // What the GPU time model is given for it (the knobs it sees: splits, warps).
  StaticSetWork work(const ModelLayout& model, int64_t rows) const;
};

// The runtime's choice, then the product of the plan's kernel.cuda.* domains
// (cuda.splits, with 0 for the runtime's count, only for a model without
// sliding-window layers), less the setting the runtime runs untuned.
std::vector<GpuKernelVariant> gpu_kernel_variants(const Program& program);

// The time of one decode step of one layer (all its heads) for a choice.
struct LayerTime {
  double cpu_us = 0;    // retrieval, attention over the top-k, insertion (and the static set without a GPU), merge
  double gpu_us = 0;    // the static set on the GPU, transfers included (predicted or measured)
  bool gpu_measured = false;
  double step_us() const { return cpu_us > gpu_us ? cpu_us : gpu_us; }
};

struct PlanCandidate {
  int64_t sinks = 0, window = 0;
  int top_k = 0;
  int64_t tail_samples = 0;    // the tail estimate's sample (0: none)
  int kernel_schedule = 0;     // index into TuningRun::kernel_schedules: the fastest for this candidate
  bool feasible = false;       // every sampled layer met both constraints (tuning queries), and the GPU memory holds it
  std::string why_not;
  std::map<int, const SearchPoint*> layer_point;  // sampled layer -> its chosen setting
  // Per TuningRun::samples: the sample's own measurement of its layer's
  // setting (the setting itself, or its variant at a queue no longer).
  std::vector<const SearchPoint*> sample_point;
  std::map<int, LayerTime> layer_time;
  // Sampled layer -> the model's CPU time where the engine check measured
  // the layer (layer_time then holds the measured one).
  std::map<int, double> modelled_cpu_us;
  double token_ms = 0;         // whole model, per generated token
  double output_error = 0;     // mean over the sampled layers, tuning queries
  double gpu_static_gib = 0;   // static sets of every layer and sequence on the GPU
  // A per-layer candidate (choose_plan composes one per window and kernel
  // schedule): sampled layer -> its own (top_k, tail_samples) where it
  // differs from top_k / tail_samples above, which then hold for the other
  // layers. Empty: one top_k and tail_samples for every layer.
  std::map<int, std::pair<int, int64_t>> layer_retrieval;
  bool per_layer() const { return !layer_retrieval.empty(); }
  // What sampled layer `layer` retrieves: its own entry, else the plan-wide.
  int top_k_at(int layer) const;
  int64_t tail_at(int layer) const;
  // ", tail_samples N" where it samples the tail, then the layers with their
  // own top_k and tail_samples ("; layer 11: top_k 200, tail_samples 8192").
  std::string retrieval_text() const;
  std::string label() const;  // "window 4096, top_k 1000" + retrieval_text()
};

struct TuningRun {
  std::string target;          // "none" or the GPU's name
  const GpuSpec* gpu = nullptr;
  HardwareFingerprint fingerprint;
  std::vector<int64_t> windows;        // the window candidates
  std::vector<int64_t> error_windows;  // the windows errors were measured for: the candidates and the baseline's
  std::vector<int64_t> tails;          // the tail_samples candidates
  std::vector<int64_t> error_tails;    // the tail_samples errors were measured for (0 first: the baseline's)
  // The index of (window, tail_samples) in SearchPoint::error_tune/valid.
  size_t error_slot(int64_t window, int64_t tail_samples) const;
  std::vector<int> top_ks;
  std::vector<LayerSample> samples;
  // Every schedule of the plan's kernel.halide.* domains, the defaults first.
  std::vector<KernelSchedule> kernel_schedules;
  // The chosen candidate's kernel times, else the defaults'.
  const KernelTimes& kernel_times() const;
  // The GPU kernel settings searched (gpu_kernel_variants): the runtime's
  // choice first, then the product of the plan's kernel.cuda.* domains
  // (cuda.splits only for a model without sliding-window layers: the knob
  // is plan-wide).
  std::vector<GpuKernelVariant> gpu_variants;
  // Static-set rows -> measured step time per variant (GPU present; NaN:
  // the variant does not build for the model).
  std::map<int64_t, std::vector<double>> gpu_measured_us;
  std::string gpu_measured_for;               // the gpu_specs() key of the GPU measured
  // One layer's static-set step on the target with the fastest variant:
  // measured where the GPU was, else predicted (variants the model cannot
  // tell apart tie, and the first wins). *variant: its index.
  double gpu_step_us(const ModelLayout& model, int64_t rows, int* variant = nullptr, bool* measured = nullptr) const;
  int chosen_gpu_variant = 0;                 // for the chosen candidate's static set
  std::vector<PlanCandidate> candidates;      // every (window, top_k, tail_samples)
  // Engine check (PlanTuneOptions::engine_check): engine_step_key() -> the
  // runtime's decode step of one KV head's group, microseconds.
  std::map<std::string, double> engine_us;
  std::map<std::tuple<int64_t, int, int64_t>, int> engine_schedule;  // (window, top_k, tail) -> kernel schedule measured
  int engine_checked = 0;  // candidates measured
  int model_chosen = -1;   // the choice on modelled times alone, before the check
  // Model check (PlanTuneOptions::model_check): model_check_key() -> the
  // outcome; a failed candidate is not feasible. `model_check_log`: the
  // candidates checked, in order.
  struct ModelCheckEntry {
    std::string label;  // "window 4096, top_k 1000, tail_samples 4096; layer 11: ..."
    double token_ms = 0;
    std::string key;
    bool reused = false;  // from the database
  };
  std::map<std::string, ModelCheckOutcome> model_checks;
  std::vector<ModelCheckEntry> model_check_log;
  // The chosen candidate's model check passed (true without a check).
  bool model_check_met = true;
  int chosen = -1;  // the most accurate feasible candidate within kTimeTolerance of the fastest; -1: none
  PlanCandidate baseline;                     // the paper's plan, queue raised until held-out recall meets
  bool baseline_met = false;
  // The paper's plan's held-out output error within each layer's bound
  // (always so when the bound is its own error, the default).
  bool baseline_within_error = true;
  double validation_recall_min = 0, validation_error_max = 0;  // of the chosen, over sampled layers
  bool validation_met = false;
  std::map<int, double> error_bounds;  // sampled layer -> its output-error bound (tuning queries)
  int64_t context = 0;
  double weights_gib = 0, gpu_budget_gib = 0;
  int db_reused = 0, db_measured = 0, db_foreign = 0;  // records reused, measured, skipped (other fingerprint)
  // With search_build: every recipe of the plan's build domains, and the
  // one `samples` were measured under: the chosen one, or when no finalist
  // had a feasible plan the best-ranked finalist. Empty and -1 without it.
  std::vector<RecipeResult> recipes;
  int chosen_recipe = -1;
  double seconds = 0;
};

TuningRun tune_plan(const Program& program, const PlanTuneOptions& opt);

// The choice from `tuning`'s measurements for the target opt.gpu (and
// opt.threads, sequences, gpu_memory_gib, max_output_error): fills
// candidates, chosen, baseline and the validation figures. tune_plan ends
// with it; the report calls it for other targets on the same measurements.
void choose_plan(const Program& program, const PlanTuneOptions& opt, TuningRun* tuning);

// What the engine check's time of sampled layer `layer` under candidate `c`
// (with the layer's search setting `p`) is keyed by.
std::string engine_step_key(const PlanCandidate& c, int layer, const SearchPoint& p);

// The plan the model check runs for candidate c and keys its outcome by:
// apply_candidate's, as DSL text, for the CPU (the GPU's kernel knobs and
// target change no result).
std::string model_check_key(const Program& program, const TuningRun& t, const PlanCandidate& c);

// `program` with candidate c's values fixed (as apply_plan_choice).
Program apply_candidate(const Program& program, const TuningRun& t, const PlanCandidate& c);

// `program` with the chosen values fixed: sinks, window, top_k plan-wide,
// every global layer's decode search (from its nearest sampled layer), and
// the chosen build recipe's knobs.
Program apply_plan_choice(const Program& program, const TuningRun& t);

// The program `t.samples` were measured under: `program`, or with the
// chosen build recipe's knobs fixed (choose_plan on other targets takes it).
Program measured_program(const Program& program, const TuningRun& t);

}  // namespace rattn
