// `rattn bench index`: the projected graph against hnswlib HNSW (inner
// product), faiss IVF-Flat (inner product) and the exact flat scan, on
// synthetic or captured (calibration) data. The two baselines are built on
// the graph build's key transform (centred keys, or the query metric with
// --key-metric 1|2) and, labelled, on raw keys. Context = keys of the first
// T - m tokens; test queries = the queries of the last m tokens (never used
// by any build). Recall@k is against the exact top-k.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "bench/bench_util.h"
#include "bench/index/baselines.h"
#include "bench/index/svg_plot.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/npy.h"
#include "runtime/data/calib.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"
#include "bench/bench.h"

namespace rattn::bench {
namespace {

namespace json = boost::json;

const char* kUsage =
    "usage: rattn bench index (--synthetic T | --calib DIR [--layer L] [--kv-head H]) [options]\n"
    "  --synthetic T        generate T tokens of synthetic out-of-distribution data (docs/data.md)\n"
    "  --calib DIR          read a calibration directory (manifest.json + layer_<id>.{q,k,v}.npy)\n"
    "  --layer L            calibration layer id (default: the first in the manifest)\n"
    "  --kv-head H          KV head (default 0); --head G: query head within its group (default 0)\n"
    "  --dim D              synthetic head dimension (default 128); --seed S (default 1)\n"
    "  --queries m          test queries = the last m tokens (default 1000)\n"
    "  --k K                neighbours wanted (default 100)\n"
    "  --dtype f32|f16      key storage of the index and the scans (default f32)\n"
    "  --methods LIST       comma list of graph,hnsw,ivf,flat (default all)\n"
    "  --baseline-keys both|graph|raw   keys of hnswlib and faiss IVF (and of the insert experiment's\n"
    "                       hnswlib): the graph build's key transform (centred keys; with --key-metric 1|2\n"
    "                       the query metric: keys L'k, queries L^-1 q), which ranks keys as the raw ones\n"
    "                       for every query, and/or raw keys, reported as *_raw_keys; both: both, and with\n"
    "                       a query metric also centred keys as *_centred_keys (default both)\n"
    "  --degree M --nq N --sample-fraction F --build-threads N   graph build (32, 100, 0.2, 2)\n"
    "  --cooccurrence-order 0|1   order each neighbour list by training co-occurrence (default 1)\n"
    "  --repair-fraction F  share of training queries in the query-guided repair pass (default 1; 0: off)\n"
    "  --causal 0|1         training query t ranks only keys <= t (its past; default 0)\n"
    "  --shift-queries N    RoPE-shifted copies of the latest N training queries join the build (default 0: off)\n"
    "  --shift-span S       the copies move forward by S/8, S/4, S/2 and S positions (default 2048)\n"
    "  --rope-base B        RoPE base of the data (synthetic: the generator's; --calib: required with --shift-queries)\n"
    "  --rope-interleaved 0|1   GPT-J RoPE pairs (2i, 2i+1) instead of NeoX (i, i+d/2) (default 0)\n"
    "  --key-metric 0|1|2   key-to-key relations of the build: inner product, query second moment, query\n"
    "                       covariance (default: the library's, 0); --key-metric-ridge R,\n"
    "                       --key-metric-passes BITS (1 projection, 2 connectivity, 4 repair; default 7)\n"
    "  --budgets LIST       graph queue lengths L (default 100,128,160,180,200,225,250,320,400,500)\n"
    "  --search LIST        graph search variants, each swept over the budgets: codes (walk on the\n"
    "                       index's 8-bit key codes, exact re-rank), codes@D (8-bit codes of the keys\n"
    "                       projected onto D learned directions), codes@F+C (F 8-bit and then C 4-bit\n"
    "                       directions, e.g. codes@48+32: one cache line per key) or exact (exact keys\n"
    "                       throughout),\n"
    "                       optionally :W = candidates expanded per step and :W:R = candidates re-ranked\n"
    "                       with the exact keys (codes; 0 = automatic, k + max(16, k/4); >= L: all)\n"
    "                       and :W:R:P = stop once P expansions in a row left the k-th best unchanged\n"
    "                       and :W:R:P:S = seed each search with the previous test query's best S results\n"
    "                       and :W:R:P:S:C:F = partial expansion: a candidate expanded below rank F\n"
    "                       scores its first C neighbours only (0 = whole lists / F = L)\n"
    "                       (default codes,exact; the\n"
    "                       first is the reported method and operating point, the others go to\n"
    "                       search_variants)\n"
    "  --repeat R           timing rounds of the graph sweep, the flat scan and the paired run; the\n"
    "                       median round is reported, every round in us_per_query_rounds (default 5)\n"
    "  --graph-cache FILE   load the main graph from FILE when it was saved by a run with the same data\n"
    "                       and build options, else build it and save it there (repeated search runs)\n"
    "  --interleave N       also search the test queries N at a time through search_many() on one\n"
    "                       thread (N index copies, like the N query heads of a GQA group) at the\n"
    "                       operating point: a throughput figure (default 4; 0: off)\n"
    "  --insert-fraction F  insert experiment: build on the context minus F, insert the rest (default 0.1; 0: off)\n"
    "  --insert-refresh N   insert experiment: every N inserts, refresh_projected_graph() with those tokens'\n"
    "                       queries (and their RoPE-shifted copies with --shift-queries) (default 0: off)\n"
    "  --insert-refresh-sample F   share of those queries: every round(1/F)-th (default 0.2)\n"
    "  --insert-queue L     queue length for the insert experiment's searches (default: the operating point's)\n"
    "  --graph-insert-queue N --insert-pivots N --insert-reverse N --insert-key-queue N   insert path (32, 2, 8, 12)\n"
    "  --insert-sweep LIST  more insert configurations queue:pivots:reverse[:key_queue],... on copies of one base graph\n"
    "  --target-recall R --target-scored S   operating point (0.95, 0.02)\n"
    "  --json               print one JSON object (machine_info, parameters, every method; the graph's\n"
    "                       build_phases / build_phases_cpu: wall / CPU seconds per build phase)\n"
    "  --dump-ids FILE.npy  write the graph's ids at the operating point, [m, k] int32\n"
    "  --dump-graph PREFIX  write the graph's neighbour lists, PREFIX.lists.npy [keys, slots] int32 padded\n"
    "                       with -1, and its entry points, PREFIX.entries.npy (bench/index/oracle_bounds.py)\n"
    "  --plot FILE.svg      draw recall against keys scored for every method\n";

struct Options {
  int64_t synthetic = 0;
  std::string calib;
  int layer = -1, kv_head = 0, head = 0, dim = 128;
  uint64_t seed = 1;
  int64_t queries = 1000;
  int k = 100;
  DType dtype = DType::f32;
  std::vector<std::string> methods{"graph", "hnsw", "ivf", "flat"};
  std::string baseline_keys = "both";
  GraphBuildParams graph;
  std::vector<int> budgets{100, 128, 160, 180, 200, 225, 250, 320, 400, 500};
  struct SearchVariant {
    std::string name;
    bool codes = true;
    int width = 1;
    int rerank = 0;
    int code_dims = 0;
    int code_coarse_dims = 0;  // of the code_dims, 4-bit (codes@F+C)
    int patience = 0;
    int seeds = 0;  // the previous test query's best results seed the search (a decode step's warm start)
    int expand_first = 0, full_expand_rank = 0;  // partial expansion (SearchParams)
    SearchParams params(int k, int queue_length) const {
      SearchParams sp;
      sp.k = k;
      sp.queue_length = queue_length;
      sp.traversal_codes = codes;
      sp.expand_width = width;
      sp.rerank = rerank;
      sp.code_dims = code_dims;
      sp.code_coarse_dims = code_coarse_dims;
      sp.patience = patience;
      sp.expand_first = expand_first;
      sp.full_expand_rank = full_expand_rank;
      return sp;
    }
  };
  std::vector<SearchVariant> search{{"codes", true, 1}, {"exact", false, 1}};
  int interleave = 4;
  int repeat = 5;  // timing rounds; the median is reported
  std::string graph_cache;
  std::string build_fingerprint;  // every option except search-only ones: names a cached graph
  double insert_fraction = 0.1;
  int insert_queue = 0;
  int insert_refresh = 0;
  double insert_refresh_sample = 0.2;
  int key_metric = -1;  // -1: the library default; the same for every data source, so a run's command says it all
  std::vector<std::array<int, 4>> insert_sweep;
  double target_recall = 0.95, target_scored = 0.02;
  bool json = false;
  std::string dump_ids, dump_graph, plot;
  double rope_base = 0;  // 0: the synthetic generator's
};

[[noreturn]] void usage_error(const std::string& m) { usage_fail("rattn bench index: error: " + m); }

int64_t parse_int(const std::string& flag, const char* v) {
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (!*v || *end) usage_error(flag + " expects an integer, got '" + v + "'");
  return x;
}
double parse_double(const std::string& flag, const char* v) {
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (!*v || *end) usage_error(flag + " expects a number, got '" + v + "'");
  return x;
}
std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv, bool* help) {
  Options o;
  {
    // Options that do not change the data or the main graph's build.
    static const char* const kSearchOnly[] = {"--search", "--interleave", "--budgets", "--plot", "--dump-ids", "--dump-graph",
                                              "--methods", "--baseline-keys", "--target-recall", "--target-scored", "--graph-cache",
                                              "--insert-fraction", "--insert-queue", "--insert-sweep"};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--json") continue;
      if (std::find(std::begin(kSearchOnly), std::end(kSearchOnly), a) != std::end(kSearchOnly)) {
        ++i;
        continue;
      }
      o.build_fingerprint += a + "\n";
    }
  }
  o.graph.sample_fraction = 0.2;
  o.graph.repair_fraction = 1.0;  // small but consistent gain (docs/performance.md)
  o.graph.keep_query_moment = true;  // for the codes@D search variants
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage_error(a + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      *help = true;
      return o;
    } else if (a == "--synthetic") {
      if (i + 1 >= argc) usage_error("--synthetic expects a token count");
      o.synthetic = parse_int(a, value());
      if (o.synthetic < 16) usage_error("--synthetic expects a token count >= 16");
    } else if (a == "--calib") {
      o.calib = value();
    } else if (a == "--layer") {
      o.layer = int(parse_int(a, value()));
    } else if (a == "--kv-head") {
      o.kv_head = int(parse_int(a, value()));
    } else if (a == "--head") {
      o.head = int(parse_int(a, value()));
    } else if (a == "--dim") {
      o.dim = int(parse_int(a, value()));
    } else if (a == "--seed") {
      o.seed = uint64_t(parse_int(a, value()));
    } else if (a == "--queries") {
      o.queries = parse_int(a, value());
    } else if (a == "--k") {
      o.k = int(parse_int(a, value()));
    } else if (a == "--dtype") {
      const std::string v = value();
      if (!parse_dtype(v, &o.dtype) || o.dtype == DType::bf16) usage_error("--dtype expects f32 or f16, got '" + v + "'");
    } else if (a == "--methods") {
      o.methods = split(value());
      for (const auto& m : o.methods)
        if (m != "graph" && m != "hnsw" && m != "ivf" && m != "flat")
          usage_error("--methods: unknown method '" + m + "' (expected graph, hnsw, ivf, flat)");
    } else if (a == "--baseline-keys") {
      o.baseline_keys = value();
      if (o.baseline_keys != "both" && o.baseline_keys != "graph" && o.baseline_keys != "raw")
        usage_error("--baseline-keys expects both, graph or raw, got '" + o.baseline_keys + "'");
    } else if (a == "--degree") {
      o.graph.degree = int(parse_int(a, value()));
    } else if (a == "--nq") {
      o.graph.query_neighbors = int(parse_int(a, value()));
    } else if (a == "--sample-fraction") {
      o.graph.sample_fraction = parse_double(a, value());
    } else if (a == "--build-threads") {
      o.graph.threads = int(parse_int(a, value()));
    } else if (a == "--pivots") {
      o.graph.pivots_per_query = int(parse_int(a, value()));
    } else if (a == "--pivot-capacity") {
      o.graph.pivot_capacity = int(parse_int(a, value()));
    } else if (a == "--cooccurrence-order") {
      o.graph.cooccurrence_order = parse_int(a, value()) != 0;
    } else if (a == "--fill-two-hop") {
      o.graph.fill_two_hop = parse_int(a, value()) != 0;
    } else if (a == "--entry-points") {
      o.graph.entry_points = int(parse_int(a, value()));
    } else if (a == "--extra-slots") {
      o.graph.extra_slots = int(parse_int(a, value()));
    } else if (a == "--repair-fraction") {
      o.graph.repair_fraction = parse_double(a, value());
    } else if (a == "--build-queue") {
      o.graph.build_queue = int(parse_int(a, value()));
    } else if (a == "--budgets") {
      o.budgets.clear();
      for (const auto& s : split(value())) o.budgets.push_back(int(parse_int("--budgets", s.c_str())));
    } else if (a == "--search") {
      o.search.clear();
      for (const auto& item : split(value())) {
        Options::SearchVariant v;
        v.name = item;
        const size_t colon = item.find(':');
        std::string mode = item.substr(0, colon);
        const size_t at = mode.find('@');
        if (at != std::string::npos) {
          // codes@D or codes@F+C: F 8-bit and C 4-bit directions (D = F + C).
          const std::string dims = mode.substr(at + 1);
          const size_t plus = dims.find('+');
          const int fine = int(parse_int("--search", dims.substr(0, plus).c_str()));
          v.code_coarse_dims = plus == std::string::npos ? 0 : int(parse_int("--search", dims.substr(plus + 1).c_str()));
          v.code_dims = fine + v.code_coarse_dims;
          mode = mode.substr(0, at);
          if (mode != "codes" || fine < 0 || v.code_coarse_dims < 0 || v.code_dims < 1)
            usage_error("--search: codes@D / codes@F+C expect D >= 1 projected code dimensions (F 8-bit, C 4-bit), got '" +
                        item + "'");
        }
        if (mode != "codes" && mode != "exact")
          usage_error("--search expects codes, codes@D, codes@F+C or exact items with an optional :W[:R], got '" + item + "'");
        v.codes = mode == "codes";
        if (colon != std::string::npos) {
          const std::string rest = item.substr(colon + 1);
          const std::vector<std::string> nums = split(rest, ':');
          if (nums.empty() || nums.size() > 6)
            usage_error("--search: expected W[:R[:P[:S[:C[:F]]]]] after the mode, got '" + item + "'");
          v.width = int(parse_int("--search", nums[0].c_str()));
          if (nums.size() > 1) v.rerank = int(parse_int("--search", nums[1].c_str()));
          if (nums.size() > 2) v.patience = int(parse_int("--search", nums[2].c_str()));
          if (nums.size() > 3) v.seeds = int(parse_int("--search", nums[3].c_str()));
          if (nums.size() > 4) v.expand_first = int(parse_int("--search", nums[4].c_str()));
          if (nums.size() > 5) v.full_expand_rank = int(parse_int("--search", nums[5].c_str()));
        }
        if (v.width < 1 || v.width > 64) usage_error("--search: expand width must be in [1, 64], got '" + item + "'");
        if (v.rerank < 0) usage_error("--search: rerank count must be >= 0, got '" + item + "'");
        if (v.patience < 0) usage_error("--search: patience must be >= 0, got '" + item + "'");
        if (v.seeds < 0) usage_error("--search: seed count must be >= 0, got '" + item + "'");
        if (v.expand_first < 0 || v.full_expand_rank < 0)
          usage_error("--search: partial expansion C and F must be >= 0, got '" + item + "'");
        o.search.push_back(v);
      }
      if (o.search.empty()) usage_error("--search is empty");
    } else if (a == "--graph-cache") {
      o.graph_cache = value();
    } else if (a == "--repeat") {
      o.repeat = int(parse_int(a, value()));
      if (o.repeat < 1 || o.repeat > 100) usage_error("--repeat expects 1..100");
    } else if (a == "--interleave") {
      o.interleave = int(parse_int(a, value()));
      if (o.interleave < 0 || o.interleave > 64) usage_error("--interleave expects 0..64");
    } else if (a == "--insert-fraction") {
      o.insert_fraction = parse_double(a, value());
    } else if (a == "--insert-refresh-sample") {
      o.insert_refresh_sample = parse_double(a, value());
    } else if (a == "--insert-refresh") {
      o.insert_refresh = int(parse_int(a, value()));
    } else if (a == "--insert-queue") {
      o.insert_queue = int(parse_int(a, value()));
    } else if (a == "--graph-insert-queue") {
      o.graph.insert_queue = int(parse_int(a, value()));
    } else if (a == "--insert-pivots") {
      o.graph.insert_pivots = int(parse_int(a, value()));
    } else if (a == "--insert-reverse") {
      o.graph.insert_reverse = int(parse_int(a, value()));
    } else if (a == "--key-metric-ridge") {
      o.graph.key_metric_ridge = parse_double(a, value());
    } else if (a == "--key-metric-passes") {
      o.graph.key_metric_passes = int(parse_int(a, value()));
    } else if (a == "--shift-queries") {
      o.graph.shift_queries = int(parse_int(a, value()));
      if (o.graph.shift_queries < 0) usage_error("--shift-queries must be >= 0");
    } else if (a == "--shift-span") {
      o.graph.shift_span = int(parse_int(a, value()));
      if (o.graph.shift_span < 8) usage_error("--shift-span must be >= 8");
    } else if (a == "--rope-base") {
      o.rope_base = parse_double(a, value());
      if (!(o.rope_base > 1.0)) usage_error("--rope-base must be > 1");
    } else if (a == "--rope-interleaved") {
      o.graph.rope_interleaved = parse_int(a, value()) != 0;
    } else if (a == "--causal") {
      o.graph.causal = parse_int(a, value()) != 0;
    } else if (a == "--key-metric") {
      o.key_metric = int(parse_int(a, value()));
      if (o.key_metric < 0 || o.key_metric > 2) usage_error("--key-metric expects 0, 1 or 2");
    } else if (a == "--insert-key-queue") {
      o.graph.insert_key_queue = int(parse_int(a, value()));
    } else if (a == "--insert-sweep") {
      for (const auto& item : split(value())) {
        std::array<int, 4> c{};
        std::stringstream ss(item);
        std::string part;
        int n = 0;
        while (std::getline(ss, part, ':') && n < 4) c[size_t(n++)] = int(parse_int("--insert-sweep", part.c_str()));
        if (n < 3) usage_error("--insert-sweep expects queue:pivots:reverse[:key_queue] items, got '" + item + "'");
        o.insert_sweep.push_back(c);
      }
    } else if (a == "--target-recall") {
      o.target_recall = parse_double(a, value());
    } else if (a == "--target-scored") {
      o.target_scored = parse_double(a, value());
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--dump-ids") {
      o.dump_ids = value();
    } else if (a == "--dump-graph") {
      o.dump_graph = value();
    } else if (a == "--plot") {
      o.plot = value();
    } else {
      usage_error("unknown option '" + a + "' (see --help)");
    }
  }
  if ((o.synthetic > 0) == !o.calib.empty()) usage_error("give exactly one of --synthetic T and --calib DIR");
  if (o.k < 1) usage_error("--k must be >= 1");
  if (o.queries < 1) usage_error("--queries must be >= 1");
  if (o.budgets.empty()) usage_error("--budgets is empty");
  if (o.insert_fraction < 0 || o.insert_fraction >= 0.9) usage_error("--insert-fraction must be in [0, 0.9)");
  if (o.insert_refresh < 0) usage_error("--insert-refresh must be >= 0");
  if (!(o.insert_refresh_sample > 0 && o.insert_refresh_sample <= 1)) usage_error("--insert-refresh-sample must be in (0, 1]");
  if (o.graph.threads < 1) usage_error("--build-threads must be >= 1");
  // The query metric for key-to-key relations wins big on the synthetic set
  // and loses on the real Gemma-3 layers (docs/index.md), hence per source.
  o.graph.key_metric = o.key_metric >= 0 ? o.key_metric : GraphBuildParams{}.key_metric;
  if (o.rope_base == 0 && o.graph.shift_queries > 0 && !o.calib.empty())
    usage_error("--shift-queries with --calib needs --rope-base (the calibration data does not record it)");
  o.graph.rope_base = o.rope_base > 0 ? o.rope_base : SyntheticSpec{}.rope_base;
  if (!o.dump_graph.empty() && std::find(o.methods.begin(), o.methods.end(), "graph") == o.methods.end())
    usage_error("--dump-graph needs the graph method");
  return o;
}

// The evaluation set: context keys and training queries (first T - m tokens)
// and test queries (last m tokens).
struct Dataset {
  int dim = 0;
  int64_t tokens = 0, context = 0, m = 0;
  std::vector<float> keys;     // [context, d]
  std::vector<float> train;    // [context, d], this query head
  std::vector<float> test;     // [m, d]
  json::object describe;
};

Dataset load_data(const Options& o) {
  Dataset ds;
  std::vector<float> all_keys, all_q;
  if (o.synthetic > 0) {
    SyntheticSpec spec;
    spec.tokens = o.synthetic;
    spec.head_dim = o.dim;
    spec.group = o.head + 1;
    spec.seed = o.seed;
    SyntheticHead h = make_synthetic(spec);
    ds.dim = h.head_dim;
    ds.tokens = h.tokens;
    all_keys = std::move(h.keys);
    all_q.assign(h.query(o.head, 0), h.query(o.head, 0) + size_t(h.tokens) * size_t(h.head_dim));
    ds.describe["source"] = "synthetic";
    ds.describe["seed"] = o.seed;
  } else {
    const CalibManifest man = read_calib_manifest(o.calib);
    const int layer = o.layer >= 0 ? o.layer : man.layers.front();
    if (o.kv_head < 0 || o.kv_head >= man.num_kv_heads) usage_error("--kv-head out of range for " + o.calib);
    if (o.head < 0 || o.head >= man.group()) usage_error("--head out of range (group size " + std::to_string(man.group()) + ")");
    const CalibLayer l = read_calib_layer(o.calib, man, layer);
    ds.dim = man.head_dim;
    ds.tokens = man.tokens;
    const size_t per = size_t(man.tokens) * size_t(man.head_dim);
    const int qh = o.kv_head * man.group() + o.head;
    all_keys.assign(l.k.begin() + std::ptrdiff_t(per * size_t(o.kv_head)), l.k.begin() + std::ptrdiff_t(per * size_t(o.kv_head + 1)));
    all_q.assign(l.q.begin() + std::ptrdiff_t(per * size_t(qh)), l.q.begin() + std::ptrdiff_t(per * size_t(qh + 1)));
    ds.describe["source"] = "calib";
    ds.describe["dir"] = o.calib;
    ds.describe["model"] = man.model;
    ds.describe["layer"] = layer;
  }
  ds.m = o.queries;
  if (ds.m >= ds.tokens / 2) usage_error("--queries must be less than half the tokens");
  ds.context = ds.tokens - ds.m;
  const size_t d = size_t(ds.dim);
  ds.keys.assign(all_keys.begin(), all_keys.begin() + std::ptrdiff_t(size_t(ds.context) * d));
  ds.train.assign(all_q.begin(), all_q.begin() + std::ptrdiff_t(size_t(ds.context) * d));
  ds.test.assign(all_q.begin() + std::ptrdiff_t(size_t(ds.context) * d), all_q.end());
  ds.describe["tokens"] = ds.tokens;
  ds.describe["context_keys"] = ds.context;
  ds.describe["test_queries"] = ds.m;
  ds.describe["head_dim"] = ds.dim;
  ds.describe["kv_head"] = o.kv_head;
  ds.describe["query_head"] = o.head;
  ds.describe["mahalanobis_ratio"] = mahalanobis_ratio(ds.keys.data(), ds.context, ds.train.data(), ds.context, ds.dim);
  return ds;
}

using IdLists = std::vector<std::vector<int32_t>>;

IdLists ground_truth(const RowsView& keys, int64_t n, const std::vector<float>& queries, int64_t m, int k, int threads) {
  IdLists gt(static_cast<size_t>(m));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
  for (int64_t i = 0; i < m; ++i) exact_top_k(queries.data() + size_t(i) * size_t(keys.dim), keys, n, k, &gt[size_t(i)]);
  return gt;
}

struct Point {
  std::string budget_name;
  double budget = 0;
  double recall = 0, scored_fraction = 0, us_per_query = 0;
  double cpu_us_per_query = 0;  // this thread's CPU time (0: not measured); steadier than wall time on a shared machine
  std::vector<double> us_rounds;  // us_per_query of every timing round (--repeat; us_per_query is their median)
};

struct MethodResult {
  std::string name;
  double build_seconds = 0;
  size_t bytes = 0;
  std::vector<Point> points;
  json::object extra;
};

json::array to_json(const std::vector<Point>& points) {
  json::array pts;
  for (const auto& p : points) {
    json::object j;
    j[p.budget_name] = p.budget;
    j["recall"] = p.recall;
    j["scored_fraction"] = p.scored_fraction;
    j["us_per_query"] = p.us_per_query;
    if (p.cpu_us_per_query > 0) j["cpu_us_per_query"] = p.cpu_us_per_query;
    if (p.us_rounds.size() > 1) {
      json::array rounds;
      for (double u : p.us_rounds) rounds.push_back(u);
      j["us_per_query_rounds"] = std::move(rounds);
    }
    pts.push_back(std::move(j));
  }
  return pts;
}

json::value to_json(const MethodResult& r) {
  json::object o;
  o["name"] = r.name;
  o["build_seconds"] = r.build_seconds;
  o["bytes"] = r.bytes;
  o["points"] = to_json(r.points);
  for (const auto& kv : r.extra) o[kv.key()] = kv.value();
  return o;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void log(const Options& o, const std::string& line) {
  if (!o.json) std::printf("%s\n", line.c_str());
  else std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stdout);
}

// Runs `search(i, ids_out) -> keys scored` over all test queries on this
// thread; returns mean recall, scored fraction and microseconds per query.
template <class SearchFn>
Point measure(const IdLists& gt, int64_t m, int k, int64_t n_keys, SearchFn&& search, IdLists* keep = nullptr) {
  Point p;
  std::vector<int32_t> ids;
  double scored = 0, rec = 0;
  const double t0 = now_seconds();
  IdLists got(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) scored += double(search(i, &got[size_t(i)]));
  p.us_per_query = (now_seconds() - t0) * 1e6 / double(m);
  for (int64_t i = 0; i < m; ++i) rec += recall_at(got[size_t(i)], gt[size_t(i)], k);
  p.recall = rec / double(m);
  p.scored_fraction = scored / double(m) / double(n_keys);
  if (keep) *keep = std::move(got);
  return p;
}

}  // namespace

int bench_index(int argc, char** argv) {
  bool help = false;
  Options o = parse(argc, argv, &help);
  if (help) {
    std::printf("%s", kUsage);
    return 0;
  }
  auto has = [&](const char* m) { return std::find(o.methods.begin(), o.methods.end(), m) != o.methods.end(); };
  const double t_load = now_seconds();
  Dataset ds = load_data(o);
  const int d = ds.dim;
  const int64_t N = ds.context, m = ds.m;
  log(o, "data: " + std::to_string(ds.tokens) + " tokens, context " + std::to_string(N) + ", " + std::to_string(m) +
             " test queries, d=" + std::to_string(d) + ", mahalanobis ratio " +
             std::to_string(ds.describe["mahalanobis_ratio"].as_double()) + " (" + std::to_string(now_seconds() - t_load) + " s)");

  RowStore store(o.dtype, d);
  store.append_f32(ds.keys.data(), N);
  const RowsView keys = store.view();
  const IdLists gt = ground_truth(keys, N, ds.test, m, o.k, o.graph.threads);

  std::vector<MethodResult> results;
  json::object operating, insert_report;
  IdLists op_ids;

  if (has("graph")) {
    MethodResult r;
    r.name = "projected_graph";
    const double t0 = now_seconds();
    double last_report = t0;
    // Cache file: "rattn-bench-graph\n", the fingerprint's length and text, then the index image.
    const std::string magic = "rattn-bench-graph\n", head = magic + std::to_string(o.build_fingerprint.size()) + "\n" +
                                                           o.build_fingerprint;
    std::unique_ptr<KeyIndex> index;
    if (!o.graph_cache.empty() && ::access(o.graph_cache.c_str(), F_OK) == 0) {
      const std::string bytes = read_file(o.graph_cache);
      if (bytes.compare(0, head.size(), head) == 0) {
        index = deserialize_index(std::string_view(bytes).substr(head.size()));
        r.extra["loaded_from_cache"] = true;
        log(o, "projected_graph: loaded from " + o.graph_cache + " (build time below is the load time)");
      } else {
        log(o, "projected_graph: " + o.graph_cache + " holds a graph of other options; rebuilding");
      }
    }
    if (!index) {
      index = build_projected_graph(keys, ds.train.data(), N, o.graph, nullptr, [&](double x) {
        if (x >= 0.6 && now_seconds() - last_report > 0.05) {
          log(o, "    build " + std::to_string(x) + " at " + std::to_string(now_seconds() - t0) + " s");
          last_report = now_seconds();
        }
      });
      if (!o.graph_cache.empty()) {
        std::string bytes = head;
        index->serialize(&bytes);
        write_file_atomic(o.graph_cache, bytes);
      }
    }
    r.build_seconds = now_seconds() - t0;
    r.bytes = index->memory_bytes();
    const GraphInfo gi = projected_graph_info(*index);
    r.extra["adjacency_bytes_per_key"] = double(gi.adjacency_bytes) / double(N);
    r.extra["mean_degree"] = gi.mean_degree;
    r.extra["unreached_before_repair"] = gi.unreached_before_repair;
    r.extra["unreachable"] = gi.unreachable;
    r.extra["key_alignment"] = gi.key_alignment;
    r.extra["key_metric"] = gi.key_metric;
    {
      // Seconds per build phase (wall), and CPU seconds per phase: cpu / wall
      // near the thread count means both build threads were busy.
      json::object phases, cpu;
      std::string line = "    build phases (wall s / cpu s):";
      for (const BuildPhase& ph : gi.build_phases) {
        phases[ph.name] = ph.seconds;
        cpu[ph.name] = ph.cpu_seconds;
        char buf[96];
        std::snprintf(buf, sizeof buf, " %s %.2f/%.2f", ph.name.c_str(), ph.seconds, ph.cpu_seconds);
        line += buf;
      }
      r.extra["build_phases"] = std::move(phases);
      r.extra["build_phases_cpu"] = std::move(cpu);
      log(o, line);
    }
    log(o, "projected_graph: build " + std::to_string(r.build_seconds) + " s, " +
               std::to_string(double(gi.adjacency_bytes) / double(N)) + " B/key adjacency, mean degree " +
               std::to_string(gi.mean_degree) + ", unreached before repair " + std::to_string(gi.unreached_before_repair) +
               ", key alignment " + std::to_string(gi.key_alignment) + ", key metric " + std::to_string(gi.key_metric));
    {
      // The floor of the graph's degree: a walk that expands exactly each
      // query's true top-k (and nothing else) still scores this share.
      double floor_sum = 0;
      for (int64_t i = 0; i < m; ++i)
        floor_sum += double(expansion_footprint(*index, gt[size_t(i)].data(), int(gt[size_t(i)].size())));
      const double floor = m > 0 ? floor_sum / double(m) / double(N) : 0.0;
      r.extra["answer_expansion_scored_fraction"] = floor;
      log(o, "  expanding exactly the true top-" + std::to_string(o.k) + " scores " + std::to_string(100 * floor) +
                 "% of the keys (the floor of this graph's walks)");
    }
    if (!o.dump_graph.empty()) {
      std::vector<int32_t> lists(size_t(N) * size_t(gi.slots), -1);
      for (int64_t i = 0; i < N; ++i) {
        const std::vector<int32_t> nbrs = projected_graph_neighbors(*index, int32_t(i));
        std::copy(nbrs.begin(), nbrs.end(), lists.begin() + std::ptrdiff_t(size_t(i) * size_t(gi.slots)));
      }
      write_npy(o.dump_graph + ".lists.npy", NpyType::i32, {N, int64_t(gi.slots)}, lists.data());
      const std::vector<int32_t> entries = projected_graph_entries(*index);
      write_npy(o.dump_graph + ".entries.npy", NpyType::i32, {int64_t(entries.size())}, entries.data());
    }
    auto scratch = index->make_scratch();
    SearchResult sr;
    int op_index = -1;
    // The search variants run side by side: at each budget, blocks of test
    // queries go through every variant in turn (rotating the order), so that
    // the shared machine's load drifts alike for all of them.
    const size_t nv = o.search.size();
    std::vector<SearchParams> sps(nv);
    std::vector<std::vector<Point>> pts(nv);
    for (size_t v = 0; v < nv; ++v) {
      // Warm-up: the first search with codes encodes them (timed: a cost the
      // runtime pays once per index).
      sps[v] = o.search[v].params(o.k, o.budgets.front());
      const double t1 = now_seconds();
      index->search(ds.test.data(), keys, sps[v], *scratch, sr);
      if (o.search[v].codes && !r.extra.contains("first_search_with_codes_ms")) {
        r.extra["first_search_with_codes_ms"] = (now_seconds() - t1) * 1e3;
        log(o, "  first search with codes (encodes them): " + std::to_string((now_seconds() - t1) * 1e3) + " ms");
      }
    }
    // Timing rounds (--repeat), outermost so that a busy spell of the shared
    // machine falls on one round rather than on one budget; the median round
    // is reported. The searches are deterministic: round 0 keeps the ids and
    // keys scored, later rounds only time.
    constexpr int64_t kBlock = 25;
    const size_t n_budgets = o.budgets.size();
    std::vector<std::vector<IdLists>> got_at(n_budgets, std::vector<IdLists>(nv, IdLists(static_cast<size_t>(m))));
    std::vector<std::vector<double>> scored_at(n_budgets, std::vector<double>(nv, 0.0));
    std::vector<std::vector<std::vector<double>>> secs_at(n_budgets, std::vector<std::vector<double>>(nv)),
        cpu_at = secs_at;
    for (int round = 0; round < o.repeat; ++round)
      for (size_t li = 0; li < n_budgets; ++li) {
        const int L = o.budgets[li];
        std::vector<IdLists>& got = got_at[li];
        std::vector<double> secs(nv, 0.0), cpu(nv, 0.0);
        for (int64_t i0 = 0, b = 0; i0 < m; i0 += kBlock, ++b) {
          const int64_t i1 = std::min(m, i0 + kBlock);
          for (size_t t = 0; t < nv; ++t) {
            const size_t v = (size_t(b) + t) % nv;
            sps[v].queue_length = L;
            const double t1 = now_seconds(), c1 = thread_cpu_seconds();
            for (int64_t i = i0; i < i1; ++i) {
              if (o.search[v].seeds > 0 && i > 0) {
                const std::vector<int32_t>& prev = got[v][size_t(i - 1)];
                sps[v].seeds = prev.data();
                sps[v].num_seeds = std::min(o.search[v].seeds, int(prev.size()));
              } else {
                sps[v].seeds = nullptr;
                sps[v].num_seeds = 0;
              }
              index->search(ds.test.data() + size_t(i) * size_t(d), keys, sps[v], *scratch, sr);
              if (round == 0) {
                got[v][size_t(i)] = sr.ids;
                scored_at[li][v] += double(sr.keys_scored);
              }
            }
            sps[v].seeds = nullptr;  // `got` is this budget's
            sps[v].num_seeds = 0;
            secs[v] += now_seconds() - t1;
            cpu[v] += thread_cpu_seconds() - c1;
          }
        }
        for (size_t v = 0; v < nv; ++v) {
          secs_at[li][v].push_back(secs[v] * 1e6 / double(m));
          cpu_at[li][v].push_back(cpu[v] * 1e6 / double(m));
        }
      }
    for (size_t li = 0; li < n_budgets; ++li) {
      const int L = o.budgets[li];
      std::vector<IdLists>& got = got_at[li];
      const std::vector<double>& scored = scored_at[li];
      std::string line = "  L=" + std::to_string(L);
      for (size_t v = 0; v < nv; ++v) {
        Point p;
        p.budget_name = "queue_length";
        p.budget = L;
        p.us_rounds = secs_at[li][v];
        p.us_per_query = median(secs_at[li][v]);
        p.cpu_us_per_query = median(cpu_at[li][v]);
        for (int64_t i = 0; i < m; ++i) p.recall += recall_at(got[v][size_t(i)], gt[size_t(i)], o.k);
        p.recall /= double(m);
        p.scored_fraction = scored[v] / double(m) / double(N);
        pts[v].push_back(p);
        line += "  " + o.search[v].name + ": recall " + std::to_string(p.recall) + " scored " +
                std::to_string(100 * p.scored_fraction) + "% " + std::to_string(p.us_per_query) + " us (cpu " +
                std::to_string(p.cpu_us_per_query) + ")";
      }
      log(o, line);
      const Point& p = pts[0].back();
      {
        // Where the misses are (reported variant): the first tokens, the last 1024 of the context, or older.
        int64_t miss[3] = {0, 0, 0};
        for (int64_t i = 0; i < m; ++i) {
          std::vector<int32_t> g(gt[size_t(i)]), h(got[0][size_t(i)]);
          std::sort(g.begin(), g.end());
          std::sort(h.begin(), h.end());
          std::vector<int32_t> lost;
          std::set_difference(g.begin(), g.end(), h.begin(), h.end(), std::back_inserter(lost));
          for (int32_t id : lost) ++miss[id < 16 ? 0 : (N - id <= 1024 ? 1 : 2)];
        }
        json::object mb;
        mb["first_16"] = double(miss[0]) / double(m);
        mb["last_1024"] = double(miss[1]) / double(m);
        mb["older"] = double(miss[2]) / double(m);
        r.extra["misses_per_query_L" + std::to_string(L)] = std::move(mb);
        log(o, "    misses/query: first16 " + std::to_string(double(miss[0]) / double(m)) + " last1024 " +
                   std::to_string(double(miss[1]) / double(m)) + " older " + std::to_string(double(miss[2]) / double(m)));
      }
      if (op_index < 0 && p.recall >= o.target_recall) op_index = int(pts[0].size()) - 1;
      if (op_index < 0 || op_index == int(pts[0].size()) - 1) op_ids = std::move(got[0]);
    }
    r.points = pts[0];
    json::array variants;
    for (size_t v = 1; v < nv; ++v) {
      json::object vj;
      vj["name"] = o.search[v].name;
      vj["traversal_codes"] = o.search[v].codes;
      vj["expand_width"] = o.search[v].width;
      vj["rerank"] = o.search[v].rerank;
      vj["code_dims"] = o.search[v].code_dims;
      vj["code_coarse_dims"] = o.search[v].code_coarse_dims;
      vj["patience"] = o.search[v].patience;
      vj["seeds"] = o.search[v].seeds;
      vj["expand_first"] = o.search[v].expand_first;
      vj["full_expand_rank"] = o.search[v].full_expand_rank;
      vj["points"] = to_json(pts[v]);
      variants.push_back(std::move(vj));
    }
    r.extra["search"] = o.search.front().name;
    r.extra["search_variants"] = std::move(variants);
    {
      const GraphInfo gs = projected_graph_info(*index);
      r.extra["code_bytes_per_key"] = double(gs.code_bytes) / double(N);
      r.bytes = index->memory_bytes();  // now with the traversal codes, if a variant used them
    }
    if (op_index < 0) {
      op_index = int(r.points.size()) - 1;
      log(o, "  (target recall not reached; operating point = largest budget)");
    }
    if (has("flat")) {
      // The operating point and the exact flat scan side by side: blocks of
      // 10 queries alternate between them (first 200 queries), so that the
      // ratio does not depend on when the shared machine was busy.
      auto bf = make_brute_force_index(N);
      auto bf_scratch = bf->make_scratch();
      SearchParams fsp;
      fsp.k = o.k;
      SearchParams gsp = sps[0];
      gsp.queue_length = int(r.points[size_t(op_index)].budget);
      const int64_t mt = std::min<int64_t>(m, 200);
      std::vector<double> graph_us, flat_us_rounds, ratios;  // per timing round (--repeat)
      for (int round = 0; round < o.repeat; ++round) {
        double t_graph = 0, t_flat = 0;
        for (int64_t i0 = 0, b = 0; i0 < mt; i0 += 10, ++b) {
          const int64_t i1 = std::min(mt, i0 + 10);
          for (int t = 0; t < 2; ++t) {
            const bool graph_turn = (t + b) % 2 == 0;
            const double t1 = now_seconds();
            for (int64_t i = i0; i < i1; ++i) {
              const float* q = ds.test.data() + size_t(i) * size_t(d);
              if (graph_turn) index->search(q, keys, gsp, *scratch, sr);
              else bf->search(q, keys, fsp, *bf_scratch, sr);
            }
            (graph_turn ? t_graph : t_flat) += now_seconds() - t1;
          }
        }
        graph_us.push_back(t_graph * 1e6 / double(mt));
        flat_us_rounds.push_back(t_flat * 1e6 / double(mt));
        ratios.push_back(t_flat / t_graph);
      }
      json::object pj;
      pj["queries"] = mt;
      pj["queue_length"] = gsp.queue_length;
      pj["graph_us_per_query"] = median(graph_us);
      pj["flat_us_per_query"] = median(flat_us_rounds);
      pj["speedup_vs_flat"] = median(ratios);  // the median round's ratio
      json::array ratio_rounds;
      for (double x : ratios) ratio_rounds.push_back(x);
      pj["speedup_rounds"] = std::move(ratio_rounds);
      r.extra["paired_with_flat"] = pj;
      log(o, "  paired with the flat scan at L=" + std::to_string(gsp.queue_length) + ": graph " +
                 std::to_string(median(graph_us)) + " us, flat " + std::to_string(median(flat_us_rounds)) +
                 " us per query: " + std::to_string(median(ratios)) + "x (median of " + std::to_string(o.repeat) +
                 " rounds)");
    }
    if (o.interleave > 0) {
      // search_many() over N copies of the index (the query heads of a GQA
      // group have one index each over the same keys), N test queries at a
      // time on this thread; results must equal the single searches.
      const int n_jobs = o.interleave;
      std::string image;
      index->serialize(&image);
      std::vector<std::unique_ptr<KeyIndex>> copies;
      std::vector<std::unique_ptr<SearchScratch>> scratches;
      for (int j = 0; j < n_jobs; ++j) {
        copies.push_back(deserialize_index(image));
        scratches.push_back(copies.back()->make_scratch());
      }
      const SearchParams sp = o.search.front().params(o.k, int(r.points[size_t(op_index)].budget));
      std::vector<SearchResult> outs(static_cast<size_t>(n_jobs));
      std::vector<SearchJob> jobs(static_cast<size_t>(n_jobs));
      for (int j = 0; j < n_jobs; ++j) copies[size_t(j)]->search(ds.test.data(), keys, sp, *scratches[size_t(j)], outs[size_t(j)]);
      IdLists got(static_cast<size_t>(m));
      std::vector<int64_t> got_scored(static_cast<size_t>(m));
      const double t1 = now_seconds(), c1 = thread_cpu_seconds();
      for (int64_t i0 = 0; i0 < m; i0 += n_jobs) {
        const int n = int(std::min<int64_t>(n_jobs, m - i0));
        for (int j = 0; j < n; ++j)
          jobs[size_t(j)] = {copies[size_t(j)].get(), ds.test.data() + size_t(i0 + j) * size_t(d), scratches[size_t(j)].get(),
                             &outs[size_t(j)]};
        search_many(jobs.data(), n, keys, sp);
        for (int j = 0; j < n; ++j) {
          got[size_t(i0 + j)] = outs[size_t(j)].ids;
          got_scored[size_t(i0 + j)] = outs[size_t(j)].keys_scored;
        }
      }
      const double us = (now_seconds() - t1) * 1e6 / double(m), cpu_us = (thread_cpu_seconds() - c1) * 1e6 / double(m);
      // The same queries one at a time (same copies, same order), for the check and the ratio.
      bool same = true;
      const double t2 = now_seconds(), c2 = thread_cpu_seconds();
      for (int64_t i = 0; i < m; ++i) {
        const size_t j = size_t(i % n_jobs);
        copies[j]->search(ds.test.data() + size_t(i) * size_t(d), keys, sp, *scratches[j], outs[0]);
        same = same && outs[0].ids == got[size_t(i)] && outs[0].keys_scored == got_scored[size_t(i)];
      }
      const double us_single = (now_seconds() - t2) * 1e6 / double(m),
                   cpu_single = (thread_cpu_seconds() - c2) * 1e6 / double(m);
      json::object ij;
      ij["jobs"] = n_jobs;
      ij["queue_length"] = sp.queue_length;
      ij["throughput_us_per_query"] = us;
      ij["single_us_per_query_same_copies"] = us_single;
      ij["speedup"] = us_single / us;
      ij["throughput_cpu_us_per_query"] = cpu_us;
      ij["single_cpu_us_per_query_same_copies"] = cpu_single;
      ij["identical_to_single_searches"] = same;
      r.extra["interleaved"] = std::move(ij);
      log(o, "  search_many x" + std::to_string(n_jobs) + " at L=" + std::to_string(sp.queue_length) + ": " +
                 std::to_string(us) + " us/query throughput (single " + std::to_string(us_single) + " us/query, " +
                 std::to_string(us_single / us) + "x; cpu " + std::to_string(cpu_us) + " vs " +
                 std::to_string(cpu_single) + "); identical results: " + (same ? "yes" : "NO"));
    }
    const Point& op = r.points[size_t(op_index)];
    operating["method"] = r.name;
    operating["queue_length"] = op.budget;
    operating["recall"] = op.recall;
    operating["scored_fraction"] = op.scored_fraction;
    operating["us_per_query"] = op.us_per_query;
    if (r.extra.contains("paired_with_flat"))
      operating["paired_speedup_vs_flat"] = r.extra["paired_with_flat"].as_object().at("speedup_vs_flat");
    operating["meets_recall_and_budget"] = op.recall >= o.target_recall && op.scored_fraction <= o.target_scored;
    results.push_back(std::move(r));
  }

  // The baselines run on the key transform of the graph's build and,
  // labelled, on raw keys (and centred ones when the build uses a query
  // metric). Every transform ranks the keys as the raw ones for each query.
  struct BaselineKeys {
    std::string transform;  // "centred", "query_metric_1|2" or "raw"
    std::string suffix;     // of the method name
    std::vector<float> rows, queries;  // keys [N, d], test queries [m, d]; empty: the raw ones
    const float* key_rows(const Dataset& x) const { return rows.empty() ? x.keys.data() : rows.data(); }
    const float* query(const Dataset& x, int64_t i) const {
      return (queries.empty() ? x.test.data() : queries.data()) + size_t(i) * size_t(x.dim);
    }
  };
  // The transforms fitted on the first `fit` keys and training queries (the
  // insert experiment's base), applied to all N keys.
  const auto make_baseline_keys = [&](int64_t fit) {
    std::vector<BaselineKeys> out;
    // All N keys less the mean of the first `fit`, built only where used.
    const auto centred = [&](const char* suffix) {
      return BaselineKeys{"centred", suffix, rows_minus(ds.keys.data(), N, d, column_mean(ds.keys.data(), fit, d)), {}};
    };
    if (o.baseline_keys != "raw") {
      if (o.graph.key_metric != 0) {
        const QueryMetric qm(ds.train.data(), fit, d, o.graph.key_metric == 2, o.graph.key_metric_ridge);
        out.push_back({"query_metric_" + std::to_string(o.graph.key_metric), "", qm.keys(ds.keys.data(), N),
                       qm.queries(ds.test.data(), m)});
        if (o.baseline_keys == "both") out.push_back(centred("_centred_keys"));
      } else {
        out.push_back(centred(""));
      }
    }
    if (o.baseline_keys != "graph") out.push_back({"raw", "_raw_keys", {}, {}});
    return out;
  };
  std::vector<BaselineKeys> baseline_keys;
  if (has("hnsw") || has("ivf")) baseline_keys = make_baseline_keys(N);
  const auto label = [](const BaselineKeys& bk) { return " (" + bk.transform + " keys)"; };

  for (const BaselineKeys& bk : baseline_keys) {
    if (!has("hnsw")) break;
    MethodResult r;
    r.name = "hnswlib_hnsw_ip" + bk.suffix;
    const int M = 16, efc = 100;
    const double t0 = now_seconds();
    HnswIp h(d, N, M, efc, o.seed);
    h.add(bk.key_rows(ds), 0, N, o.graph.threads);
    r.build_seconds = now_seconds() - t0;
    r.bytes = h.bytes();
    r.extra["M"] = M;
    r.extra["ef_construction"] = efc;
    r.extra["key_transform"] = bk.transform;
    log(o, "hnswlib" + label(bk) + ": build " + std::to_string(r.build_seconds) + " s");
    for (int ef : {100, 200, 400, 800, 1600, 3200, 6400, 12800}) {
      Point p = measure(gt, m, o.k, N, [&](int64_t i, std::vector<int32_t>* ids) {
        int64_t scored = 0;
        h.search(bk.query(ds, i), o.k, ef, ids, &scored);
        return scored;
      });
      p.budget_name = "ef";
      p.budget = ef;
      r.points.push_back(p);
      log(o, "  ef=" + std::to_string(ef) + " recall " + std::to_string(p.recall) + " scored " +
                 std::to_string(100 * p.scored_fraction) + "% " + std::to_string(p.us_per_query) + " us/query");
      if (p.recall > 0.99 || p.scored_fraction > 0.5) break;  // past the useful range
    }
    results.push_back(std::move(r));
  }

  for (const BaselineKeys& bk : baseline_keys) {
    if (!has("ivf")) break;
    MethodResult r;
    r.name = "faiss_ivf_flat_ip" + bk.suffix;
    const int nlist = int(std::clamp<int64_t>(int64_t(std::sqrt(double(N)) * 1.5), 16, 1024));
    const double t0 = now_seconds();
    IvfIp ivf(d, nlist, bk.key_rows(ds), N, o.seed, o.graph.threads);
    ivf.add(bk.key_rows(ds), N, o.graph.threads);
    r.build_seconds = now_seconds() - t0;
    r.bytes = ivf.bytes();
    r.extra["nlist"] = nlist;
    r.extra["key_transform"] = bk.transform;
    log(o, "faiss IVF-Flat" + label(bk) + ": build " + std::to_string(r.build_seconds) + " s, nlist " + std::to_string(nlist));
    for (int nprobe : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      if (nprobe > nlist) break;
      Point p = measure(gt, m, o.k, N, [&](int64_t i, std::vector<int32_t>* ids) {
        ivf.search(bk.query(ds, i), o.k, nprobe, ids);
        return int64_t(0);
      });
      double scored = 0;  // counted outside the timing
      for (int64_t i = 0; i < m; ++i) scored += double(ivf.keys_scored(bk.query(ds, i), nprobe));
      p.scored_fraction = scored / double(m) / double(N);
      p.budget_name = "nprobe";
      p.budget = nprobe;
      r.points.push_back(p);
      log(o, "  nprobe=" + std::to_string(nprobe) + " recall " + std::to_string(p.recall) + " scored " +
                 std::to_string(100 * p.scored_fraction) + "% " + std::to_string(p.us_per_query) + " us/query");
      if (p.recall > 0.99) break;
    }
    results.push_back(std::move(r));
  }

  double flat_us = 0;
  if (has("flat")) {
    MethodResult r;
    r.name = "exact_flat_scan";
    auto bf = make_brute_force_index(N);
    auto scratch = bf->make_scratch();
    SearchParams sp;
    sp.k = o.k;
    SearchResult sr;
    // The scan costs the same for every query: time a subset to save machine time.
    const int64_t mt = std::min<int64_t>(m, 200);
    IdLists sub(gt.begin(), gt.begin() + mt);
    Point p = measure(sub, mt, o.k, N, [&](int64_t i, std::vector<int32_t>* ids) {
      bf->search(ds.test.data() + size_t(i) * size_t(d), keys, sp, *scratch, sr);
      *ids = sr.ids;
      return sr.keys_scored;
    });
    p.us_rounds.push_back(p.us_per_query);
    for (int round = 1; round < o.repeat; ++round) {  // timing rounds, median reported like the graph's
      const double t1 = now_seconds();
      for (int64_t i = 0; i < mt; ++i) bf->search(ds.test.data() + size_t(i) * size_t(d), keys, sp, *scratch, sr);
      p.us_rounds.push_back((now_seconds() - t1) * 1e6 / double(mt));
    }
    p.us_per_query = median(p.us_rounds);
    p.budget_name = "all";
    p.budget = 1;
    r.points.push_back(p);
    r.extra["timed_queries"] = mt;
    flat_us = p.us_per_query;
    log(o, "exact flat scan: " + std::to_string(p.us_per_query) + " us/query");
    results.push_back(std::move(r));
  }
  if (flat_us > 0 && operating.contains("us_per_query"))
    operating["speedup_vs_flat"] = flat_us / operating["us_per_query"].as_double();
  if (operating.contains("scored_fraction")) {
    // Recall of the other methods at the same scored fraction (linear
    // interpolation between their sweep points; the first point where the
    // budget is below their smallest one).
    const double s = operating["scored_fraction"].as_double();
    json::object others;
    for (const auto& r : results) {
      if (r.name == "projected_graph" || r.name == "exact_flat_scan" || r.points.empty()) continue;
      double rec = 0;
      bool found = false;
      for (size_t i = 0; i < r.points.size(); ++i) {
        if (r.points[i].scored_fraction >= s) {
          if (i == 0) {
            rec = r.points[0].scored_fraction <= s ? r.points[0].recall : 0.0;
          } else {
            const auto& a = r.points[i - 1];
            const auto& b = r.points[i];
            const double t = (s - a.scored_fraction) / std::max(1e-12, b.scored_fraction - a.scored_fraction);
            rec = a.recall + t * (b.recall - a.recall);
          }
          found = true;
          break;
        }
      }
      if (!found) rec = r.points.back().recall;
      others[r.name] = rec;
    }
    operating["others_recall_at_same_scored_fraction"] = std::move(others);
  }

  // Insert path: build on the context minus the last `insert_fraction`, then
  // insert those tokens one by one with their own queries.
  if (has("graph") && o.insert_fraction > 0) {
    const int64_t base = int64_t(double(N) / (1.0 + o.insert_fraction));
    const double t0 = now_seconds();
    RowStore grow(o.dtype, d);
    grow.reserve(N);
    grow.append_f32(ds.keys.data(), base);
    auto base_index = build_projected_graph(grow.view(), ds.train.data(), base, o.graph);
    const double build_s = now_seconds() - t0;
    std::string base_image;
    base_index->serialize(&base_image);
    const int L = o.insert_queue > 0 ? o.insert_queue : int(operating["queue_length"].as_double());
    // Inserts the last tokens one by one into a copy of the base graph with
    // the given insert parameters, then searches the test queries.
    struct InsertRun {
      double us_per_key = 0, recall_all = 0, recall_new = 0, scored = 0, scored_per_insert = 0, refresh_seconds = 0;
      int64_t n_new = 0;
    };
    // hinted: as the runtime does, each token's insertion reuses the hits of
    // a search for its own query at queue L (the decode step's search, not
    // timed here: decoding pays for it anyway). The runtime's search happens
    // a window earlier; here it sees every token inserted before.
    constexpr int kHints = 32;
    const auto run_inserts = [&](const GraphBuildParams& gp, bool hinted) {
      InsertRun run;
      auto index = deserialize_index(base_image);
      set_insert_params(*index, gp);
      RowStore store(o.dtype, d);
      store.reserve(N);
      store.append_f32(ds.keys.data(), base);
      // The decode step's search and the test searches after the inserts.
      const SearchParams sp = o.search.front().params(o.k, L);
      auto hint_scratch = index->make_scratch();
      SearchResult hint_sr;
      double insert_seconds = 0, refresh_seconds = 0;
      for (int64_t t = base; t < N; ++t) {
        const float* own_query = ds.train.data() + size_t(t) * size_t(d);
        if (hinted) index->search(own_query, store.view(), sp, *hint_scratch, hint_sr);
        const double t1 = now_seconds();
        store.append_f32(ds.keys.data() + size_t(t) * size_t(d), 1);
        if (hinted)
          index->insert_hinted(int32_t(t), own_query, store.view(), hint_sr.ids.data(),
                               int(std::min<size_t>(hint_sr.ids.size(), kHints)));
        else
          index->insert(int32_t(t), own_query, store.view());
        insert_seconds += now_seconds() - t1;
        if (o.insert_refresh > 0 && (t + 1 - base) % o.insert_refresh == 0) {
          const int64_t stride = std::max<int64_t>(1, std::llround(1.0 / o.insert_refresh_sample));
          std::vector<float> rq;
          for (int64_t u = t + 1 - o.insert_refresh; u <= t; u += stride)
            rq.insert(rq.end(), ds.train.data() + size_t(u) * size_t(d), ds.train.data() + size_t(u + 1) * size_t(d));
          const double t2 = now_seconds();
          refresh_projected_graph(*index, store.view(), rq.data(), int64_t(rq.size()) / d, gp);
          refresh_seconds += now_seconds() - t2;
        }
      }
      run.refresh_seconds = refresh_seconds;
      run.us_per_key = insert_seconds * 1e6 / double(N - base);
      const GraphInfo gi = projected_graph_info(*index);
      run.scored_per_insert = double(gi.insert_keys_scored) / double(std::max<int64_t>(1, gi.inserts));
      auto scratch = index->make_scratch();
      SearchResult sr;
      for (int64_t i = 0; i < m; ++i) {
        index->search(ds.test.data() + size_t(i) * size_t(d), store.view(), sp, *scratch, sr);
        const double rr = recall_at(sr.ids, gt[size_t(i)], o.k);
        run.recall_all += rr;
        run.scored += double(sr.keys_scored);
        const auto& g = gt[size_t(i)];
        if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; })) {
          run.recall_new += rr;
          ++run.n_new;
        }
      }
      run.recall_all /= double(m);
      run.recall_new = run.n_new ? run.recall_new / double(run.n_new) : 0.0;
      run.scored = run.scored / double(m) / double(N);
      return run;
    };
    const InsertRun main_run = run_inserts(o.graph, false);
    const InsertRun hinted_run = run_inserts(o.graph, true);
    insert_report["hinted_insert_us_per_key"] = hinted_run.us_per_key;
    insert_report["hinted_insert_keys_scored_per_key"] = hinted_run.scored_per_insert;
    insert_report["hinted_recall_all"] = hinted_run.recall_all;
    insert_report["hinted_recall_queries_with_new_tokens"] = hinted_run.recall_new;
    log(o, "  hinted insert (the decode search's hits reused): " + std::to_string(hinted_run.us_per_key) + " us/key, " +
               std::to_string(hinted_run.scored_per_insert) + " scored/key; recall " +
               std::to_string(hinted_run.recall_all) + " (all), " + std::to_string(hinted_run.recall_new) + " (new)" +
               "; refresh " + std::to_string(hinted_run.refresh_seconds) + " s");
    const double insert_us = main_run.us_per_key;
    const double rec_all = main_run.recall_all, rec_new = main_run.recall_new, scored = main_run.scored;
    const int64_t n_new = main_run.n_new;
    insert_report["refresh_every"] = o.insert_refresh;
    insert_report["refresh_sample"] = o.insert_refresh_sample;
    insert_report["refresh_seconds"] = main_run.refresh_seconds;
    insert_report["refresh_ms_per_inserted_key"] = main_run.refresh_seconds * 1e3 / double(N - base);
    insert_report["hinted_refresh_seconds"] = hinted_run.refresh_seconds;
    insert_report["base_keys"] = base;
    insert_report["inserted_keys"] = N - base;
    insert_report["base_build_seconds"] = build_s;
    insert_report["insert_us_per_key"] = insert_us;
    insert_report["insert_keys_scored_per_key"] = main_run.scored_per_insert;
    insert_report["graph_insert_queue"] = o.graph.insert_queue;
    insert_report["insert_pivots"] = o.graph.insert_pivots;
    insert_report["insert_reverse"] = o.graph.insert_reverse;
    insert_report["insert_key_queue"] = o.graph.insert_key_queue;
    insert_report["queue_length"] = L;
    insert_report["recall_all"] = rec_all;
    insert_report["queries_with_new_tokens_in_top_k"] = n_new;
    insert_report["recall_queries_with_new_tokens"] = rec_new;
    if (!op_ids.empty() && L == int(operating["queue_length"].as_double())) {
      // The same queries against the graph built on the whole context at once.
      double rec_full = 0;
      for (int64_t i = 0; i < m; ++i) {
        const auto& g = gt[size_t(i)];
        if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; }))
          rec_full += recall_at(op_ids[size_t(i)], g, o.k);
      }
      insert_report["recall_same_queries_full_build"] = n_new ? rec_full / double(n_new) : 0.0;
      log(o, "  the same queries on the graph built on the whole context: recall " +
                 std::to_string(n_new ? rec_full / double(n_new) : 0.0));
    }
    json::array sweep;
    for (const auto& c : o.insert_sweep) {
      GraphBuildParams gp = o.graph;
      gp.insert_queue = c[0];
      gp.insert_pivots = c[1];
      gp.insert_reverse = c[2];
      gp.insert_key_queue = c[3];
      for (const bool hinted : {false, true}) {
      const InsertRun r = run_inserts(gp, hinted);
      json::object j;
      j["hinted"] = hinted;
      j["graph_insert_queue"] = c[0];
      j["insert_pivots"] = c[1];
      j["insert_reverse"] = c[2];
      j["insert_key_queue"] = c[3];
      j["insert_us_per_key"] = r.us_per_key;
      j["insert_keys_scored_per_key"] = r.scored_per_insert;
      j["recall_all"] = r.recall_all;
      j["recall_queries_with_new_tokens"] = r.recall_new;
      j["scored_fraction"] = r.scored;
      sweep.push_back(std::move(j));
      log(o, "  insert " + std::to_string(c[0]) + ":" + std::to_string(c[1]) + ":" + std::to_string(c[2]) + ":" + std::to_string(c[3]) + " " +
                 std::to_string(r.us_per_key) + " us/key, " +
                 std::to_string(r.scored_per_insert) + " scored/key; recall " + std::to_string(r.recall_all) + " (all), " +
                 std::to_string(r.recall_new) + " (new), scored " + std::to_string(100 * r.scored) + "%" +
                 (hinted ? " (hinted)" : ""));
      }
    }
    if (!sweep.empty()) insert_report["sweep"] = std::move(sweep);
    insert_report["scored_fraction"] = scored;
    log(o, "insert: " + std::to_string(N - base) + " keys at " + std::to_string(insert_us) + " us/key (" +
               std::to_string(main_run.scored_per_insert) + " keys scored per insert); recall " +
               std::to_string(rec_all) + " (all), " + std::to_string(rec_new) +
               " over " + std::to_string(n_new) + " queries whose top-" + std::to_string(o.k) + " holds new tokens");
  }

  // The insert experiment for hnswlib: built on the same base keys, the rest
  // added one by one on this thread; the transforms are fitted on the base,
  // as the graph's insert path keeps its build's mean (or metric) for new keys.
  if (has("hnsw") && o.insert_fraction > 0) {
    const int64_t base = int64_t(double(N) / (1.0 + o.insert_fraction));
    json::array runs;
    for (const BaselineKeys& bk : make_baseline_keys(base)) {
      const float* rows = bk.key_rows(ds);
      const double t0 = now_seconds();
      HnswIp h(d, N, 16, 100, o.seed);
      h.add(rows, 0, base, o.graph.threads);
      const double build_s = now_seconds() - t0;
      const double t1 = now_seconds();
      for (int64_t t = base; t < N; ++t) h.add(rows + size_t(t) * size_t(d), t, 1, 1);
      const double insert_us = (now_seconds() - t1) * 1e6 / double(N - base);
      json::object run;
      run["method"] = "hnswlib_hnsw_ip" + bk.suffix;
      run["key_transform"] = bk.transform;
      run["base_build_seconds"] = build_s;
      run["insert_us_per_key"] = insert_us;
      json::array points;
      for (int ef : {100, 200, 400, 800, 1600, 3200}) {
        double rec_all = 0, rec_new = 0, scored_sum = 0;
        int64_t n_new = 0;
        std::vector<int32_t> ids;
        for (int64_t i = 0; i < m; ++i) {
          int64_t scored = 0;
          h.search(bk.query(ds, i), o.k, ef, &ids, &scored);
          scored_sum += double(scored);
          const auto& g = gt[size_t(i)];
          const double rr = recall_at(ids, g, o.k);
          rec_all += rr;
          if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; })) {
            rec_new += rr;
            ++n_new;
          }
        }
        json::object pj;
        pj["ef"] = ef;
        pj["recall_all"] = rec_all / double(m);
        pj["recall_queries_with_new_tokens"] = n_new ? rec_new / double(n_new) : 0.0;
        pj["scored_fraction"] = scored_sum / double(m) / double(N);
        log(o, "  hnswlib insert" + label(bk) + " ef=" + std::to_string(ef) + ": recall " + std::to_string(rec_all / double(m)) +
                   " (all), " + std::to_string(n_new ? rec_new / double(n_new) : 0.0) + " (new), scored " +
                   std::to_string(100 * scored_sum / double(m) / double(N)) + "%");
        const bool done = rec_all / double(m) > 0.99 || scored_sum / double(m) / double(N) > 0.5;
        points.push_back(std::move(pj));
        if (done) break;
      }
      log(o, "hnswlib insert" + label(bk) + ": " + std::to_string(N - base) + " keys at " + std::to_string(insert_us) +
                 " us/key");
      run["points"] = std::move(points);
      runs.push_back(std::move(run));
    }
    insert_report["baselines"] = std::move(runs);
  }

  if (!o.dump_ids.empty()) {
    if (op_ids.empty()) usage_error("--dump-ids needs the graph method");
    std::vector<int32_t> flat(size_t(m) * size_t(o.k), -1);
    for (int64_t i = 0; i < m; ++i)
      std::copy(op_ids[size_t(i)].begin(), op_ids[size_t(i)].begin() + std::min<ptrdiff_t>(o.k, ptrdiff_t(op_ids[size_t(i)].size())),
                flat.begin() + std::ptrdiff_t(size_t(i) * size_t(o.k)));
    write_npy(o.dump_ids, NpyType::i32, {m, int64_t(o.k)}, flat.data());
  }
  if (!o.plot.empty()) {
    std::vector<PlotSeries> series;
    for (const auto& r : results) {
      PlotSeries s;
      s.name = r.name;
      for (const auto& p : r.points) s.points.push_back({p.scored_fraction, p.recall});
      series.push_back(std::move(s));
    }
    const std::string title = "recall@" + std::to_string(o.k) + " vs keys scored, " + std::to_string(N) + " keys, d=" +
                              std::to_string(d) + ", " + std::to_string(m) + " test queries";
    write_file_atomic(o.plot, recall_plot_svg(series, title));
  }

  json::object report;
  report["benchmark"] = "index";
  report["machine_info"] = machine_info();
  json::object params;
  params["k"] = o.k;
  params["dtype"] = dtype_name(o.dtype);
  params["degree"] = o.graph.degree;
  params["query_neighbors"] = o.graph.query_neighbors;
  params["sample_fraction"] = o.graph.sample_fraction;
  params["repair_fraction"] = o.graph.repair_fraction;
  params["cooccurrence_order"] = o.graph.cooccurrence_order;
  params["key_metric"] = o.graph.key_metric;
  // The key-to-key transform of the graph's build, which the baselines get.
  params["graph_key_transform"] = o.graph.key_metric == 0 ? std::string(o.graph.center_keys ? "centred" : "raw")
                                                          : "query_metric_" + std::to_string(o.graph.key_metric);
  params["baseline_keys"] = o.baseline_keys;
  params["causal"] = o.graph.causal;
  params["shift_queries"] = o.graph.shift_queries;
  params["shift_span"] = o.graph.shift_span;
  params["rope_base"] = o.graph.rope_base;
  params["rope_interleaved"] = o.graph.rope_interleaved;
  params["key_metric_passes"] = o.graph.key_metric_passes;
  params["insert_queue"] = o.graph.insert_queue;
  params["insert_key_queue"] = o.graph.insert_key_queue;
  params["insert_pivots"] = o.graph.insert_pivots;
  params["insert_reverse"] = o.graph.insert_reverse;
  params["build_threads"] = o.graph.threads;
  params["search_threads"] = 1;
  params["search"] = o.search.front().name;
  params["interleave"] = o.interleave;
  params["target_recall"] = o.target_recall;
  params["target_scored_fraction"] = o.target_scored;
  report["parameters"] = std::move(params);
  report["data"] = ds.describe;
  json::array methods;
  for (const auto& r : results) methods.push_back(to_json(r));
  report["methods"] = std::move(methods);
  if (!operating.empty()) report["operating_point"] = std::move(operating);
  if (!insert_report.empty()) report["insert"] = std::move(insert_report);
  if (o.json) std::printf("%s", to_pretty_json(report).c_str());
  return 0;
}

}  // namespace rattn::bench
