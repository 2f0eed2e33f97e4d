// `rattn emit FILE.ra --target cuda ...`: prints the CUDA kernels of a model,
// optionally compiles them with NVRTC (PTX / CUBIN files, timings).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "codegen/cuda/knn_kernel.h"
#include "codegen/cuda/model_kernels.h"
#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "tools/rattn/args.h"
#include "tools/rattn/commands.h"

namespace rattn::cuda {
namespace {

const char* kUsage =
    "usage: rattn emit FILE.ra --target cuda [options]\n"
    "       rattn emit --target cuda --synthetic --head-dim N --group-size G [options]\n"
    "Prints the CUDA C++ decode-attention kernels of the model (partial attention of\n"
    "every query head of a GQA group over sinks + recent window, flash-decoding\n"
    "split, merge kernel; lse in natural log).\n"
    "  --arch sm_XX          GPU arch (default: the program's target, else sm_90)\n"
    "  --layout L            contiguous, paged or both (default both)\n"
    "  --page N              tokens per page for the paged layout (default 16)\n"
    "  --knob cuda.K=V       override a kernel knob (tile, warps, splits, vec, stages)\n"
    "  --head-dim N, --group-size G, --kv-dtype f16|bf16   override the model's shape\n"
    "                        (N and G at least 1)\n"
    "  --synthetic           no FILE.ra: a one-layer model from the flags above\n"
    "  --print-ir-after-all  print the kernel IR after every lowering pass\n"
    "  --ptx OUT.ptx         compile with NVRTC and write the PTX (a second module\n"
    "                        goes to OUT.paged.ptx)\n"
    "  --cubin OUT.cubin     likewise for the CUBIN\n"
    "  --cache-dir DIR       NVRTC disk cache (default $RATTN_CUDA_CACHE or ~/.cache/rattn/cuda)\n"
    "  --time                cold-compile every module into a fresh cache (or into\n"
    "                        --cache-dir DIR when given), then load them warm; prints\n"
    "                        one JSON object instead of the text\n"
    "  --knn K               instead: the index build's training-query kNN kernel\n"
    "                        (top-K keys by inner product; K in [1, 256]) for the\n"
    "                        model's head_dim (or --head-dim); --ptx/--cubin compile it\n";

[[noreturn]] void usage_error(const std::string& msg) {
  usage_fail("rattn emit --target cuda: error: " + msg);
}

int parse_int(const std::string& flag, const char* v) {
  const std::optional<int64_t> x = cli::to_int(v);
  if (!x || *x < -1000000 || *x > 1000000) usage_error(flag + " expects an integer (got '" + v + "')");
  return int(*x);
}

// --head-dim and --group-size: 0 or less would read as "not given".
int parse_positive(const std::string& flag, const char* v) {
  const int x = parse_int(flag, v);
  if (x < 1) usage_error(flag + " must be at least 1 (got '" + v + "')");
  return x;
}

std::string with_suffix(const std::string& path, const std::string& layout_tag) {
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return path + "." + layout_tag;
  return path.substr(0, dot) + "." + layout_tag + path.substr(dot);
}

// CPU seconds (user + system, all threads) of this process so far: unlike wall
// time, barely affected by other load on a shared machine.
double cpu_s() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace
}  // namespace rattn::cuda

int rattn::cli::emit_cuda_main(int argc, char** argv) {
  using namespace rattn::cuda;
  std::string file, arch, layout = "both", ptx_out, cubin_out, cache_dir, kv_dtype;
  int page = 16, head_dim = 0, group_size = 0, knn_k = 0;  // 0: the model's; knn_k 0: attention kernels
  bool synthetic = false, ir_after_all = false, timing = false;
  std::vector<std::pair<std::string, double>> knobs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(a + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--arch") arch = value();
    else if (a == "--layout") layout = value();
    else if (a == "--page") page = parse_int(a, value());
    else if (a == "--ptx") ptx_out = value();
    else if (a == "--cubin") cubin_out = value();
    else if (a == "--cache-dir") cache_dir = value();
    else if (a == "--head-dim") head_dim = parse_positive(a, value());
    else if (a == "--group-size") group_size = parse_positive(a, value());
    else if (a == "--kv-dtype") kv_dtype = value();
    else if (a == "--synthetic") synthetic = true;
    else if (a == "--knn") knn_k = parse_positive(a, value());
    else if (a == "--print-ir-after-all") ir_after_all = true;
    else if (a == "--time") timing = true;
    else if (a == "--knob") {
      const std::string kv = value();
      const auto eq = kv.find('=');
      if (eq == std::string::npos || kv.rfind("cuda.", 0) != 0)
        usage_error("--knob expects cuda.NAME=VALUE (got '" + kv + "')");
      char* end = nullptr;
      const double v = std::strtod(kv.c_str() + eq + 1, &end);
      if (eq + 1 == kv.size() || *end) usage_error("--knob " + kv + ": the value is not a number");
      knobs.emplace_back(kv.substr(0, eq), v);
    } else if (!a.empty() && a[0] == '-') {
      usage_error("unknown option '" + a + "' (see --help)");
    } else if (file.empty()) {
      file = a;
    } else {
      usage_error("more than one input file ('" + file + "' and '" + a + "')");
    }
  }
  if (file.empty() && !synthetic) usage_error("expected FILE.ra (or --synthetic)");
  if (layout != "contiguous" && layout != "paged" && layout != "both")
    usage_error("--layout must be contiguous, paged or both (got '" + layout + "')");
  DType parsed_dtype{};
  if (!kv_dtype.empty() && !parse_dtype(kv_dtype, &parsed_dtype))
    usage_error("--kv-dtype must be f16 or bf16 (got '" + kv_dtype + "')");

  Program program;
  if (synthetic) {
    program.model.name = "synthetic";
    program.model.num_layers = 1;
    program.model.head_dim = 128;
    program.model.num_kv_heads = 1;
    program.model.num_q_heads = 1;
    program.path = "<synthetic>";
  } else {
    program = load_program(file);
  }
  if (head_dim) program.model.head_dim = head_dim;
  if (group_size) {
    program.model.num_kv_heads = 1;
    program.model.num_q_heads = group_size;
  }
  if (!kv_dtype.empty()) program.model.kv_dtype = parsed_dtype;
  ConcretePlan plan = default_concrete_plan(program.plan);
  for (const auto& [k, v] : knobs) plan.kernel[k] = v;
  if (arch.empty()) arch = program.target.has_gpu() ? program.target.gpu_arch : "sm_90";

  if (knn_k > 0) {
    KnnKernelParams kp = default_knn_params(program.model.head_dim, knn_k);
    kp.arch = arch;
    const GeneratedKnn g = generate_knn_kernel(kp);
    std::fputs(g.source.c_str(), stdout);
    if (!ptx_out.empty() || !cubin_out.empty()) {
      CompileOptions copt;
      copt.arch = arch;
      const CompiledModule c = nvrtc_compile(g.name, g.source, copt);
      if (!ptx_out.empty()) write_file_atomic(ptx_out, c.ptx);
      if (!cubin_out.empty()) write_file_atomic(cubin_out, c.cubin);
    }
    return 0;
  }

  std::string ir_dump;
  PassObserver observer;
  if (ir_after_all)
    observer = [&](const std::string& pass, const KernelModule& m) {
      ir_dump += "// -- IR after " + pass + " --\n" + print_ir(m);
    };
  std::vector<KvLayout> layouts;
  if (layout != "paged") layouts.push_back(KvLayout::contiguous);
  if (layout != "contiguous") layouts.push_back(KvLayout::paged);
  const std::vector<GeneratedModule> modules =
      generate_model_kernels(program, plan, arch, page, observer, layouts);

  CompileOptions copt;
  copt.arch = arch;
  if (timing) {
    namespace fs = std::filesystem;
    std::string dir = cache_dir;
    bool temp = false;
    if (dir.empty()) {
      dir = (fs::temp_directory_path() / ("rattn-emit-time-" + std::to_string(::getpid()))).string();
      temp = true;
    }
    KernelCache cache(dir);
    const double t0 = seconds_now(), c0 = cpu_s();
    int compiled = 0;
    for (const auto& c : compile_modules(cache, modules, copt)) compiled += !c.from_cache;
    const double cold = seconds_now() - t0, cold_cpu = cpu_s() - c0;
    const double t1 = seconds_now();
    for (const auto& g : modules) cache.get_or_compile(g.module.name, g.source, copt);
    const double warm = seconds_now() - t1;
    std::printf(
        "{\"model\": \"%s\", \"arch\": \"%s\", \"modules\": %zu, \"compiled\": %d, "
        "\"cold_compile_s\": %.4f, \"cold_compile_cpu_s\": %.4f, \"warm_load_s\": %.5f, "
        "\"nvrtc\": \"%s\", \"hardware_threads\": %u}\n",
        program.model.name.c_str(), arch.c_str(), modules.size(), compiled, cold, cold_cpu, warm,
        nvrtc_version().c_str(), std::thread::hardware_concurrency());
    if (temp) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
    return 0;
  }

  std::fputs(ir_dump.c_str(), stdout);
  for (const auto& g : modules) std::fputs(g.source.c_str(), stdout);
  if (!ptx_out.empty() || !cubin_out.empty()) {
    // The documented default of --cache-dir (--time keeps its fresh cache).
    if (const char* env = std::getenv("RATTN_CUDA_CACHE"); cache_dir.empty() && env && *env) cache_dir = env;
    KernelCache cache(cache_dir);
    for (size_t i = 0; i < modules.size(); ++i) {
      const auto& g = modules[i];
      const CompiledModule c = cache_dir.empty() ? nvrtc_compile(g.module.name, g.source, copt)
                                                 : cache.get_or_compile(g.module.name, g.source, copt);
      const bool second = i > 0;
      if (!ptx_out.empty()) write_file_atomic(second ? with_suffix(ptx_out, "paged") : ptx_out, c.ptx);
      if (!cubin_out.empty())
        write_file_atomic(second ? with_suffix(cubin_out, "paged") : cubin_out, c.cubin);
    }
  }
  return 0;
}
