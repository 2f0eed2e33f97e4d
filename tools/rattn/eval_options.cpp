// `rattn eval`: its help and options.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/rattn/args.h"
#include "tools/rattn/eval.h"

namespace rattn::cli::eval {

extern const char kEvalHelp[];
const char kEvalHelp[] =
    "usage: rattn eval --gguf FILE --text FILE [options]\n"
    "\n"
    "Runs a Gemma-3 GGUF model over the first --tokens tokens of the text and\n"
    "compares, side by side in one run, full attention with rattn on the global\n"
    "layers (through rattn's C API; sliding-window layers stay dense):\n"
    "  - KL divergence of rattn's next-token distribution from full attention's\n"
    "    (mean, p99, max over the steps);\n"
    "  - greedy next-token agreement with full attention at each of those steps,\n"
    "    teacher-forced: both paths see the text's own prefix at every step;\n"
    "  - perplexity of the last --score-tokens tokens (teacher-forced decode) and\n"
    "    its change from full attention with a bootstrap 95% interval over the\n"
    "    scored tokens (seeded: a run reproduces it);\n"
    "  - relative L2 error of the logits against full attention's;\n"
    "  - attention output error of the global layers per decode step, and the\n"
    "    error of the best possible top-k (static set + exact top-k);\n"
    "  - recall@k and share of keys scored, per global layer and query head, of\n"
    "    the attention-aware index on the real decode queries (exact top-k over\n"
    "    the offloaded keys as the oracle);\n"
    "  - the Mahalanobis ratio of decode queries->keys against keys->keys;\n"
    "  - passkey retrieval at --passkey lengths and depths (both modes share the\n"
    "    prompt's prefill).\n"
    "Several rattn plans (--variant) are compared on the same prefill. Partial\n"
    "results are logged to stderr as they complete (and --json is rewritten).\n"
    "Prints one JSON object (also written to --json FILE).\n"
    "\n"
    "options:\n"
    "  --gguf FILE           model (default: $RATTN_GEMMA_GGUF)\n"
    "  --text FILE           English text (e.g. GNU manuals from /usr/share/info)\n"
    "  --tokens N            context length of the text evaluation (default 32768; 0 skips it)\n"
    "  --score-tokens N      scored tail tokens = decode steps (default 256)\n"
    "  --passkey L1,L2,...   passkey prompt lengths in tokens (default none); an item\n"
    "                        L@D1/D2 gives that length its own depths\n"
    "  --depths D1,D2,...    needle depths in [0,1] (default 0.1,0.5,0.9)\n"
    "  --plan FILE|none      rattn plan (default models/gemma3-270m.ra of the source\n"
    "                        tree; none: runtime defaults on an explicit layout)\n"
    "  --sinks N --window N --top-k N --search-queue N   plan overrides\n"
    "  --index graph|exact   rattn's retrieval index (default graph)\n"
    "  --tail-samples N      sampled tail estimate per KV head and step (plan\n"
    "                        override; 0 = off; docs/runtime.md)\n"
    "  --search-seeds N      previous-step results seeding each decode search (plan\n"
    "                        override; 0 = off)\n"
    "  --search-expand-first C --search-full-expand F   partial expansion of the\n"
    "                        decode searches: a candidate expanded below rank F\n"
    "                        scores its first C neighbours only (plan overrides; 0 = off)\n"
    "  --variant SPEC        an extra rattn plan on the same prefill, SPEC =\n"
    "                        key=value,... with keys plan (another DSL plan file,\n"
    "                        e.g. a tuned.ra: its per-layer values too), sinks, window, top_k,\n"
    "                        search_queue, index, tail_samples, search_seeds,\n"
    "                        search_expand_first, search_full_expand, and the\n"
    "                        index build's graph_degree, query_neighbors and\n"
    "                        build_sample (0, 1] (its own indexes); the search\n"
    "                        keys also as KEY@LAYER=V for one global layer\n"
    "                        (search_queue@17=200) (repeatable)\n"
    "  --dump-full FILE      write the token ids and, per scored position, full\n"
    "                        attention's \"pos target argmax nll\" (the format of\n"
    "                        integrations/llama.cpp's rattn-llama-eval)\n"
    "  --check-exact         add a variant whose retrieval returns every offloaded\n"
    "                        token (exact index, unbounded top-k): its logits must\n"
    "                        equal full attention's up to the K/V storage: with f16\n"
    "                        K/V, full attention over fp16-rounded K/V (one more\n"
    "                        teacher-forced pass) measures the rounding's logit\n"
    "                        error; the gate is 1e-4 + 2x that (rel. L2), and an\n"
    "                        argmax flip fails only where full attention's top-2\n"
    "                        margin exceeds 2 x (1e-4 |logit|max + 2x the rounding's\n"
    "                        largest logit error): the report lists the near ties;\n"
    "                        exit status 2 if not\n"
    "  --no-overlap          build the first plan's indexes after the prefill, from\n"
    "                        its Q/K/V; by default a second prefill (layer by\n"
    "                        layer, bit for bit the first) builds each global\n"
    "                        layer's indexes in the background while the later\n"
    "                        layers compute (rattn_sequence_prefill_end_async),\n"
    "                        timed against the first (rattn_prefill_ratio)\n"
    "  --kv-dtype f16|f32    rattn's K/V storage (default f16)\n"
    "  --recall-k N          k of recall@k (default 100)\n"
    "  --threads N           threads (default 2)\n"
    "  --json FILE           also write the result there (atomically)\n"
    "\n"
    "  --topk-grid DIR       instead: on a calibration directory (rattn capture),\n"
    "                        the relative L2 error against full attention of the\n"
    "                        static set + exact top-k, per global layer, for each\n"
    "                        --grid S:W:K (sinks:window:top_k, comma-separated;\n"
    "                        default a small grid), over every 8th of the last\n"
    "                        --grid-positions N positions (default 256), all heads\n";

namespace {

constexpr char kCommand[] = "rattn eval";

double parse_depth(const std::string& x) {
  char* end = nullptr;
  const double d = std::strtod(x.c_str(), &end);
  if (x.empty() || *end || d < 0 || d > 1) usage_fail("rattn eval: error: depths must be numbers in [0, 1], got '" + x + "'");
  return d;
}

// Every item counts, an empty one too (refused by its parser).
std::vector<std::string> items(const std::string& s, char sep) { return split(s, sep, true); }

rattn_index_kind parse_index(const std::string& v, const std::string& opt) {
  if (v == "graph") return RATTN_INDEX_GRAPH;
  if (v == "exact") return RATTN_INDEX_EXACT;
  usage_fail("rattn eval: error: " + opt + " expects graph or exact, got '" + v + "'");
}

Variant parse_variant(const Variant& base, const std::string& spec) {
  Variant v = base;
  v.name = spec;
  for (const std::string& kv : items(spec, ',')) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos)
      usage_fail("rattn eval: error: --variant expects key=value items, got '" + kv + "'");
    const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
    const std::string opt = "--variant " + key;
    if (const size_t at = key.find('@'); at != std::string::npos) {
      // KEY@LAYER: that global layer's own decode search.
      const std::string name = key.substr(0, at);
      const int layer = int(int_arg(kCommand, "--variant " + name + "@LAYER", key.substr(at + 1), 0));
      auto it = std::find_if(v.layer_search.begin(), v.layer_search.end(),
                             [&](const rattn_layer_search& e) { return e.layer == layer; });
      if (it == v.layer_search.end()) it = v.layer_search.insert(v.layer_search.end(), {layer, -1, -1, -1, -1});
      if (name == "search_queue") it->search_queue = int(int_arg(kCommand, opt, val, 1));
      else if (name == "search_seeds") it->search_seeds = int(int_arg(kCommand, opt, val, 0));
      else if (name == "search_expand_first") it->search_expand_first = int(int_arg(kCommand, opt, val, 0));
      else if (name == "search_full_expand") it->search_full_expand = int(int_arg(kCommand, opt, val, 0));
      else usage_fail("rattn eval: error: --variant: '" + name +
                                              "' cannot be set per layer (search_queue, search_seeds, "
                                              "search_expand_first, search_full_expand)");
      continue;
    }
    if (key == "plan") {
      if (val.empty() || !std::ifstream(val)) usage_fail("rattn eval: error: --variant plan: cannot read '" + val + "'");
      v.plan = val;
    } else if (key == "sinks") v.sinks = int(int_arg(kCommand, opt, val, 0));
    else if (key == "window") v.window = int(int_arg(kCommand, opt, val, 1));
    else if (key == "top_k") v.top_k = int(int_arg(kCommand, opt, val, 0));
    else if (key == "search_queue") v.search_queue = int(int_arg(kCommand, opt, val, 1));
    else if (key == "index") v.index = parse_index(val, opt);
    else if (key == "tail_samples") v.tail_samples = int(int_arg(kCommand, opt, val, 0));
    else if (key == "search_seeds") v.search_seeds = int(int_arg(kCommand, opt, val, 0));
    else if (key == "search_expand_first") v.search_expand_first = int(int_arg(kCommand, opt, val, 0));
    else if (key == "search_full_expand") v.search_full_expand = int(int_arg(kCommand, opt, val, 0));
    else if (key == "graph_degree") v.graph_degree = int(int_arg(kCommand, opt, val, 1));
    else if (key == "query_neighbors") v.query_neighbors = int(int_arg(kCommand, opt, val, 1));
    else if (key == "build_sample") {
      const double s = real_arg(kCommand, opt, val);
      if (!(s > 0 && s <= 1)) usage_fail("rattn eval: error: --variant build_sample must be in (0, 1], got '" + val + "'");
      v.build_sample = float(s);
    } else usage_fail("rattn eval: error: --variant: unknown key '" + key +
                      "' (plan, sinks, window, top_k, search_queue, index, tail_samples, search_seeds, "
                      "search_expand_first, search_full_expand, graph_degree, query_neighbors, build_sample)");
  }
  return v;
}

}  // namespace

Options parse_options(int argc, char** argv, bool* help) {
  Options o;
  o.base.name = "plan";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return o;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_fail("rattn eval: error: " + a + " expects a value");
      return argv[++i];
    };
    if (a == "--gguf") o.gguf = value();
    else if (a == "--text") o.text = value();
    else if (a == "--json") o.json_out = value();
    else if (a == "--plan") o.plan = value(), o.plan_set = true;
    else if (a == "--tokens") o.tokens = int_arg(kCommand, a, value(), 0);
    else if (a == "--score-tokens") o.score_tokens = int_arg(kCommand, a, value(), 1);
    else if (a == "--passkey") {
      for (const std::string& item : items(value(), ',')) {
        PasskeyLength pl;
        const size_t at = item.find('@');
        pl.length = int_arg(kCommand, a, item.substr(0, at), 64);
        if (at != std::string::npos)
          for (const std::string& d : items(item.substr(at + 1), '/')) pl.depths.push_back(parse_depth(d));
        o.passkey.push_back(pl);
      }
    } else if (a == "--depths") {
      o.depths.clear();
      for (const std::string& d : items(value(), ',')) o.depths.push_back(parse_depth(d));
    } else if (a == "--sinks") o.base.sinks = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--window") o.base.window = int(int_arg(kCommand, a, value(), 1));
    else if (a == "--top-k") o.base.top_k = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--search-queue") o.base.search_queue = int(int_arg(kCommand, a, value(), 1));
    else if (a == "--index") o.base.index = parse_index(value(), a);
    else if (a == "--tail-samples") o.base.tail_samples = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--search-seeds") o.base.search_seeds = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--search-expand-first") o.base.search_expand_first = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--search-full-expand") o.base.search_full_expand = int(int_arg(kCommand, a, value(), 0));
    else if (a == "--variant") o.variant_specs.push_back(value());
    else if (a == "--check-exact") o.check_exact = true;
    else if (a == "--no-overlap") o.overlap = false;
    else if (a == "--dump-full") o.dump_full = value();
    else if (a == "--topk-grid") o.topk_grid_dir = value();
    else if (a == "--grid-positions") o.grid_positions = int_arg(kCommand, a, value(), 1);
    else if (a == "--grid") {
      o.grid.clear();
      for (const std::string& item : items(value(), ',')) {
        const auto f = items(item, ':');
        if (f.size() != 3) usage_fail("rattn eval: error: --grid expects sinks:window:top_k items, got '" + item + "'");
        o.grid.push_back({int_arg(kCommand, a, f[0], 0), int_arg(kCommand, a, f[1], 1), int_arg(kCommand, a, f[2], 0)});
      }
    }
    else if (a == "--recall-k") o.recall_k = int(int_arg(kCommand, a, value(), 1));
    else if (a == "--threads") o.threads = int(int_arg(kCommand, a, value(), 1));
    else if (a == "--kv-dtype") {
      const std::string v = value();
      if (v == "f16") o.kv = RATTN_F16;
      else if (v == "f32") o.kv = RATTN_F32;
      else usage_fail("rattn eval: error: --kv-dtype expects f16 or f32, got '" + v + "'");
    } else usage_fail("rattn eval: error: unknown option '" + a + "' (see --help)");
  }
  return o;
}

std::vector<Variant> variants_of(const Options& o) {
  std::vector<Variant> out{o.base};
  for (const std::string& spec : o.variant_specs) out.push_back(parse_variant(o.base, spec));
  if (o.check_exact) {
    Variant v = o.base;
    v.name = "exact-check";
    v.index = RATTN_INDEX_EXACT;
    v.top_k = 1 << 30;  // more than any offloaded set: retrieval returns every token
    v.exact_check = true;
    out.push_back(v);
  }
  return out;
}

}  // namespace rattn::cli::eval
