// `rattn bench kernels`: its options and help; the benchmark itself is
// run_bench_kernels (bench/kernels/bench_kernels.h).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/kernels/bench_kernels.h"
#include "core/error.h"
#include "tools/rattn/args.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {
namespace {

const char kUsage[] =
    "usage: rattn bench kernels [--json] [--full-tokens N] [--min-time S] [--no-jit]\n"
    "                           [--vector W] [--split S] [--unroll U] [--dtile T] [--parallel 0|1]\n"
    "                           [--stream-vector W] [--stream-split S] [--stream-mib M]\n"
    "                           [--gpu-tokens N,...] [--gpu-splits S,...]\n"
    "  Times the Halide kernels against scalar C++ loops and (dense attention)\n"
    "  oneDNN at d=128, GQA group 4, fp16 K/V: gathered dot over 32/100 ids,\n"
    "  partial attention over 100 retrieved tokens, static-set attention over 640\n"
    "  tokens, full attention over N tokens (default 131072) with its GB/s as a\n"
    "  share of a STREAM-like copy/triad bandwidth, the n-way merge, and the cold\n"
    "  JIT / warm disk-cache load of one model plan's kernels. With a GPU, also a\n"
    "  decode step's static set on it (one row written per KV head, attention,\n"
    "  results back) for 1 and 8 KV heads against Halide on one thread.\n"
    "  --json           print one JSON object (machine, parameters, results)\n"
    "  --full-tokens N  tokens of the full-attention row (>= 640)\n"
    "  --min-time S     seconds spent per measurement (default 0.3)\n"
    "  --no-jit         skip the cold-JIT measurement (it builds into a temp dir)\n"
    "  --vector, --split, --unroll, --dtile, --parallel\n"
    "                   Halide schedule knobs (see docs/kernels.md; 0 = automatic)\n"
    "  --stream-vector, --stream-split, --stream-mib\n"
    "                   the streaming dense kernel's vector width and split (0 = automatic), and\n"
    "                   the K + V MiB of a range from which it runs (default 48; 0 = never)\n"
    "  --gpu-tokens LIST  static-set sizes of the GPU rows (default 640,N; each <= N)\n"
    "  --gpu-splits LIST  cuda.splits of the GPU rows: 0 the generator's default, -1 the\n"
    "                   runtime's choice for the set (static_set_splits), 1..64 (default 0,32)\n"
    "  A progress bar goes to stderr (plain lines at most every 10 s when not a terminal).\n";

[[noreturn]] void usage_error(const std::string& what) {
  usage_fail("rattn bench kernels: error: " + what);
}

}  // namespace

int bench_kernels_main(int argc, char** argv) {
  bool as_json = false;
  bench::BenchKernelsOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* what) -> std::string {
      if (i + 1 >= argc) usage_error(std::string(a) + " expects " + what);
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--json") {
      as_json = true;
    } else if (a == "--no-jit") {
      o.jit = false;
    } else if (a == "--full-tokens") {
      const std::string v = value("a token count");
      const std::optional<int64_t> x = to_int(v);
      if (!x || *x < 640 || *x > (int64_t(1) << 24))
        usage_error("--full-tokens expects a token count in [640, 16777216] (got '" + v + "')");
      o.full_tokens = *x;
    } else if (a == "--gpu-tokens" || a == "--gpu-splits") {
      const std::string v = value("a comma-separated list");
      const bool tokens = a == "--gpu-tokens";
      std::vector<int64_t> xs;
      // Every item counts, an empty one too (refused).
      for (size_t pos = 0; pos <= v.size();) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        const std::optional<int64_t> x = to_int(v.substr(pos, comma - pos));
        if (!x || (tokens ? *x < 1 || *x > (int64_t(1) << 24) : *x < -1 || *x > 64))
          usage_error(a + (tokens ? " expects token counts in [1, 16777216]" : " expects split counts in [-1, 64]") +
                      " (got '" + v + "')");
        xs.push_back(*x);
        pos = comma + 1;
      }
      if (tokens) o.gpu_tokens = xs;
      else o.gpu_splits.assign(xs.begin(), xs.end());
    } else if (a == "--vector" || a == "--split" || a == "--unroll" || a == "--dtile" || a == "--parallel" ||
               a == "--stream-vector" || a == "--stream-split" || a == "--stream-mib") {
      const std::string v = value("an integer");
      const std::optional<int64_t> x = to_int(v);
      if (!x || *x < 0 || *x > (1 << 20)) usage_error(a + " expects an integer in [0, 1048576] (got '" + v + "')");
      if (a == "--vector") o.schedule.vector_width = int(*x);
      else if (a == "--split") o.schedule.split = int(*x);
      else if (a == "--unroll") o.schedule.unroll = int(*x);
      else if (a == "--dtile") o.schedule.d_tile = int(*x);
      else if (a == "--stream-vector") o.schedule.stream_vector = int(*x);
      else if (a == "--stream-split") o.schedule.stream_split = int(*x);
      else if (a == "--stream-mib") o.schedule.stream_mib = int(*x);
      else o.schedule.parallel = *x != 0;
    } else if (a == "--min-time") {
      const std::string v = value("seconds");
      const std::optional<double> x = to_double(v);
      if (!x || !(*x > 0) || *x > 60) usage_error("--min-time expects seconds in (0, 60] (got '" + v + "')");
      o.min_time = *x;
    } else {
      usage_error("unknown option '" + a + "' (see --help)");
    }
  }
  for (int64_t n : o.gpu_tokens)
    if (n > o.full_tokens) usage_error("--gpu-tokens: " + std::to_string(n) + " is beyond --full-tokens");
  o.command = "rattn bench kernels";
  for (int i = 1; i < argc; ++i) o.command += std::string(" ") + argv[i];
  o.progress = stderr;  // stdout keeps the report
  const boost::json::object report = bench::run_bench_kernels(o, as_json ? nullptr : stdout);
  if (as_json) std::fputs(bench::to_pretty_json(report).c_str(), stdout);
  return 0;
}

}  // namespace rattn::cli
