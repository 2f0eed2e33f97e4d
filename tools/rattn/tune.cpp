// `rattn tune --plan FILE.ra --calib DIR [--min-recall R] [-o OUT.ra] ...`
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <boost/json.hpp>

#include "autotune/search_tuner.h"
#include "bench/bench_util.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "dsl/dsl.h"
#include "tools/rattn/args.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {
namespace {

constexpr const char* kUsage =
    "usage: rattn tune --plan FILE.ra --calib DIR [options]\n"
    "       rattn tune MODEL.ra (--calib DIR | --synthetic) -o OUT/ [options]: the whole\n"
    "       pass per hardware (rattn tune MODEL.ra --help)\n"
    "\n"
    "Picks each global layer's decode searches on calibration data (rattn capture):\n"
    "the setting of search_queue, search_patience, search_seeds, search_expand_first\n"
    "and search_full_expand, within the plan's domains (a layer block's, else the\n"
    "plan-wide ones), that scores the fewest keys while the layer's recall@k (the\n"
    "mean over its query heads, or each head's) reaches --min-recall. The index is\n"
    "built as the plan's defaults say (or, with --build, once per build setting),\n"
    "over the keys before the last --queries\n"
    "tokens, whose queries are the test queries (each search seeded with the\n"
    "previous one's results, as in decode). Prints one JSON object: per layer the\n"
    "chosen setting, its recall and keys scored per head, and every setting tried.\n"
    "Exit status 0 when every layer met the target (on the held-out queries, see\n"
    "--holdout), 3 when one did not (its best\n"
    "recall is chosen), 1 on an error.\n"
    "\n"
    "options:\n"
    "  --plan FILE.ra     the plan to tune (docs/dsl.md)\n"
    "  --calib DIR        calibration data of the plan's model\n"
    "  --min-recall R     target recall@k of each layer, in [0, 1] (default 0.95)\n"
    "  --every-head       the target holds for each query head, not their mean\n"
    "  --confidence C     the mean recall less z(C) standard errors must meet the\n"
    "                     target on the tuning queries, one-sided (default 0.95:\n"
    "                     1.645 standard errors; 0.5: the mean itself)\n"
    "  --context N        tune for a context of N tokens: the data's first N (default:\n"
    "                     every token captured)\n"
    "  --queries N        test queries: the last N tokens (default 256)\n"
    "  --holdout H        share of the test queries held out of the choice, 0.5 or 0\n"
    "                     (default 0.5): blocks of --holdout-block consecutive queries\n"
    "                     alternate between tuning and validation; each layer's chosen\n"
    "                     setting is reported on the held-out blocks, which decide\n"
    "                     whether it met the target (and the exit status)\n"
    "  --holdout-block N  queries per block (default 32)\n"
    "  --recall-k K       k of recall@k (default 100)\n"
    "  --layers L1,L2     global layers to tune (default: every one in DIR)\n"
    "  --threads N        index build threads (default 2)\n"
    "  --build            also search the index build knobs graph_degree,\n"
    "                     query_neighbors and build_sample over the plan's domains\n"
    "                     (model-wide: every setting rebuilds every index and tunes\n"
    "                     every layer on it; the fewest keys scored, mean over the\n"
    "                     layers, among the settings where every layer met wins)\n"
    "  -o, --out FILE.ra  write the tuned plan: FILE.ra with each tuned layer's\n"
    "                     search keys fixed in a layer block\n"
    "  --json FILE        also write the JSON there\n"
    "  --quiet            no progress on stderr (otherwise a bar, or plain lines at most\n"
    "                     every 10 s when stderr is not a terminal, and each measurement)\n";

[[noreturn]] void usage_error(const std::string& msg) {
  usage_fail("rattn tune: error: " + msg + " (see rattn tune --help)");
}

// `path` ("" = not asked for) can be created or replaced: its directory
// exists and is writable, and it is not itself a directory.
void check_writable(const std::string& path, const std::string& opt) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) usage_error(opt + " " + path + ": the directory " + dir.string() + " does not exist");
  if (fs::is_directory(path, ec)) usage_error(opt + " " + path + ": is a directory");
  if (::access(dir.c_str(), W_OK) != 0) usage_error(opt + " " + path + ": the directory " + dir.string() + " is not writable");
}

int64_t parse_int(const std::string& s, const std::string& opt, int64_t min) {
  const std::optional<int64_t> v = to_int(s);
  if (!v || *v < min || *v > (1LL << 30))
    usage_error(opt + " expects an integer >= " + std::to_string(min) + ", got '" + s + "'");
  return *v;
}

boost::json::object search_json(const DecodeSearch& s) {
  return {{"search_queue", s.queue},
          {"search_patience", s.patience},
          {"search_seeds", s.seeds},
          {"search_expand_first", s.expand_first},
          {"search_full_expand", s.full_expand}};
}

boost::json::object trial_json(const SearchTrial& t) {
  boost::json::object o = search_json(t.search);
  o["recall"] = t.recall;
  o["recall_se"] = t.recall_se;
  o["scored_fraction"] = t.scored_fraction;
  o["us_per_query"] = t.us_per_query;
  o["head_recall"] = boost::json::value_from(t.head_recall);
  o["head_scored_fraction"] = boost::json::value_from(t.head_scored_fraction);
  return o;
}

}  // namespace

int tune_main(int argc, char** argv) {
  // `rattn tune MODEL.ra ...`: the whole pass per hardware (tune_plan.cpp).
  if (argc > 1 && argv[1][0] != '-') return tune_plan_main(argc, argv);
  std::string plan_path, calib, out_path, json_path;
  SearchTuneOptions opt;
  bool quiet = false, search_build = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--plan") {
      plan_path = value();
    } else if (a == "--calib") {
      calib = value();
    } else if (a == "--min-recall") {
      const std::string v = value();
      char* end = nullptr;
      opt.min_recall = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(opt.min_recall >= 0 && opt.min_recall <= 1))
        usage_error("--min-recall expects a number in [0, 1], got '" + v + "'");
    } else if (a == "--confidence") {
      opt.confidence = real_arg("tune", a, value());
      if (!(opt.confidence >= 0.5 && opt.confidence < 1)) usage_error("--confidence expects a number in [0.5, 1)");
    } else if (a == "--context") {
      opt.context = parse_int(value(), a, 1);
    } else if (a == "--queries") {
      opt.test_queries = int(parse_int(value(), a, 1));
    } else if (a == "--recall-k") {
      opt.recall_k = int(parse_int(value(), a, 1));
    } else if (a == "--holdout") {
      const std::string v = value();
      if (v == "0") opt.holdout = 0;
      else if (v == "0.5") opt.holdout = 0.5;
      else usage_error("--holdout expects 0.5 or 0, got '" + v + "'");
    } else if (a == "--holdout-block") {
      opt.holdout_block = int(parse_int(value(), a, 1));
    } else if (a == "--threads") {
      opt.threads = int(parse_int(value(), a, 1));
    } else if (a == "--layers") {
      const std::string v = value();
      size_t at = 0;
      while (at <= v.size()) {
        const size_t comma = std::min(v.find(',', at), v.size());
        opt.layers.push_back(int(parse_int(v.substr(at, comma - at), a, 0)));
        at = comma + 1;
      }
    } else if (a == "-o" || a == "--out") {
      out_path = value();
    } else if (a == "--json") {
      json_path = value();
    } else if (a == "--build") {
      search_build = true;
    } else if (a == "--every-head") {
      opt.every_head = true;
    } else if (a == "--quiet") {
      quiet = true;
    } else {
      usage_error("unknown option '" + a + "'");
    }
  }
  if (plan_path.empty() || calib.empty()) usage_error("expects --plan FILE.ra and --calib DIR");
  // A tune takes minutes: an output it could not write is refused first.
  check_writable(out_path, "-o");
  check_writable(json_path, "--json");
  const Program program = load_program(plan_path);
  // The bar on stderr, the measurements' lines above it.
  Progress bar("rattn tune", 1, quiet ? nullptr : stderr);
  const auto log = [&](const std::string& s) { bar.note(s); };
  opt.progress = [&](double done, double total, const std::string& now) {
    bar.set_total(total);
    bar.advance(done - bar.done(), now);
  };
  PlanTuning plan_tuning;
  if (search_build) {
    plan_tuning = tune_builds_and_searches(program, calib, opt, log);
  } else {
    // One build, the plan's defaults.
    const ConcretePlan c = default_concrete_plan(program.plan);
    plan_tuning.builds.push_back(BuildTuning{BuildSetting{c.graph_degree, c.query_neighbors, c.build_sample, c.shared_graph},
                                             tune_decode_searches(program, calib, opt, log)});
  }
  const std::vector<LayerTuning>& tuned = plan_tuning.builds[plan_tuning.chosen].layers;
  bar.finish(std::to_string(tuned.size()) + " layers tuned");

  boost::json::object result{{"plan", plan_path},
                             {"calib", calib},
                             {"min_recall", opt.min_recall},
                             {"confidence", opt.confidence},
                             {"every_head", opt.every_head},
                             {"context", tuned.empty() ? opt.context : tuned.front().keys + opt.test_queries},
                             {"test_queries", opt.test_queries},
                             {"holdout", opt.holdout},
                             {"holdout_block", opt.holdout_block},
                             {"recall_k", opt.recall_k}};
  auto layers_json = [](const std::vector<LayerTuning>& layer_tunings) {
    boost::json::array layers;
    for (const LayerTuning& lt : layer_tunings) {
      boost::json::array trials;
      for (const SearchTrial& t : lt.trials) trials.push_back(trial_json(t));
      boost::json::object layer{{"layer", lt.layer},
                                {"keys", lt.keys},
                                {"met", lt.met},
                                {"chosen", trial_json(lt.chosen)},
                                {"trials", std::move(trials)}};
      if (lt.validated) {
        // "met" and "chosen" are on the tuning queries; these on the held-out ones.
        layer["validation"] = trial_json(lt.validation);
        layer["validation_met"] = lt.validation_met;
        layer["parts_disagree"] = lt.disagrees();
      }
      layers.push_back(std::move(layer));
    }
    return layers;
  };
  // Met: on the held-out queries where there are some (what a deployment
  // sees), else on the tuning queries.
  bool all_met = true;
  for (const LayerTuning& lt : tuned) {
    const bool met = lt.validated ? lt.validation_met : lt.met;
    all_met = all_met && met;
    if (!quiet) {
      const DecodeSearch& s = lt.chosen.search;
      std::fprintf(stderr,
                   "rattn tune: layer %d: queue %d, patience %d, seeds %d, expand %d:%d -> recall %.4f at %.2f%% of "
                   "%lld keys scored, %.0f us/search",
                   lt.layer, s.queue, s.patience, s.seeds, s.expand_first, s.full_expand, lt.chosen.recall,
                   100 * lt.chosen.scored_fraction, static_cast<long long>(lt.keys), lt.chosen.us_per_query);
      if (lt.validated)
        std::fprintf(stderr, "; held out: recall %.4f at %.2f%%", lt.validation.recall,
                     100 * lt.validation.scored_fraction);
      std::fprintf(stderr, " (%s)\n", met ? "target met" : "target NOT met");
      if (lt.disagrees())
        std::fprintf(stderr,
                     "rattn tune: layer %d: the tuning and held-out queries disagree (target %s on the tuning "
                     "queries, %s on the held-out ones): more test queries (--queries) make the choice steadier\n",
                     lt.layer, lt.met ? "met" : "missed", lt.validation_met ? "met" : "missed");
    }
  }
  result["layers"] = layers_json(tuned);
  result["all_met"] = all_met;
  if (search_build) {
    // Every build setting with its layers' choices; "layers" above is the chosen build's.
    boost::json::array builds;
    for (size_t i = 0; i < plan_tuning.builds.size(); ++i) {
      const BuildTuning& b = plan_tuning.builds[i];
      if (!quiet)
        std::fprintf(stderr,
                     "rattn tune: build degree %d, query_neighbors %d, sample %g, shared_graph %d: %s, recall %.4f at "
                     "%.2f%% scored (mean of layers), builds %.1f s%s\n",
                     b.build.graph_degree, b.build.query_neighbors, b.build.build_sample, b.build.shared_graph ? 1 : 0,
                     b.all_met ? "every layer met" : "a layer missed", b.recall, 100 * b.scored_fraction, b.build_s,
                     i == plan_tuning.chosen ? " <- chosen" : "");
      builds.push_back(boost::json::object{{"graph_degree", b.build.graph_degree},
                                           {"query_neighbors", b.build.query_neighbors},
                                           {"build_sample", b.build.build_sample},
                                           {"shared_graph", b.build.shared_graph},
                                           {"all_met", b.all_met},
                                           {"recall", b.recall},
                                           {"scored_fraction", b.scored_fraction},
                                           {"build_s", b.build_s},
                                           {"chosen", i == plan_tuning.chosen},
                                           {"layers", layers_json(b.layers)}});
    }
    result["builds"] = std::move(builds);
  }
  if (!out_path.empty()) {
    const Program out = search_build ? apply_plan_tuning(program, plan_tuning) : apply_decode_searches(program, tuned);
    write_file_atomic(out_path,
                      "# Tuned by `rattn tune` from " + plan_path + " on " + calib + "\n" + format_program(out));
    result["out"] = out_path;
  }
  const std::string text = bench::to_pretty_json(result);
  if (!json_path.empty()) write_file_atomic(json_path, text);
  std::fputs(text.c_str(), stdout);
  return all_met ? 0 : 3;
}

}  // namespace rattn::cli
