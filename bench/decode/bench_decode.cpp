// `rattn bench decode`: the hybrid decode step of one KV head (its GQA group
// of query heads) against full attention on the CPU, in the same run, with the
// same CPU kernels; plus the modelled per-token attention time of a whole
// model (Llama-3-8B by default) on this machine.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/kv_store.h"
#include "runtime/runtime.h"
#include "tools/rattn/commands.h"

namespace rattn::bench {
namespace {

struct Options {
  int64_t tokens = 131072;
  int head_dim = 128;
  int group = 4;
  int steps = 32;
  int64_t sinks = 128;
  int64_t window = 512;
  int64_t top_k = 100;
  int search_queue = 160;
  int graph_degree = 32;
  int query_neighbors = 100;
  double build_sample = 0.05;
  int threads = 1;
  uint64_t seed = 1;
  // The modelled model: layers x KV heads decode steps per token.
  std::string model = "Llama-3-8B";
  int model_layers = 32;
  int model_kv_heads = 8;
  bool json = false;
};

const char* kUsage =
    "usage: rattn bench decode [options] [--json]\n"
    "Times the decode step of one KV head (its group of query heads) for rattn (static set +\n"
    "index search + top-k attention, token insertion included) against full attention over\n"
    "every token, with the same CPU kernels and thread count, on the synthetic OOD set.\n"
    "  --tokens N           context length (default 131072)\n"
    "  --head-dim D         head dimension (default 128)\n"
    "  --group G            query heads per KV head (default 4)\n"
    "  --steps S            decode steps timed (default 32)\n"
    "  --sinks N, --window N, --top-k N, --search-queue L   plan (default 128, 512, 100, 160)\n"
    "  --graph-degree M, --query-neighbors N, --build-sample F   index build (default 32, 100, 0.05)\n"
    "  --threads T          worker threads of the runtime (default 1)\n"
    "  --model-layers N, --model-kv-heads N   model the per-token time (default 32, 8: Llama-3-8B)\n"
    "  --seed S             synthetic data seed (default 1)\n"
    "  --json               print one JSON object (machine_info, parameters, results)\n";

[[noreturn]] void usage_error(const std::string& what) {
  fail(Status::invalid_argument, "rattn bench decode: error: " + what);
}

int64_t parse_int(const std::string& opt, const char* s, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (!*s || *end || v < lo || v > hi)
    usage_error(opt + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                "], got '" + s + "'");
  return v;
}

double parse_real(const std::string& opt, const char* s, double lo, double hi) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (!*s || *end || !(v > lo && v <= hi))
    usage_error(opt + " expects a number in (" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'");
  return v;
}

Options parse(int argc, char** argv, bool* help) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return o;
    }
    if (a == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= argc) usage_error("option '" + a + "' expects a value (see --help)");
    const char* v = argv[++i];
    if (a == "--tokens") o.tokens = parse_int(a, v, 1, int64_t(1) << 31);
    else if (a == "--head-dim") o.head_dim = int(parse_int(a, v, 8, 1024));
    else if (a == "--group") o.group = int(parse_int(a, v, 1, 64));
    else if (a == "--steps") o.steps = int(parse_int(a, v, 1, 100000));
    else if (a == "--sinks") o.sinks = parse_int(a, v, 0, int64_t(1) << 30);
    else if (a == "--window") o.window = parse_int(a, v, 1, int64_t(1) << 30);
    else if (a == "--top-k") o.top_k = parse_int(a, v, 0, 1 << 30);
    else if (a == "--search-queue") o.search_queue = int(parse_int(a, v, 1, 1 << 20));
    else if (a == "--graph-degree") o.graph_degree = int(parse_int(a, v, 1, 1024));
    else if (a == "--query-neighbors") o.query_neighbors = int(parse_int(a, v, 1, 100000));
    else if (a == "--build-sample") o.build_sample = parse_real(a, v, 0.0, 1.0);
    else if (a == "--threads") o.threads = int(parse_int(a, v, 0, 1024));
    else if (a == "--model-layers") o.model_layers = int(parse_int(a, v, 1, 1024));
    else if (a == "--model-kv-heads") o.model_kv_heads = int(parse_int(a, v, 1, 1024));
    else if (a == "--seed") o.seed = uint64_t(parse_int(a, v, 0, int64_t(1) << 62));
    else usage_error("unknown option '" + a + "' (see --help)");
  }
  if (o.tokens <= o.sinks + o.window)
    usage_error("--tokens must exceed sinks + window (" + std::to_string(o.sinks + o.window) + ")");
  return o;
}

// CPU time of the calling thread: with --threads 1 every decode step runs on
// this thread, so the figure does not depend on how busy a shared machine is.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

int run(const Options& o) {
  auto log = [&](const std::string& s) {
    if (!o.json) std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  };
  const int d = o.head_dim, g = o.group;
  SyntheticSpec spec;
  spec.tokens = o.tokens + o.steps;
  spec.head_dim = d;
  spec.group = g;
  spec.seed = o.seed;
  double t0 = now_seconds();
  const SyntheticHead data = make_synthetic(spec);
  log("synthetic OOD set: " + std::to_string(spec.tokens) + " tokens, d=" + std::to_string(d) + ", group " +
      std::to_string(g) + " (" + std::to_string(now_seconds() - t0) + " s)");

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
  config.seed = o.seed;
  auto runtime = std::make_shared<const Runtime>(config);
  Sequence seq(runtime);

  // Prefill: queries packed [group, T, d].
  std::vector<float> q(size_t(g) * size_t(o.tokens) * size_t(d));
  for (int h = 0; h < g; ++h)
    std::memcpy(q.data() + size_t(h) * size_t(o.tokens) * size_t(d), data.query(h, 0),
                size_t(o.tokens) * size_t(d) * sizeof(float));
  t0 = now_seconds();
  seq.prefill(0, o.tokens, q.data(), data.keys.data(), data.values.data(), DType::f32);
  const double prefill_s = now_seconds() - t0;
  q.clear();
  q.shrink_to_fit();
  log("prefill (static set, CPU store, " + std::to_string(g) + " indexes): " + std::to_string(prefill_s) + " s");

  // The same prefilled state without token insertion (the paper's decode,
  // where tokens leaving the window are never indexed): saved and loaded into
  // a runtime with insert_evicted = false, so both start from one build.
  RuntimeConfig no_insert_config = config;
  no_insert_config.insert_evicted = false;
  auto no_insert_runtime = std::make_shared<const Runtime>(no_insert_config);
  const std::string state_path = "/tmp/rattn_bench_decode_" + std::to_string(::getpid()) + ".seq";
  t0 = now_seconds();
  seq.save(state_path);
  std::unique_ptr<Sequence> seq_no_insert = Sequence::load(no_insert_runtime, state_path);
  std::remove(state_path.c_str());
  log("saved and loaded the prefilled state: " + std::to_string(now_seconds() - t0) + " s");

  // Full attention baseline: every token in one fp16 store, the same kernels.
  RowStore all_k(DType::f16, d), all_v(DType::f16, d);
  all_k.reserve(spec.tokens);
  all_v.reserve(spec.tokens);
  all_k.append_f32(data.keys.data(), o.tokens);
  all_v.append_f32(data.values.data(), o.tokens);

  CpuKernels& kernels = runtime->kernels();
  std::vector<float> qt(size_t(g) * size_t(d)), out_rattn(qt.size()), out_full(qt.size()), lse(static_cast<size_t>(g));
  std::vector<double> rattn_ms, full_ms, rattn_cpu_ms, full_cpu_ms, no_insert_ms, no_insert_cpu_ms;
  double cos_sum = 0;
  for (int s = 0; s < o.steps; ++s) {
    const int64_t t = o.tokens + s;
    for (int h = 0; h < g; ++h) std::memcpy(qt.data() + size_t(h) * size_t(d), data.query(h, t), size_t(d) * sizeof(float));
    const float* k = data.keys.data() + size_t(t) * size_t(d);
    const float* v = data.values.data() + size_t(t) * size_t(d);
    t0 = now_seconds();
    double c0 = thread_cpu_seconds();
    seq.decode(0, qt.data(), k, v, DType::f32, out_rattn.data(), lse.data());
    rattn_ms.push_back(1e3 * (now_seconds() - t0));
    rattn_cpu_ms.push_back(1e3 * (thread_cpu_seconds() - c0));
    t0 = now_seconds();
    c0 = thread_cpu_seconds();
    seq_no_insert->decode(0, qt.data(), k, v, DType::f32, out_full.data(), lse.data());
    no_insert_ms.push_back(1e3 * (now_seconds() - t0));
    no_insert_cpu_ms.push_back(1e3 * (thread_cpu_seconds() - c0));
    // Full attention: append the token, attend over all of them (the whole group in one call).
    t0 = now_seconds();
    c0 = thread_cpu_seconds();
    all_k.append_f32(k, 1);
    all_v.append_f32(v, 1);
    kernels.dense_attention(qt.data(), g, all_k.view(), all_v.view(), 0, all_k.rows(), out_full.data(), lse.data());
    full_ms.push_back(1e3 * (now_seconds() - t0));
    full_cpu_ms.push_back(1e3 * (thread_cpu_seconds() - c0));
    for (int h = 0; h < g; ++h) {
      double ab = 0, aa = 0, bb = 0;
      for (int j = 0; j < d; ++j) {
        const double a = out_rattn[size_t(h * d + j)], b = out_full[size_t(h * d + j)];
        ab += a * b;
        aa += a * a;
        bb += b * b;
      }
      cos_sum += ab / std::sqrt(aa * bb + 1e-300);
    }
  }
  const double rattn_med = median(rattn_ms), full_med = median(full_ms);
  const double speedup = full_med / rattn_med;
  const double rattn_cpu_med = median(rattn_cpu_ms), full_cpu_med = median(full_cpu_ms);
  const double speedup_cpu = full_cpu_med / rattn_cpu_med;
  const double no_insert_med = median(no_insert_ms), no_insert_cpu_med = median(no_insert_cpu_ms);
  const double cosine = cos_sum / (double(o.steps) * g);
  const MemoryStats mem = seq.memory();
  // Modelled per-token attention time: every (layer, KV head) runs one such
  // step; heads one after another with this run's thread count.
  const int64_t kv_steps = int64_t(o.model_layers) * o.model_kv_heads;
  const double model_serial_ms = rattn_med * double(kv_steps);
  const double model_full_ms = full_med * double(kv_steps);
  const int threads_used = runtime->pool().threads();

  boost::json::object params;
  params["tokens"] = o.tokens;
  params["head_dim"] = d;
  params["group"] = g;
  params["steps"] = o.steps;
  params["sinks"] = o.sinks;
  params["window"] = o.window;
  params["top_k"] = o.top_k;
  params["search_queue"] = o.search_queue;
  params["graph_degree"] = o.graph_degree;
  params["query_neighbors"] = o.query_neighbors;
  params["build_sample"] = o.build_sample;
  params["threads"] = threads_used;
  params["kv_storage"] = "f16";
  params["cpu_kernels"] = runtime->kernels_name();
  params["seed"] = o.seed;
  boost::json::object results;
  results["prefill_s"] = prefill_s;
  results["rattn_step_ms_median"] = rattn_med;
  results["rattn_step_ms_mean"] = mean(rattn_ms);
  results["full_step_ms_median"] = full_med;
  results["full_step_ms_mean"] = mean(full_ms);
  results["speedup_full_over_rattn"] = speedup;
  // Thread CPU time (meaningful with --threads 1, where the step runs on the timing thread).
  results["rattn_step_cpu_ms_median"] = rattn_cpu_med;
  results["full_step_cpu_ms_median"] = full_cpu_med;
  results["speedup_cpu_time"] = speedup_cpu;
  // The step without inserting the token that leaves the window.
  results["rattn_no_insert_step_ms_median"] = no_insert_med;
  results["rattn_no_insert_step_cpu_ms_median"] = no_insert_cpu_med;
  results["speedup_no_insert"] = full_med / no_insert_med;
  results["speedup_no_insert_cpu_time"] = full_cpu_med / no_insert_cpu_med;
  results["mean_cosine_rattn_vs_full"] = cosine;
  results["cpu_kv_bytes"] = mem.cpu_kv_bytes;
  results["index_bytes"] = mem.index_bytes;
  boost::json::object model;
  model["name"] = o.model;
  model["context"] = o.tokens;
  model["layers"] = o.model_layers;
  model["kv_heads"] = o.model_kv_heads;
  model["indexes"] = int64_t(o.model_layers) * o.model_kv_heads * g;
  model["per_token_attention_ms_rattn"] = model_serial_ms;
  model["per_token_attention_ms_full"] = model_full_ms;
  model["per_token_attention_ms_rattn_cpu_time"] = rattn_cpu_med * double(kv_steps);
  model["per_token_attention_ms_full_cpu_time"] = full_cpu_med * double(kv_steps);
  model["per_token_attention_ms_rattn_no_insert_cpu_time"] = no_insert_cpu_med * double(kv_steps);
  model["assumption"] =
      "per-KV-head step median x layers x KV heads, heads run one after another with " +
      std::to_string(threads_used) + " thread(s) as measured; ideal scaling over c cores divides by c";
  boost::json::object report;
  report["benchmark"] = "decode";
  report["machine_info"] = machine_info();
  report["params"] = params;
  report["results"] = results;
  report["model"] = model;
  if (o.json) {
    std::fputs(to_pretty_json(report).c_str(), stdout);
    return 0;
  }
  std::printf(
      "decode step, one KV head (%d query heads), T=%lld, d=%d, %d steps, %d thread(s), kernels %s:\n"
      "  rattn  %.3f ms (median; mean %.3f)\n"
      "  full   %.3f ms (median; mean %.3f)\n"
      "  rattn without token insertion %.3f ms (thread CPU %.3f ms)\n"
      "  speedup %.1fx (thread CPU time: rattn %.3f ms, full %.3f ms, %.1fx), mean cosine rattn vs full %.6f\n"
      "modelled %s at %lld tokens (%d layers x %d KV heads = %lld indexes): %.1f ms per token "
      "(full attention %.1f ms), heads one after another\n",
      g, (long long)o.tokens, d, o.steps, threads_used, runtime->kernels_name().c_str(), rattn_med,
      mean(rattn_ms), full_med, mean(full_ms), no_insert_med, no_insert_cpu_med, speedup, rattn_cpu_med, full_cpu_med, speedup_cpu, cosine, o.model.c_str(), (long long)o.tokens,
      o.model_layers, o.model_kv_heads, (long long)(int64_t(o.model_layers) * o.model_kv_heads * g),
      model_serial_ms, model_full_ms);
  return 0;
}

}  // namespace
}  // namespace rattn::bench

int rattn::cli::bench_decode_main(int argc, char** argv) {
  bool help = false;
  const rattn::bench::Options o = rattn::bench::parse(argc, argv, &help);
  if (help) {
    std::fputs(rattn::bench::kUsage, stdout);
    return 0;
  }
  return rattn::bench::run(o);
}
