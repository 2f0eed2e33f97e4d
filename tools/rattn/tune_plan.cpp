// `rattn tune MODEL.ra (--calib DIR... | --synthetic) [--gpu G] ... -o OUT/`:
// the autotuning pass per hardware (autotune/plan_tuner.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "autotune/emit_library.h"
#include "autotune/plan_measure.h"
#include "autotune/plan_tuner.h"
#include "autotune/search_tuner.h"
#include "autotune/tune_report.h"
#include "autotune/tuning_db.h"
#include "bench/bench_util.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "dsl/dsl.h"
#include "runtime/data/synthetic_docs.h"
#include "tools/rattn/args.h"
#include "tools/rattn/commands.h"
#include "tools/rattn/tune_model_check.h"
#include "models/engine/text_util.h"

namespace rattn::cli {
namespace {

constexpr const char* kUsage =
    "usage: rattn tune MODEL.ra (--calib DIR... | --synthetic) -o OUT/ [options]\n"
    "\n"
    "The autotuning pass for a CPU/GPU pair: picks the static set (window, top_k) and each\n"
    "layer's decode search with the lowest per-token decode time of the whole model at the\n"
    "deployment context, under two accuracy constraints per layer: recall@top_k and the\n"
    "attention output's relative L2 error against full attention, chosen on tuning queries\n"
    "and reported on held-out ones. CPU parts are timed on this machine; the GPU's static set\n"
    "is timed on the GPU when the target is present, else predicted (docs/autotune.md).\n"
    "Writes OUT/tuned.ra, OUT/tuned.json, OUT/report.md and the deployable library of the\n"
    "tuned plan (OUT/lib/librattn_<model>.so, OUT/include, CMake and pkg-config files;\n"
    "docs/deploy.md); prints the summary line.\n"
    "Exit status 0 when the choice meets the constraints on the held-out queries (and passes\n"
    "the model check when asked for), 3 when not (or no candidate met them), 1 on an error,\n"
    "2 on a usage error.\n"
    "\n"
    "options:\n"
    "  --calib DIR           calibration data (rattn capture) of MODEL's model; given more\n"
    "                        than once, each set is measured and every layer's setting must\n"
    "                        serve them all (the time grows with the sets)\n"
    "  --synthetic           the synthetic generator instead (one KV head per sampled layer)\n"
    "  --distribution D      with --synthetic: topics (default) or documents (docs/data.md)\n"
    "  --context N           the deployment context (default: the shortest set's; synthetic: the\n"
    "                        model's, at most 131072)\n"
    "  --gpu G               none, an arch (sm_80, sm_86, sm_89, sm_90) or a GPU (a100-40gb,\n"
    "                        a100-80gb, rtx3090, rtx4090, l4, h100-sxm, h100-pcie, h200,\n"
    "                        gh200), or auto: the GPU present, else none (default: the\n"
    "                        plan's target)\n"
    "  --threads N           CPU threads of the deployment (default 2)\n"
    "  --min-recall R        recall@top_k per layer (default 0.95)\n"
    "  --recall-k K          ... counted over the best min(top_k, K) keys, so that a large top_k is\n"
    "                        judged by how it finds the heaviest keys (default: all top_k)\n"
    "  --confidence C        ... met on the tuning queries at this one-sided confidence:\n"
    "                        the mean less z(C) standard errors (default 0.95; 0.5: the mean)\n"
    "  --max-output-error E  mean relative L2 output error per layer (default: the paper's\n"
    "                        plan's own error on that layer, measured in the same run)\n"
    "  --max-output-error-p95 E  also the 95th percentile of a layer's per-step errors\n"
    "                        (test queries x heads) at most E (default: no bound)\n"
    "  --kv-storage T        f16, bf16 or f32: the dtype the deployment's runtime stores K/V in\n"
    "                        (the C API's kv_storage; default f16, the runtime's default, not\n"
    "                        the model's kv_dtype); errors and times are measured with it\n"
    "  --queries N           test queries per head: the last N tokens (default 256)\n"
    "  --holdout H           share held out for validation, 0.5 or 0 (default 0.5)\n"
    "  --holdout-block N     consecutive queries per block (default 32)\n"
    "  --sample-layers N     global layers measured, evenly spaced (default 2)\n"
    "  --sample-kv-heads N   KV heads measured per sampled layer (calib; default 1)\n"
    "  --sample-q-heads N    query heads measured per sampled KV head (default: its group)\n"
    "  --sequences N         sequences whose static sets share the GPU (default 1)\n"
    "  --gpu-memory GIB      GPU memory for the static sets (default: 90% of the card's\n"
    "                        less an estimate of the weights)\n"
    "  --minutes M           stop measuring more layers after M minutes; the rest take the\n"
    "                        nearest measured layer's figures (default: no limit)\n"
    "  --db PATH             the tuning database (default $RATTN_TUNE_DB, else\n"
    "                        <kernel cache>/tune.jsonl); --no-db: none\n"
    "  --build               also search the index build recipe: every setting of the plan's\n"
    "                        graph_degree, query_neighbors, build_sample, key_metric,\n"
    "                        traversal_codes, code_dims, shift_queries and shared_graph domains,\n"
    "                        by successive halving (screened on one layer, the better half on\n"
    "                        every sampled layer, --build-finalists measured fully); the\n"
    "                        lowest per-token time wins (ties: less index memory)\n"
    "  --build-finalists N   recipes measured fully (default 2)\n"
    "  --max-index-memory R  with --build: recipes whose indexes need more than R x the\n"
    "                        offloaded KV bytes (the memory plan's estimate) are excluded\n"
    "  --engine-check N      --gpu none: time the runtime's own decode step (one KV head's\n"
    "                        group, prefilled with the sampled layer's data, caches flushed\n"
    "                        before each step) for the N candidates the time model ranks\n"
    "                        fastest, then for each new choice until the chosen one is\n"
    "                        measured; measured layers replace the model's times (default 0)\n"
    "  --model-check N       the model in the loop (a Gemma-3 GGUF the reference engine runs):\n"
    "                        the chosen candidate's whole plan decodes the last --check-positions\n"
    "                        tokens of each --check-text teacher-forced, against full attention\n"
    "                        from the same prefill; a candidate whose greedy next tokens or\n"
    "                        perplexity miss the bounds is excluded and the next\n"
    "                        choice is checked, at most N candidates (default 0: off)\n"
    "  --check-gguf FILE     the model (default $RATTN_GEMMA_GGUF)\n"
    "  --check-text FILE     a check text (repeatable; needed with --model-check): a text the\n"
    "                        choice is made on, such as the calibration's, never one it is\n"
    "                        later validated on\n"
    "  --check-positions S   scored positions per text (default 512)\n"
    "  --check-tokens N      each text's context in tokens (default: the deployment context)\n"
    "  --min-agreement A     greedy agreement with full attention, pooled over the texts, met\n"
    "                        at --check-confidence (Wilson's lower bound; default 0.99)\n"
    "  --check-confidence C  default: --confidence's; 0.5: the pooled rate itself\n"
    "  --max-perplexity-change P  |perplexity ratio - 1| on every text (default 0.01)\n"
    "  --check-reference FILE.ra  a plan the candidates must be about as accurate as (e.g.\n"
    "                        the one deployed today): its KL divergence from full attention's\n"
    "                        next-token distribution, mean over every text's positions, times\n"
    "                        --max-kl-ratio (default 1.5) bounds each candidate's\n"
    "  --seed S              synthetic data seed (default 1)\n"
    "  -o, --out DIR         where the results go (created)\n"
    "  --no-library          do not emit the deployable library\n"
    "  --gpu-model-check     only time the static set on the GPU present for the plan's windows\n"
    "                        (every kernel variant the pass searches; 2, 8 and 32 splits with\n"
    "                        4 and 8 warps; the runtime's splits with 8 warps)\n"
    "                        against the GPU time model; prints the table, writes\n"
    "                        OUT/gpu_model_check.json\n"
    "  --quiet               no progress on stderr\n";

[[noreturn]] void usage_error(const std::string& msg) {
  usage_fail("rattn tune: error: " + msg + " (see rattn tune --help)");
}

double parse_real(const std::string& s, const std::string& opt, double lo, double hi) {
  const double v = real_arg("rattn tune", opt, s);
  if (!(v >= lo && v <= hi))
    usage_error(opt + " expects a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'");
  return v;
}

// --gpu-model-check: the static set timed on the GPU present against the
// model's prediction, per window of the plan and kernel variant.
int gpu_model_check_main(const Program& program, const std::string& out_dir, bool quiet) {
  const HardwareFingerprint f = host_fingerprint();
  const GpuSpec* gpu = f.gpu == "none" ? nullptr : gpu_spec_for_device(f.gpu);
  if (!gpu)
    fail(Status::unsupported, "tune: --gpu-model-check needs a GPU the model knows; present: " + f.gpu);
  std::vector<GpuKernelVariant> variants = gpu_kernel_variants(program);
  for (int splits : {2, 8, 32})
    for (int warps : {4, 8})
      variants.push_back(GpuKernelVariant{{{"cuda.splits", double(splits)}, {"cuda.warps", double(warps)}}});
  variants.push_back(GpuKernelVariant{{{"cuda.splits", 0}, {"cuda.warps", 8}}});
  std::vector<std::map<std::string, double>> knobs;
  for (const GpuKernelVariant& v : variants) knobs.push_back(v.knobs);
  const int64_t sinks = int64_t(program.plan.sinks.default_value());
  std::vector<int64_t> windows;
  for (double w : program.plan.window.candidates())
    if (int64_t(w) + sinks <= program.model.max_context) windows.push_back(int64_t(w));
  auto say = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "rattn tune: %s\n", s.c_str());
  };
  const auto measured = measure_gpu_static_set(program.model, sinks, windows, knobs, say);
  if (measured.empty()) fail(Status::unsupported, "tune: --gpu-model-check: the GPU could not be used");
  std::printf("GPU %s (model: %s); %d KV heads x head_dim %d, group %d\n%s", f.gpu.c_str(), gpu->name.c_str(),
              program.model.num_kv_heads, program.model.head_dim, program.model.group_size(),
              gpu_model_check_table(*gpu, program.model, variants, measured).c_str());
  boost::json::object doc{{"gpu", f.gpu}, {"model_entry", gpu->name}, {"fingerprint", f.text()},
                          {"check", gpu_model_check_json(*gpu, program.model, variants, measured)}};
  write_file_atomic(out_dir + "/gpu_model_check.json", bench::to_pretty_json(doc) + "\n");
  return 0;
}

}  // namespace

int tune_plan_main(int argc, char** argv) {
  std::string model_path, out_dir, gpu;
  PlanTuneOptions opt;
  bool quiet = false, no_db = false, library = true, gpu_model_check = false;
  ModelCheckConfig check;
  double check_confidence = 0;  // 0: --confidence's
  double minutes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--calib") {
      opt.calib_dirs.push_back(value());
    } else if (a == "--synthetic") {
      opt.synthetic = true;
    } else if (a == "--distribution") {
      opt.distribution = value();
      if (!is_synthetic_distribution(opt.distribution))
        usage_error("--distribution expects topics or documents, got '" + opt.distribution + "'");
    } else if (a == "--context") {
      opt.context = int_arg("rattn tune", a, value(), 1, int64_t(1) << 30);
    } else if (a == "--gpu") {
      gpu = value();
    } else if (a == "--threads") {
      opt.threads = int(int_arg("rattn tune", a, value(), 1, 1024));
    } else if (a == "--min-recall") {
      opt.min_recall = parse_real(value(), a, 0, 1);
    } else if (a == "--recall-k") {
      opt.recall_k = int(int_arg("rattn tune", a, value(), 1, 1 << 20));
    } else if (a == "--confidence") {
      opt.confidence = parse_real(value(), a, 0.5, 0.999999);
    } else if (a == "--max-output-error") {
      opt.max_output_error = parse_real(value(), a, 1e-9, 10);
    } else if (a == "--max-output-error-p95") {
      opt.max_output_error_p95 = parse_real(value(), a, 1e-9, 10);
    } else if (a == "--kv-storage") {
      const std::string v = value();
      if (!parse_dtype(v, &opt.kv_storage))
        usage_error("--kv-storage must be f16, bf16 or f32, not '" + v + "'");
    } else if (a == "--queries") {
      opt.test_queries = int(int_arg("rattn tune", a, value(), 2, 1 << 20));
    } else if (a == "--holdout") {
      const std::string v = value();
      if (v == "0") opt.holdout = 0;
      else if (v == "0.5") opt.holdout = 0.5;
      else usage_error("--holdout expects 0.5 or 0, got '" + v + "'");
    } else if (a == "--holdout-block") {
      opt.holdout_block = int(int_arg("rattn tune", a, value(), 1, 1 << 20));
    } else if (a == "--sample-layers") {
      opt.sample_layers = int(int_arg("rattn tune", a, value(), 1, 4096));
    } else if (a == "--engine-check") {
      opt.engine_check = int(int_arg("rattn tune", a, value(), 0, 64));
    } else if (a == "--sample-q-heads") {
      opt.sample_q_heads = int(int_arg("rattn tune", a, value(), 1, 4096));
    } else if (a == "--sample-kv-heads") {
      opt.sample_kv_heads = int(int_arg("rattn tune", a, value(), 1, 4096));
    } else if (a == "--sequences") {
      opt.sequences = int(int_arg("rattn tune", a, value(), 1, 1 << 20));
    } else if (a == "--gpu-memory") {
      opt.gpu_memory_gib = parse_real(value(), a, 1e-3, 1e6);
    } else if (a == "--minutes") {
      minutes = parse_real(value(), a, 1e-3, 1e6);
    } else if (a == "--db") {
      opt.db_path = value();
    } else if (a == "--no-db") {
      no_db = true;
    } else if (a == "--build") {
      opt.search_build = true;
    } else if (a == "--build-finalists") {
      opt.build_finalists = int(int_arg("rattn tune", a, value(), 1, 1 << 20));
    } else if (a == "--max-index-memory") {
      opt.max_index_memory = parse_real(value(), a, 1e-9, 1e6);
    } else if (a == "--model-check") {
      opt.model_check = int(int_arg("rattn tune", a, value(), 0, 64));
    } else if (a == "--check-gguf") {
      check.gguf = value();
    } else if (a == "--check-text") {
      check.texts.push_back(value());
    } else if (a == "--check-positions") {
      check.positions = int_arg("rattn tune", a, value(), 1, 1 << 20);
    } else if (a == "--check-tokens") {
      check.tokens = int_arg("rattn tune", a, value(), 2, int64_t(1) << 30);
    } else if (a == "--min-agreement") {
      check.min_agreement = parse_real(value(), a, 0, 1);
    } else if (a == "--check-confidence") {
      check_confidence = parse_real(value(), a, 0.5, 0.999999);
    } else if (a == "--check-reference") {
      check.reference_plan = value();
    } else if (a == "--max-kl-ratio") {
      check.max_kl_ratio = parse_real(value(), a, 1e-6, 1e6);
    } else if (a == "--max-perplexity-change") {
      check.max_perplexity_change = parse_real(value(), a, 0, 10);
    } else if (a == "--seed") {
      opt.seed = uint64_t(int_arg("rattn tune", a, value(), 0, int64_t(1) << 62));
    } else if (a == "-o" || a == "--out") {
      out_dir = value();
    } else if (a == "--no-library") {
      library = false;
    } else if (a == "--gpu-model-check") {
      gpu_model_check = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (!a.empty() && a[0] != '-' && model_path.empty()) {
      model_path = a;
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (model_path.empty()) usage_error("expects MODEL.ra");
  if (!gpu_model_check && opt.synthetic == !opt.calib_dirs.empty())
    usage_error("expects --calib DIR (once or more) or --synthetic");
  if (opt.distribution != "topics" && !opt.synthetic) usage_error("--distribution needs --synthetic");
  if (out_dir.empty()) usage_error("expects -o OUT/");
  if (opt.max_index_memory > 0 && !opt.search_build) usage_error("--max-index-memory needs --build");
  if (opt.model_check > 0 && check.texts.empty()) usage_error("--model-check needs --check-text FILE (once or more)");
  if (opt.model_check == 0 && !check.texts.empty()) usage_error("--check-text needs --model-check N");
  if (opt.model_check == 0 && !check.reference_plan.empty()) usage_error("--check-reference needs --model-check N");
  if (check.tokens > 0 && check.tokens <= check.positions)
    usage_error("--check-tokens must exceed --check-positions");
  opt.minutes = minutes;
  if (!no_db && opt.db_path.empty()) opt.db_path = default_tuning_db_path();
  // A tune takes minutes: an output it could not write is refused first.
  {
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    if (ec || !std::filesystem::is_directory(out_dir) || ::access(out_dir.c_str(), W_OK) != 0)
      usage_error("-o " + out_dir + ": cannot create or write this directory");
  }
  const Program program = load_program(model_path);
  if (gpu.empty()) gpu = program.target.gpu_arch;
  if (gpu == "auto") {
    const HardwareFingerprint f = host_fingerprint();
    const GpuSpec* present = f.gpu == "none" ? nullptr : gpu_spec_for_device(f.gpu);
    if (f.gpu != "none" && !present)
      fail(Status::invalid_argument, "tune: --gpu auto: the GPU model does not know " + f.gpu + "; name a --gpu");
    gpu = present ? present->key : "none";
  }
  if (gpu != "none") (void)find_gpu_spec(gpu);  // an unknown name fails before any work
  opt.gpu = gpu;
  if (gpu_model_check) return gpu_model_check_main(program, out_dir, quiet);
  if (opt.model_check > 0) {
    if (check.gguf.empty() && !std::getenv("RATTN_GEMMA_GGUF"))
      usage_error("--model-check needs --check-gguf FILE (or RATTN_GEMMA_GGUF; scripts/get-gemma installs the model)");
    check.gguf = engine::resolve_gguf_path(check.gguf, "tune");
    if (!check.reference_plan.empty()) (void)load_program(check.reference_plan);
    check.threads = opt.threads;
    check.confidence = check_confidence > 0 ? check_confidence : opt.confidence;
    check.kv_storage = opt.kv_storage == DType::f32 ? RATTN_F32 : opt.kv_storage == DType::bf16 ? RATTN_BF16 : RATTN_F16;
    const int64_t pooled = check.positions * int64_t(check.texts.size());
    if (most_misses_allowed(pooled, check.min_agreement, check.confidence) < 0)
      usage_error(std::to_string(pooled) + " checked positions cannot show an agreement of " +
                  std::to_string(check.min_agreement) + " at confidence " + std::to_string(check.confidence) +
                  " even with none missed: more --check-positions or --check-text");
    opt.model_check_scope = model_check_scope(check);  // reads every text: an unreadable one is refused here
    opt.check_model = make_model_check(check);
  }

  Progress bar("rattn tune", 1.0, quiet ? nullptr : stderr);
  opt.log = [&](const std::string& s) {
    if (!quiet && (s.find("database") != std::string::npos || s.find("GPU") != std::string::npos ||
                   s.rfind("model check", 0) == 0))
      bar.note(s);
  };
  opt.progress = [&](double done, double total, const std::string& now) { bar.advance(done / total - bar.done(), now); };

  TuningRun t = tune_plan(program, opt);
  // The same measurements (under the chosen build recipe) chosen for the
  // other usual targets.
  const Program measured = measured_program(program, t);
  std::vector<TuningRun> others;
  for (const char* target : {"none", "sm_80", "sm_89", "sm_90"}) {
    if (target == gpu || (t.gpu && t.gpu->arch == target && std::string(target) != "none")) continue;
    PlanTuneOptions o = opt;
    o.gpu = target;
    TuningRun other = t;
    choose_plan(measured, o, &other);
    others.push_back(std::move(other));
  }
  const std::string summary = plan_tuning_summary(t);
  bar.finish(t.chosen >= 0 ? "done" : "no plan met the constraints");

  const Program tuned = apply_plan_choice(program, t);
  const std::string tuned_text = "# Tuned by `rattn tune` from " + model_path + " for " + t.target + ", " +
                                 std::to_string(opt.threads) + " CPU threads, at " + std::to_string(t.context) +
                                 " tokens\n" + format_program(tuned);
  write_file_atomic(out_dir + "/tuned.ra", tuned_text);
  write_file_atomic(out_dir + "/tuned.json", bench::to_pretty_json(plan_tuning_json(program, opt, t)) + "\n");
  write_file_atomic(out_dir + "/report.md", plan_tuning_report(program, opt, t, others));
  std::printf("%s\n", summary.c_str());
  if (t.chosen >= 0 && t.chosen_recipe >= 0)
    std::printf("rattn tune: build recipe %s (of %zu, index memory %.3f of the offloaded KV)\n",
                t.recipes[size_t(t.chosen_recipe)].recipe.text().c_str(), t.recipes.size(),
                t.recipes[size_t(t.chosen_recipe)].memory_ratio);
  std::printf("rattn tune: wrote %s/tuned.ra, tuned.json, report.md\n", out_dir.c_str());
  if (library && t.chosen >= 0) {
    EmitLibraryOptions lo;
    lo.out_dir = out_dir;
    lo.gpu_arch = t.gpu ? t.gpu->arch : "none";
    if (!quiet) lo.log = [&](const std::string& s) { std::fprintf(stderr, "rattn tune: %s\n", s.c_str()); };
    const EmitLibraryResult lib = emit_deployable_library(tuned, tuned_text, lo);
    std::printf("rattn tune: wrote %s (the tuned plan, kernels:", lib.library.c_str());
    for (const std::string& k : lib.kernel_sets) std::printf(" %s;", k.c_str());
    std::printf(" %zu GPU modules)\n", lib.gpu_modules.size());
  }
  return t.chosen >= 0 && t.validation_met && t.model_check_met ? 0 : 3;
}

}  // namespace rattn::cli
