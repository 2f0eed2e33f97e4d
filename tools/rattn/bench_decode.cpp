// `rattn bench decode`: its options and help; the benchmark itself is
// run_bench_decode (bench/decode/bench_decode.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "bench/bench_util.h"
#include "bench/decode/bench_decode.h"
#include "core/error.h"
#include "tools/rattn/args.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {
namespace {

using bench::BenchDecodeOptions;

constexpr char kCommand[] = "rattn bench decode";

const char kUsage[] =
    "usage: rattn bench decode [options] [--json]\n"
    "Times the decode step of one KV head (its group of query heads) for rattn (static set +\n"
    "index search + top-k attention, token insertion included) against full attention over\n"
    "every token, with the same CPU kernels and thread count, on the synthetic OOD set.\n"
    "  --tokens N           context length (default 131072)\n"
    "  --head-dim D         head dimension (default 128)\n"
    "  --group G            query heads per KV head (default 4)\n"
    "  --steps S            decode steps timed (default 32)\n"
    "  --warmup W           untimed decode steps first: kernel JIT, first touches and the first\n"
    "                       insertion, whose index growth is a one-off (default insert batch + 1)\n"
    "  --sinks N, --window N, --top-k N, --search-queue L   plan (default 128, 512, 100, 160)\n"
    "  --graph-degree M, --query-neighbors N, --build-sample F   index build (default 32, 100, 0.05)\n"
    "  --threads T          threads of the runtime and of the full-attention baseline, which\n"
    "                       splits the tokens over as many threads (default 1)\n"
    "  --insert-batch B     tokens leaving the window are inserted in batches of B (pending\n"
    "                       until then, attended exactly); default 16 (the runtime's), or\n"
    "                       --steps if fewer. The amortised figures average whole batch\n"
    "                       periods, insertion included (--steps >= B)\n"
    "  --searches-per-item S  query heads searched together per work item (search_many());\n"
    "                       0 = the runtime's choice from threads and heads (default 0)\n"
    "  --insert-queue N, --insert-pivots N, --insert-reverse N, --insert-key-queue N\n"
    "                       the plan's insert path (default: the plan's, 32 2 8 12)\n"
    "  --traversal-codes 0|1  decode searches walk the index's 8-bit key codes (plan default 0)\n"
    "  --code-dims D --code-coarse-dims C   with traversal codes: projected codes of D learned\n"
    "                       directions, the last C of them 4-bit (plan code_dims, code_coarse_dims; 0, 0)\n"
    "  --share-codes 0|1    with codes: one set per KV head shared by its group's indexes (1,\n"
    "                       the runtime's default) or one per index (0)\n"
    "  --shared-graph 0|1   one graph per KV head, searched by its group's query heads in\n"
    "                       lockstep and built from their pooled queries (plan shared_graph; 0)\n"
    "  --index graph|exact  the retrieval index: the graph (default) or an exact top-k scan of\n"
    "                       every offloaded key (what the plan's top-k allows at best)\n"
    "  --tail-samples N     also run rattn with the sampled tail estimate (plan.tail_samples = N)\n"
    "                       on the same prefilled state, timed and compared side by side\n"
    "                       (default 0: not run)\n"
    "  --search-seeds N     also run rattn with plan.search_seeds = N (warm-started searches; 0: without)\n"
    "                       on the same prefilled state, side by side with the plan's value\n"
    "                       (default: not run)\n"
    "  --batch N            also time N sequences (copies of the prefilled state, one runtime)\n"
    "                       decoding the same token: N decode() calls one after another against\n"
    "                       one decode_batch() call, side by side (default 0: not run)\n"
    "  --use-gpu 0|1        static set on the GPU when one is present (default 1; full attention\n"
    "                       stays on the CPU)\n"
    "  --state-cache PATH   reuse the prefilled state saved at PATH by an earlier run with the\n"
    "                       same parameters (saved there when missing); a development aid\n"
    "  --model-layers N, --model-kv-heads N   model the per-token time (default 32, 8: Llama-3-8B)\n"
    "  --seed S             synthetic data seed (default 1)\n"
    "  --json               print one JSON object (machine_info, parameters, results)\n"
    "A progress bar goes to stderr (plain lines at most every 10 s when not a terminal).\n";

[[noreturn]] void usage_error(const std::string& what) {
  usage_fail(std::string(kCommand) + ": error: " + what);
}

double parse_real(const std::string& opt, const char* s, double lo, double hi) {
  const std::optional<double> v = to_double(s);
  if (!v || !(*v > lo && *v <= hi))
    usage_error(opt + " expects a number in (" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'");
  return *v;
}

BenchDecodeOptions parse(int argc, char** argv, bool* help, bool* json) {
  BenchDecodeOptions o;
  bool insert_batch_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return o;
    }
    if (a == "--json") {
      *json = true;
      continue;
    }
    // Every option is in the help, so a name it lacks is unknown, not short of a value.
    if (i + 1 >= argc)
      usage_error(std::strstr(kUsage, ("  " + a + " ").c_str()) || std::strstr(kUsage, (", " + a + " ").c_str())
                      ? "option '" + a + "' expects a value (see --help)"
                      : "unknown option '" + a + "' (see --help)");
    const char* v = argv[++i];
    if (a == "--tokens") o.tokens = int_arg(kCommand, a, v, 1, int64_t(1) << 31);
    else if (a == "--head-dim") o.head_dim = int(int_arg(kCommand, a, v, 8, 1024));
    else if (a == "--group") o.group = int(int_arg(kCommand, a, v, 1, 64));
    else if (a == "--steps") o.steps = int(int_arg(kCommand, a, v, 1, 100000));
    else if (a == "--warmup") o.warmup = int(int_arg(kCommand, a, v, 0, 100000));
    else if (a == "--sinks") o.sinks = int_arg(kCommand, a, v, 0, int64_t(1) << 30);
    else if (a == "--window") o.window = int_arg(kCommand, a, v, 1, int64_t(1) << 30);
    else if (a == "--top-k") o.top_k = int_arg(kCommand, a, v, 0, 1 << 30);
    else if (a == "--search-queue") o.search_queue = int(int_arg(kCommand, a, v, 1, 1 << 20));
    else if (a == "--graph-degree") o.graph_degree = int(int_arg(kCommand, a, v, 1, 1024));
    else if (a == "--query-neighbors") o.query_neighbors = int(int_arg(kCommand, a, v, 1, 100000));
    else if (a == "--build-sample") o.build_sample = parse_real(a, v, 0.0, 1.0);
    else if (a == "--threads") o.threads = int(int_arg(kCommand, a, v, 0, 1024));
    else if (a == "--insert-batch") {
      o.insert_batch = int(int_arg(kCommand, a, v, 1, 1 << 16));
      insert_batch_given = true;
    }
    else if (a == "--searches-per-item") o.searches_per_item = int(int_arg(kCommand, a, v, 0, 64));
    else if (a == "--tail-samples") o.tail_samples = int(int_arg(kCommand, a, v, 0, 1 << 24));
    else if (a == "--search-seeds") o.search_seeds = int(int_arg(kCommand, a, v, 0, 1 << 16));
    else if (a == "--batch") o.batch = int(int_arg(kCommand, a, v, 0, 256));
    else if (a == "--insert-queue") o.insert_queue = int(int_arg(kCommand, a, v, 1, 4096));
    else if (a == "--insert-pivots") o.insert_pivots = int(int_arg(kCommand, a, v, 0, 4096));
    else if (a == "--insert-reverse") o.insert_reverse = int(int_arg(kCommand, a, v, 0, 4096));
    else if (a == "--insert-key-queue") o.insert_key_queue = int(int_arg(kCommand, a, v, 0, 4096));
    else if (a == "--use-gpu") o.use_gpu = int_arg(kCommand, a, v, 0, 1) != 0;
    else if (a == "--traversal-codes") o.traversal_codes = int_arg(kCommand, a, v, 0, 1) != 0;
    else if (a == "--code-dims") o.code_dims = int(int_arg(kCommand, a, v, 0, 4096));
    else if (a == "--code-coarse-dims") o.code_coarse_dims = int(int_arg(kCommand, a, v, 0, 4096));
    else if (a == "--share-codes") o.share_codes = int_arg(kCommand, a, v, 0, 1) != 0;
    else if (a == "--shared-graph") o.shared_graph = int_arg(kCommand, a, v, 0, 1) != 0;
    else if (a == "--index") {
      const std::string which = v;
      if (which != "graph" && which != "exact") usage_error("--index expects graph or exact (got '" + which + "')");
      o.exact_index = which == "exact";
    } else if (a == "--state-cache") o.state_cache = v;
    else if (a == "--model-layers") o.model_layers = int(int_arg(kCommand, a, v, 1, 1024));
    else if (a == "--model-kv-heads") o.model_kv_heads = int(int_arg(kCommand, a, v, 1, 1024));
    else if (a == "--seed") o.seed = uint64_t(int_arg(kCommand, a, v, 0, int64_t(1) << 62));
    else usage_error("unknown option '" + a + "' (see --help)");
  }
  if (o.tokens <= o.sinks + o.window)
    usage_error("--tokens must exceed sinks + window (" + std::to_string(o.sinks + o.window) + ")");
  if (!insert_batch_given) o.insert_batch = std::min(o.insert_batch, o.steps);
  if (o.warmup < 0) o.warmup = o.insert_batch + 1;
  if (o.steps < o.insert_batch)
    usage_error("--steps (" + std::to_string(o.steps) + ") must be >= --insert-batch (" +
                std::to_string(o.insert_batch) + ") so that the amortised figures include insertion");
  return o;
}

}  // namespace

int bench_decode_main(int argc, char** argv) {
  bool help = false, json = false;
  BenchDecodeOptions o = parse(argc, argv, &help, &json);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  o.progress = stderr;  // stdout keeps the report
  const boost::json::object report = bench::run_bench_decode(o, json ? nullptr : stdout);
  if (json) std::fputs(bench::to_pretty_json(report).c_str(), stdout);
  return 0;
}

}  // namespace rattn::cli
