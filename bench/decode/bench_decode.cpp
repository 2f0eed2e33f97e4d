// `rattn bench decode`: the hybrid decode step of one KV head (its GQA group
// of query heads) against full attention on the CPU, in the same run, with the
// same CPU kernels; plus the modelled per-token attention time of a whole
// model (Llama-3-8B by default) on this machine.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/decode/bench_decode.h"
#include "bench/decode/roofline.h"
#include "bench/split_attention.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/memory.h"
#include "core/progress.h"
#include "dsl/memory_plan.h"
#include "kernels/kv_store.h"
#include "runtime/data/synthetic.h"
#include "runtime/runtime.h"

namespace rattn::bench {
namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

// Mean over the first `n` values: whole insertion-batch periods.
double mean_first(const std::vector<double>& v, size_t n) {
  return mean(std::vector<double>(v.begin(), v.begin() + std::ptrdiff_t(std::min(n, v.size()))));
}

// One step's wall and CPU times.
struct Timings {
  std::vector<double> wall_ms, cpu_ms;
  template <class F> void time(F&& f) {
    const double t0 = seconds_now(), c0 = process_cpu_seconds();
    f();
    wall_ms.push_back(1e3 * (seconds_now() - t0));
    cpu_ms.push_back(1e3 * (process_cpu_seconds() - c0));
  }
};

// The run's progress in expected seconds: each phase weighed by its work at
// rough one-core rates (the prefill's shared by the threads). The measured
// times of finished phases against their estimates rescale the decode step,
// whose weight is the measured mean step. At most one update per decode
// step, between the timed calls.
class PhaseBar {
 public:
  enum Phase { kData, kPrefill, kCopies, kTail, kPhases };
  PhaseBar(const BenchDecodeOptions& o, int64_t tokens) : bar("rattn bench decode", 1, o.progress) {
    const double t = double(tokens), n = double(o.tokens), d = o.head_dim, g = o.group;
    // Sequences decoding each step besides full attention: rattn, without insertion, the variants.
    const int decoders = 2 + (o.tail_samples > 0) + (o.search_seeds >= 0) + 2 * o.batch;
    steps_ = o.warmup + o.steps;
    est_[kData] = t * d * (2 * g + 2) * kDataPerValue;
    est_[kPrefill] = n * g * kPrefillPerKeyHead / std::max(1, o.threads);
    // A state saved and loaded per decoder (the fp16 K/V and the indexes).
    est_[kCopies] = n * (4 * d + 160 * g) * double(decoders) * kCopyPerByte;
    // Full attention reads every fp16 K/V row; a rattn step is about a constant.
    step_units_ = n * 4 * d * kFullPerByte / std::max(1, o.threads) + double(decoders) * kRattnStep;
    est_[kTail] = kTail1 * (o.threads == 1 ? 1 : 2);
    double total = step_units_ * steps_;
    for (double e : est_) total += e;
    bar.set_total(total);
  }
  // The prefill replaced by loading its saved state (one state's bytes).
  void prefill_loaded(const BenchDecodeOptions& o) {
    const double load = double(o.tokens) * (4 * o.head_dim + 160 * o.group) * kCopyPerByte;
    bar.set_total(bar.total() - est_[kPrefill] + load);
    est_[kPrefill] = load;
  }
  // Share `f` of phase `p` done.
  void within(Phase p, double f) {
    const double u = std::clamp(f, 0.0, 1.0) * est_[p];
    if (u > in_[p]) bar.advance(u - in_[p], phase_name(p));
    in_[p] = std::max(in_[p], u);
  }
  void phase_done(Phase p, double seconds, const std::string& next) {
    bar.advance(est_[p] - in_[p], next);
    in_[p] = est_[p];
    measured_ += seconds;
    expected_ += est_[p];
  }
  // A decode step took `seconds`: its weight from then on is the mean
  // measured step after the first (kernel JIT, first touches), rescaled.
  void step_done(double seconds, const std::string& now) {
    ++done_steps_;
    if (done_steps_ > 1 || steps_ == 1) {
      step_sum_ += seconds;
      ++step_count_;
      if (measured_ > 0 && expected_ > 0) step_units_ = step_sum_ / step_count_ * expected_ / measured_;
    }
    bar.set_total(bar.done() + step_units_ * double(steps_ - done_steps_ + 1) + est_[kTail]);
    bar.advance(step_units_, now);
  }
  Progress bar;

 private:
  static const char* phase_name(Phase p) { return p == kPrefill ? "prefill" : ""; }
  // Rough one-core rates (seconds per unit), measured on a 2-core x86 VM.
  static constexpr double kDataPerValue = 2.3e-8, kPrefillPerKeyHead = 1.4e-4, kCopyPerByte = 5e-9,
                          kFullPerByte = 2e-10, kRattnStep = 1e-3, kTail1 = 0.7;
  double est_[kPhases] = {}, in_[kPhases] = {};
  double measured_ = 0, expected_ = 0, step_units_ = 0, step_sum_ = 0;
  int steps_ = 0, done_steps_ = 0, step_count_ = 0;
};

}  // namespace

boost::json::object run_bench_decode(const BenchDecodeOptions& o, std::FILE* text) {
  const int d = o.head_dim, g = o.group;
  SyntheticSpec spec;
  // Decode tokens follow the context; a fixed reserve keeps the data (and a
  // cached prefilled state) the same whatever the step count.
  spec.tokens = o.tokens + std::max<int64_t>(4096, o.warmup + o.steps);
  spec.head_dim = d;
  spec.group = g;
  spec.seed = o.seed;
  PhaseBar bar(o, spec.tokens);
  // Log lines go above the bar when both share a terminal.
  const bool same_terminal = text && o.progress && ::isatty(::fileno(text)) && ::isatty(::fileno(o.progress));
  auto log = [&](const std::string& s) {
    if (same_terminal) bar.bar.note(s);
    else if (text) std::fprintf(text, "%s\n", s.c_str());
    std::fflush(stdout);
  };
  {
    // The synthetic data and the prefill's query copy (fp32), the fp16
    // stores of the sequence and of full attention, and the indexes
    // (about 160 B per key and query head): checked before any of it.
    const uint64_t t = uint64_t(spec.tokens), fp32_row = uint64_t(d) * 4;
    require_memory(t * fp32_row * uint64_t(2 * g + 2) + t * fp32_row * 2 + t * uint64_t(g) * 160,
                   "bench decode at " + std::to_string(o.tokens) + " tokens");
  }
  double t0 = seconds_now();
  const SyntheticHead data = make_synthetic(spec);
  bar.phase_done(PhaseBar::kData, seconds_now() - t0, "prefill");
  log("synthetic OOD set: " + std::to_string(spec.tokens) + " tokens, d=" + std::to_string(d) + ", group " +
      std::to_string(g) + " (" + std::to_string(seconds_now() - t0) + " s)");

  RuntimeConfig config;
  config.layout.name = "bench";
  config.layout.num_layers = 1;
  config.layout.num_q_heads = g;
  config.layout.num_kv_heads = 1;
  config.layout.head_dim = d;
  config.layout.layers.assign(1, LayerSpec{});
  config.plan.sinks = o.sinks;
  config.plan.window = o.window;
  config.plan.top_k = o.top_k;
  config.plan.search_queue = o.search_queue;
  config.plan.graph_degree = o.graph_degree;
  config.plan.query_neighbors = o.query_neighbors;
  config.plan.build_sample = o.build_sample;
  config.kv_storage = DType::f16;
  config.threads = o.threads;
  config.insert_batch = o.insert_batch;
  config.searches_per_item = o.searches_per_item;
  config.use_gpu = o.use_gpu;
  config.plan.insert_queue = o.insert_queue;
  config.plan.insert_pivots = o.insert_pivots;
  config.plan.insert_reverse = o.insert_reverse;
  config.plan.insert_key_queue = o.insert_key_queue;
  config.plan.traversal_codes = o.traversal_codes;
  config.plan.code_dims = o.code_dims;
  config.plan.code_coarse_dims = o.code_coarse_dims;
  config.share_traversal_codes = o.share_codes;
  config.plan.shared_graph = o.shared_graph;
  if (o.exact_index) config.index = IndexChoice::exact;
  config.seed = o.seed;
  auto runtime = std::make_shared<const Runtime>(config);

  // Prefill (or a cached prefilled state): queries packed [group, T, d].
  std::unique_ptr<Sequence> seq;
  double prefill_s = -1;
  // The cache is valid only for the same data and build parameters: their
  // description is kept beside it and compared.
  std::string cache_key;
  for (const auto& x : std::initializer_list<int64_t>{spec.tokens, o.tokens, d, g, o.sinks, o.window, o.graph_degree,
                                                     o.query_neighbors, int64_t(o.build_sample * 1e6),
                                                     int64_t(o.seed), int64_t(o.shared_graph), int64_t(o.exact_index),
                                                     // the build keeps the query moment for projected codes
                                                     int64_t(uses_projected_codes(config.plan, d))})
    cache_key += std::to_string(x) + " ";
  auto read_text = [](const std::string& path) {
    // Missing or not a regular file: no cached state.
    try {
      return read_file(path);
    } catch (const Error&) {
      return std::string();
    }
  };
  if (!o.state_cache.empty() && ::access(o.state_cache.c_str(), R_OK) == 0 &&
      read_text(o.state_cache + ".key") == cache_key) {
    t0 = seconds_now();
    bar.prefill_loaded(o);
    seq = Sequence::load(runtime, o.state_cache);
    bar.phase_done(PhaseBar::kPrefill, seconds_now() - t0, "save and load the state");
    log("loaded the prefilled state from " + o.state_cache + ": " + std::to_string(seconds_now() - t0) + " s");
  } else {
    seq = std::make_unique<Sequence>(runtime);
    std::vector<float> q(size_t(g) * size_t(o.tokens) * size_t(d));
    for (int h = 0; h < g; ++h)
      std::memcpy(q.data() + size_t(h) * size_t(o.tokens) * size_t(d), data.query(h, 0),
                  size_t(o.tokens) * size_t(d) * sizeof(float));
    t0 = seconds_now();
    seq->prefill(0, o.tokens, q.data(), data.keys.data(), data.values.data(), DType::f32,
                 [&](double f) { bar.within(PhaseBar::kPrefill, f); });
    prefill_s = seconds_now() - t0;
    bar.phase_done(PhaseBar::kPrefill, prefill_s, "save and load the state");
    log("prefill (static set, CPU store, " + std::to_string(g) + " indexes): " + std::to_string(prefill_s) + " s");
    if (!o.state_cache.empty()) {
      seq->save(o.state_cache);
      write_file_atomic(o.state_cache + ".key", cache_key);
    }
  }

  // Side-by-side variants start from the same build: the prefilled state is
  // saved once and loaded into a runtime whose config `change` edits (the
  // sequence keeps its runtime alive).
  const std::string state_path = "/tmp/rattn_bench_decode_" + std::to_string(::getpid()) + ".seq";
  t0 = seconds_now();
  seq->save(state_path);
  auto load_variant = [&](const std::function<void(RuntimeConfig&)>& change) {
    RuntimeConfig variant = config;
    change(variant);
    return Sequence::load(std::make_shared<const Runtime>(variant), state_path);
  };
  // Without token insertion (the paper's decode, where tokens leaving the
  // window are never indexed).
  std::unique_ptr<Sequence> seq_no_insert = load_variant([](RuntimeConfig& c) { c.insert_evicted = false; });
  // With --tail-samples: the same plan plus the tail estimate.
  std::unique_ptr<Sequence> seq_tail;
  if (o.tail_samples > 0) seq_tail = load_variant([&](RuntimeConfig& c) { c.plan.tail_samples = o.tail_samples; });
  // With --search-seeds: the same plan, warm-started searches.
  std::unique_ptr<Sequence> seq_seeded;
  if (o.search_seeds >= 0) seq_seeded = load_variant([&](RuntimeConfig& c) { c.plan.search_seeds = o.search_seeds; });
  // With --batch: 2N copies of the state on one runtime, N decoded one by
  // one and N in one decode_batch() call.
  std::vector<std::unique_ptr<Sequence>> one_by_one, batched;
  std::shared_ptr<const Runtime> batch_runtime;
  if (o.batch > 0) {
    batch_runtime = std::make_shared<const Runtime>(config);
    for (int i = 0; i < o.batch; ++i) {
      one_by_one.push_back(Sequence::load(batch_runtime, state_path));
      batched.push_back(Sequence::load(batch_runtime, state_path));
    }
  }
  std::remove(state_path.c_str());
  bar.phase_done(PhaseBar::kCopies, seconds_now() - t0, "decode steps");
  log("saved and loaded the prefilled state: " + std::to_string(seconds_now() - t0) + " s");

  // Full attention baseline: every token in one fp16 store, the same kernels.
  RowStore all_k(DType::f16, d), all_v(DType::f16, d);
  all_k.reserve(spec.tokens);
  all_v.reserve(spec.tokens);
  all_k.append_f32(data.keys.data(), o.tokens);
  all_v.append_f32(data.values.data(), o.tokens);

  // Full attention splits the tokens into one chunk per thread (a pool of the
  // runtime's thread count), each chunk attends the whole group in one kernel
  // call, and the partials are merged: the same kernels and threads as rattn.
  CpuKernels& kernels = runtime->kernels();
  const int threads_used = runtime->pool().threads();
  SplitAttention full(threads_used, g, d);
  auto full_attention = [&](const float* qg, float* out, float* lse_out) {
    full.run(kernels, qg, all_k.view(), all_v.view(), out, lse_out);
  };

  std::vector<float> qt(size_t(g) * size_t(d)), out_rattn(qt.size()), out_tail(qt.size()), out_seeded(qt.size()),
      out_full(qt.size()), lse(static_cast<size_t>(g));
  Timings rattn_t, no_insert_t, full_t, tail_t, seeded_t, one_by_one_t, batch_t;
  std::vector<Sequence*> batch_seqs;
  for (auto& b : batched) batch_seqs.push_back(b.get());
  std::vector<std::vector<float>> batch_out(size_t(o.batch), std::vector<float>(qt.size()));
  std::vector<float*> batch_out_ptrs;
  for (auto& b : batch_out) batch_out_ptrs.push_back(b.data());
  std::vector<const void*> batch_q(size_t(o.batch), qt.data()), batch_k(size_t(o.batch)), batch_v(size_t(o.batch));
  std::vector<float> out_one(qt.size());
  int64_t batch_mismatches = 0;  // steps where a batched sequence's output differs from its one-by-one twin's
  double cos_sum = 0, cos_tail_sum = 0, cos_seeded_sum = 0;
  auto cosine_of = [&](const std::vector<float>& x, int h) {
    double ab = 0, aa = 0, bb = 0;
    for (int j = 0; j < d; ++j) {
      const double a = x[size_t(h * d + j)], b = out_full[size_t(h * d + j)];
      ab += a * b;
      aa += a * a;
      bb += b * b;
    }
    return ab / std::sqrt(aa * bb + 1e-300);
  };
  for (int s = -o.warmup; s < o.steps; ++s) {
    const double step_t0 = seconds_now();
    const int64_t t = o.tokens + o.warmup + s;
    if (s == 0) {  // warm-up steps are not timed
      rattn_t = no_insert_t = full_t = tail_t = seeded_t = one_by_one_t = batch_t = Timings{};
      seq->set_profiling(true);
      if (seq_tail) seq_tail->set_profiling(true);
      if (seq_seeded) seq_seeded->set_profiling(true);
    }
    for (int h = 0; h < g; ++h) std::memcpy(qt.data() + size_t(h) * size_t(d), data.query(h, t), size_t(d) * sizeof(float));
    const float* k = data.keys.data() + size_t(t) * size_t(d);
    const float* v = data.values.data() + size_t(t) * size_t(d);
    rattn_t.time([&] { seq->decode(0, qt.data(), k, v, DType::f32, out_rattn.data(), lse.data()); });
    if (seq_tail) tail_t.time([&] { seq_tail->decode(0, qt.data(), k, v, DType::f32, out_tail.data(), lse.data()); });
    if (seq_seeded)
      seeded_t.time([&] { seq_seeded->decode(0, qt.data(), k, v, DType::f32, out_seeded.data(), lse.data()); });
    no_insert_t.time([&] { seq_no_insert->decode(0, qt.data(), k, v, DType::f32, out_full.data(), lse.data()); });
    if (o.batch > 0) {
      std::fill(batch_k.begin(), batch_k.end(), k);
      std::fill(batch_v.begin(), batch_v.end(), v);
      one_by_one_t.time([&] {
        for (auto& one : one_by_one) one->decode(0, qt.data(), k, v, DType::f32, out_one.data(), nullptr);
      });
      batch_t.time([&] {
        Sequence::decode_batch(batch_seqs.data(), o.batch, 0, batch_q.data(), batch_k.data(), batch_v.data(),
                               DType::f32, batch_out_ptrs.data(), nullptr);
      });
      if (std::memcmp(out_one.data(), batch_out.back().data(), out_one.size() * sizeof(float)) != 0)
        ++batch_mismatches;
    }
    // Full attention: append the token, attend over all of them.
    full_t.time([&] {
      all_k.append_f32(k, 1);
      all_v.append_f32(v, 1);
      full_attention(qt.data(), out_full.data(), lse.data());
    });
    for (int h = 0; h < g && s >= 0; ++h) {
      cos_sum += cosine_of(out_rattn, h);
      if (seq_tail) cos_tail_sum += cosine_of(out_tail, h);
      if (seq_seeded) cos_seeded_sum += cosine_of(out_seeded, h);
    }
    // After the step's timed calls: one update.
    bar.step_done(seconds_now() - step_t0, s < 0 ? "warm-up step " + std::to_string(s + o.warmup + 1)
                                                 : "step " + std::to_string(s + 1) + " / " + std::to_string(o.steps));
  }
  // Whole batch periods: every insertion the runtime owes for these steps' evictions is in them.
  const size_t period_steps = size_t(o.steps / o.insert_batch) * size_t(o.insert_batch);
  const double rattn_med = median(rattn_t.wall_ms), full_med = median(full_t.wall_ms);
  const double rattn_amort = mean_first(rattn_t.wall_ms, period_steps), full_mean = mean_first(full_t.wall_ms, period_steps);
  const double rattn_amort_cpu = mean_first(rattn_t.cpu_ms, period_steps),
               full_mean_cpu = mean_first(full_t.cpu_ms, period_steps);
  const double no_insert_med = median(no_insert_t.wall_ms), no_insert_cpu_med = median(no_insert_t.cpu_ms);
  const double cosine = cos_sum / (double(o.steps) * g);
  const MemoryStats mem = seq->memory();
  const DecodeProfile prof = seq->profile();
  // Modelled per-token attention time: every (layer, KV head) runs one such
  // step; heads one after another with this run's thread count.
  const int64_t kv_steps = int64_t(o.model_layers) * o.model_kv_heads;

  boost::json::object params;
  params["tokens"] = o.tokens;
  params["head_dim"] = d;
  params["group"] = g;
  params["batch"] = o.batch;
  params["steps"] = o.steps;
  params["warmup"] = o.warmup;
  params["sinks"] = o.sinks;
  params["window"] = o.window;
  params["top_k"] = o.top_k;
  params["search_queue"] = o.search_queue;
  params["graph_degree"] = o.graph_degree;
  params["query_neighbors"] = o.query_neighbors;
  params["build_sample"] = o.build_sample;
  params["threads"] = threads_used;
  params["insert_batch"] = o.insert_batch;
  params["insert_queue"] = o.insert_queue;
  params["insert_pivots"] = o.insert_pivots;
  params["insert_reverse"] = o.insert_reverse;
  params["insert_key_queue"] = o.insert_key_queue;
  params["traversal_codes"] = o.traversal_codes;
  params["code_dims"] = o.code_dims;
  params["code_coarse_dims"] = o.code_coarse_dims;
  params["share_codes"] = o.share_codes;
  params["shared_graph"] = o.shared_graph;
  params["index"] = o.exact_index ? "exact" : "graph";
  params["tail_samples"] = o.tail_samples;
  params["search_seeds"] = config.plan.search_seeds;
  params["search_seeds_side_by_side"] = o.search_seeds;
  params["searches_per_item"] = o.searches_per_item > 0 ? o.searches_per_item
                                                        : searches_per_item(g, 1, threads_used);
  params["kv_storage"] = "f16";
  params["cpu_kernels"] = runtime->kernels_name();
  params["static_set"] = runtime->gpu_status();
  params["seed"] = o.seed;
  boost::json::object results;
  results["prefill_s"] = prefill_s;  // -1: loaded from --state-cache
  results["amortised_over_steps"] = int64_t(period_steps);
  // Headline: mean wall time over whole insertion-batch periods (every
  // insertion included) against full attention's mean over the same steps.
  results["rattn_step_ms_amortised"] = rattn_amort;
  results["full_step_ms_mean"] = full_mean;
  results["speedup_amortised"] = full_mean / rattn_amort;
  // Total CPU time of the process (all threads) during the step.
  results["rattn_step_cpu_ms_amortised"] = rattn_amort_cpu;
  results["full_step_cpu_ms_mean"] = full_mean_cpu;
  results["speedup_amortised_cpu_time"] = full_mean_cpu / rattn_amort_cpu;
  // Per-step latency: a typical step (median) and the tail (insertion steps).
  results["rattn_step_ms_median"] = rattn_med;
  results["rattn_step_ms_p90"] = percentile(rattn_t.wall_ms, 0.9);
  results["rattn_step_ms_max"] = percentile(rattn_t.wall_ms, 1.0);
  results["full_step_ms_median"] = full_med;
  results["speedup_median"] = full_med / rattn_med;
  // The step without inserting the token that leaves the window.
  results["rattn_no_insert_step_ms_median"] = no_insert_med;
  results["rattn_no_insert_step_cpu_ms_median"] = no_insert_cpu_med;
  results["speedup_no_insert"] = full_med / no_insert_med;
  results["mean_cosine_rattn_vs_full"] = cosine;
  {
    // The step's input checks (what Sequence::check_decode runs: q as fp32,
    // k and v against the fp16 store), repeated on the last step's inputs:
    // one check is too short for the step's clock.
    const int64_t t = o.tokens + o.warmup + o.steps - 1;
    const float* k = data.keys.data() + size_t(t) * size_t(d);
    const float* v = data.values.data() + size_t(t) * size_t(d);
    constexpr int kReps = 20000;
    int64_t found = 0;
    const double t0 = seconds_now();
    for (int r = 0; r < kReps; ++r)
      found += first_out_of_range(qt.data(), qt.size()) + first_out_of_range(DType::f32, k, size_t(d), DType::f16) +
               first_out_of_range(DType::f32, v, size_t(d), DType::f16);
    const double check_us = 1e6 * (seconds_now() - t0) / kReps;
    if (found != -3 * int64_t(kReps)) fail(Status::internal, "bench decode: the synthetic inputs failed the input check");
    results["input_check_us_per_step"] = check_us;
    results["input_check_share_of_step"] = check_us / (1e3 * rattn_amort);
    // The prefill's checks over the whole prompt, against the prefill's time.
    const size_t prompt = size_t(o.tokens) * size_t(d);
    const double p0 = seconds_now();
    for (int h = 0; h < g; ++h) found += first_out_of_range(data.query(h, 0), prompt);
    found += first_out_of_range(DType::f32, data.keys.data(), prompt, DType::f16) +
             first_out_of_range(DType::f32, data.values.data(), prompt, DType::f16);
    const double prefill_check_s = seconds_now() - p0;
    if (found != -3 * int64_t(kReps) - g - 2) fail(Status::internal, "bench decode: the prompt failed the input check");
    results["prefill_input_check_s"] = prefill_check_s;
    if (prefill_s > 0) results["prefill_input_check_share"] = prefill_check_s / prefill_s;
  }
  // A side-by-side variant (the same steps from the same state, one plan
  // knob changed): cost as a ratio to rattn, accuracy as the cosine to full
  // attention, and the time of the step part the knob touches.
  struct Variant {
    double amort = 0, cosine = 0, part_ms = 0;
  };
  auto side_by_side = [&](const char* key, const char* knob, int value, const Timings& t, double cos_sum,
                          const std::string& part, double part_total_ms, int64_t profiled_steps) {
    Variant v;
    v.amort = mean_first(t.wall_ms, period_steps);
    v.cosine = cos_sum / (double(o.steps) * g);
    v.part_ms = part_total_ms / double(std::max<int64_t>(1, profiled_steps));
    boost::json::object j;
    j[knob] = value;
    j["step_ms_amortised"] = v.amort;
    j["step_cpu_ms_amortised"] = mean_first(t.cpu_ms, period_steps);
    j["step_ms_median"] = median(t.wall_ms);
    j["step_time_ratio_to_rattn"] = v.amort / rattn_amort;
    j["speedup_amortised"] = full_mean / v.amort;
    j[part + "_ms_per_step"] = v.part_ms;
    j["mean_cosine_vs_full"] = v.cosine;
    j["one_minus_cosine_ratio_to_rattn"] = (1 - v.cosine) / std::max(1e-300, 1 - cosine);
    results[key] = std::move(j);
    return v;
  };
  Variant tail_v, seeded_v;
  if (seq_tail) {
    const DecodeProfile tp = seq_tail->profile();
    tail_v = side_by_side("rattn_with_tail", "tail_samples", o.tail_samples, tail_t, cos_tail_sum, "tail",
                          tp.tail_ms, tp.steps);
  }
  if (seq_seeded) {
    const DecodeProfile sp = seq_seeded->profile();
    seeded_v = side_by_side("rattn_with_search_seeds", "search_seeds", o.search_seeds, seeded_t, cos_seeded_sum,
                            "search", sp.search_ms, sp.steps);
  }
  // Where rattn's step goes, ms per step (summed over threads; with one
  // thread the parts add up to the step, less clock overhead).
  {
    const double n = double(std::max<int64_t>(1, prof.steps));
    boost::json::object b;
    b["steps"] = prof.steps;
    b["total"] = prof.total_ms / n;
    b["prepare"] = prof.prepare_ms / n;
    b["insert"] = prof.insert_ms / n;
    b["search"] = prof.search_ms / n;
    b["retrieved_attention"] = prof.retrieved_attention_ms / n;
    b["static_and_pending"] = prof.static_ms / n;
    b["merge"] = prof.merge_ms / n;
    b["unaccounted"] = (prof.total_ms - prof.prepare_ms - prof.insert_ms - prof.search_ms -
                        prof.retrieved_attention_ms - prof.static_ms - prof.merge_ms) / n;
    results["rattn_step_breakdown_ms"] = b;
  }
  // The roofline: what each part read per step against STREAM triad
  // measured now, on 1 thread (the parts' times are per thread) and on full
  // attention's threads.
  std::vector<RooflinePhase> roofline;
  Bandwidth triad1, triadt;
  {
    const size_t triad_n = size_t(1) << 23;  // 64 MiB per array
    triad1 = measure_bandwidth(1, triad_n, 0.2);
    triadt = threads_used == 1 ? triad1 : measure_bandwidth(threads_used, triad_n, 0.2);
    RooflineInput in;
    in.profile = prof;
    in.head_dim = d;
    in.kv = DType::f16;
    in.traversal_codes = o.traversal_codes;
    in.code_dims = o.code_dims;
    in.code_coarse_dims = o.code_coarse_dims;
    // At step s full attention reads tokens + warmup + s + 1 rows.
    in.full_rows = double(o.tokens + o.warmup) + double(o.steps + 1) / 2.0;
    in.full_ms = mean(full_t.wall_ms);
    roofline = decode_roofline(in, triad1.triad_gbs, triadt.triad_gbs);
    boost::json::object r;
    r["triad_gb_s_1thread"] = triad1.triad_gbs;
    r["triad_gb_s_threads"] = triadt.triad_gbs;
    r["threads"] = threads_used;
    boost::json::array phases;
    for (const RooflinePhase& ph : roofline) {
      boost::json::object x;
      x["phase"] = ph.name;
      if (ph.bytes >= 0) {
        x["bytes_per_step"] = ph.bytes;
        x["gb_s"] = ph.gb_s;
        x["share_of_triad"] = ph.share_of_triad;
      } else {
        x["bytes_per_step"] = nullptr;
      }
      x["ms_per_step"] = ph.ms;
      phases.push_back(std::move(x));
    }
    r["phases"] = std::move(phases);
    const double n = double(std::max<int64_t>(1, prof.steps));
    boost::json::object c;
    c["static_rows"] = double(prof.static_rows) / n;
    c["keys_scored"] = double(prof.keys_scored) / n;
    c["retrieved_rows"] = double(prof.retrieved_rows) / n;
    c["merged_partials"] = double(prof.merged_partials) / n;
    c["inserted"] = double(prof.inserted) / n;
    c["insert_keys_scored"] = prof.insert_keys_scored < 0 ? -1.0 : double(prof.insert_keys_scored) / n;
    c["full_attention_rows"] = in.full_rows;
    r["counts_per_step"] = std::move(c);
    results["roofline"] = std::move(r);
  }
  bar.bar.finish(std::to_string(o.steps) + " steps timed");
  auto as_array = [](const std::vector<double>& v) {
    boost::json::array a;
    for (double x : v) a.emplace_back(x);
    return a;
  };
  if (o.batch > 0) {
    boost::json::object b;
    b["sequences"] = o.batch;
    b["one_by_one_ms_median"] = median(one_by_one_t.wall_ms);
    b["batch_ms_median"] = median(batch_t.wall_ms);
    b["speedup_median"] = median(one_by_one_t.wall_ms) / median(batch_t.wall_ms);
    b["one_by_one_ms_amortised"] = mean_first(one_by_one_t.wall_ms, period_steps);
    b["batch_ms_amortised"] = mean_first(batch_t.wall_ms, period_steps);
    b["speedup_amortised"] = mean_first(one_by_one_t.wall_ms, period_steps) / mean_first(batch_t.wall_ms, period_steps);
    b["one_by_one_cpu_ms_amortised"] = mean_first(one_by_one_t.cpu_ms, period_steps);
    b["batch_cpu_ms_amortised"] = mean_first(batch_t.cpu_ms, period_steps);
    b["steps_with_different_outputs"] = batch_mismatches;
    results["batch"] = b;
  }
  results["rattn_step_ms"] = as_array(rattn_t.wall_ms);
  results["full_step_ms"] = as_array(full_t.wall_ms);
  results["cpu_kv_bytes"] = mem.cpu_kv_bytes;
  results["index_bytes"] = mem.index_bytes;
  boost::json::object model;
  model["name"] = o.model;
  model["context"] = o.tokens;
  model["layers"] = o.model_layers;
  model["kv_heads"] = o.model_kv_heads;
  model["indexes"] = int64_t(o.model_layers) * o.model_kv_heads * g;
  model["per_token_attention_ms_rattn"] = rattn_amort * double(kv_steps);
  model["per_token_attention_ms_full"] = full_mean * double(kv_steps);
  model["per_token_attention_ms_rattn_cpu_time"] = rattn_amort_cpu * double(kv_steps);
  model["per_token_attention_ms_full_cpu_time"] = full_mean_cpu * double(kv_steps);
  model["per_token_attention_ms_rattn_no_insert"] = no_insert_med * double(kv_steps);
  model["assumption"] =
      "amortised per-KV-head step x layers x KV heads, heads one after another with " +
      std::to_string(threads_used) + " thread(s) as measured";
  boost::json::object report;
  report["benchmark"] = "decode";
  report["machine_info"] = machine_info();
  report["params"] = params;
  report["results"] = results;
  report["model"] = model;
  if (!text) return report;
  std::fprintf(text,

      "decode step, one KV head (%d query heads), T=%lld, d=%d, %d steps, %d thread(s), kernels %s, insert batch %d:\n"
      "  rattn  %.3f ms amortised over %zu steps (CPU %.3f ms); per step median %.3f, p90 %.3f, max %.3f\n"
      "  full   %.3f ms mean (CPU %.3f ms), median %.3f\n"
      "  speedup amortised %.1fx (CPU time %.1fx), median %.1fx\n"
      "  rattn without token insertion %.3f ms median (%.1fx)\n"
      "  mean cosine rattn vs full %.6f\n"
      "  rattn step breakdown, ms per step: insert %.3f, search %.3f, top-k attention %.3f, static set %.3f,\n"
      "    prepare %.3f, merge %.3f (total %.3f)\n"
      "modelled %s at %lld tokens (%d layers x %d KV heads = %lld indexes): %.1f ms per token "
      "(full attention %.1f ms), heads one after another\n",
      g, (long long)o.tokens, d, o.steps, threads_used, runtime->kernels_name().c_str(), o.insert_batch, rattn_amort,
      period_steps, rattn_amort_cpu, rattn_med, percentile(rattn_t.wall_ms, 0.9), percentile(rattn_t.wall_ms, 1.0),
      full_mean, full_mean_cpu, full_med, full_mean / rattn_amort, full_mean_cpu / rattn_amort_cpu, full_med / rattn_med,
      no_insert_med, full_med / no_insert_med, cosine, prof.insert_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.search_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.retrieved_attention_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.static_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.prepare_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.merge_ms / double(std::max<int64_t>(1, prof.steps)),
      prof.total_ms / double(std::max<int64_t>(1, prof.steps)), o.model.c_str(), (long long)o.tokens, o.model_layers,
      o.model_kv_heads, (long long)(int64_t(o.model_layers) * o.model_kv_heads * g), rattn_amort * double(kv_steps),
      full_mean * double(kv_steps));
  std::fprintf(text, "  roofline, per step (STREAM triad %.1f GB/s on 1 thread, %.1f GB/s on %d): bytes read, ms, GB/s, "
              "share of triad\n",
              triad1.triad_gbs, triadt.triad_gbs, threads_used);
  for (const RooflinePhase& ph : roofline) {
    if (ph.bytes < 0)
      std::fprintf(text, "    %-20s %12s %9.3f ms\n", ph.name.c_str(), "not counted", ph.ms);
    else
      std::fprintf(text, "    %-20s %9.1f KiB %9.3f ms %7.2f GB/s %5.1f%%\n", ph.name.c_str(), ph.bytes / 1024.0,
                   ph.ms, ph.gb_s, 100.0 * ph.share_of_triad);
  }
  auto print_variant = [&](const char* what, int value, const char* part, const Variant& v) {
    std::fprintf(text, "  with %s = %d: %.3f ms amortised (%.2fx rattn's), %s %.3f ms per step, "
                "mean cosine vs full %.6f (rattn's: %.6f)\n",
                what, value, v.amort, v.amort / rattn_amort, part, v.part_ms, v.cosine, cosine);
  };
  if (seq_tail) print_variant("tail_samples", o.tail_samples, "tail", tail_v);
  if (seq_seeded) print_variant("search_seeds", o.search_seeds, "search", seeded_v);
  if (o.batch > 0)
    std::fprintf(text, "  %d sequences: one by one %.3f ms, decode_batch %.3f ms per step (median; %.2fx), "
                "outputs differ in %lld step(s)\n",
                o.batch, median(one_by_one_t.wall_ms), median(batch_t.wall_ms),
                median(one_by_one_t.wall_ms) / median(batch_t.wall_ms), (long long)batch_mismatches);
  return report;
}

}  // namespace rattn::bench
