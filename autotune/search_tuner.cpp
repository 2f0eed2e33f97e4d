#include "autotune/search_tuner.h"

#include <algorithm>
#include <cmath>

#include "core/clock.h"
#include "core/error.h"
#include "harness/index_harness.h"
#include "runtime/data/calib.h"

namespace rattn {
namespace {

const ParamDomain& domain_of(const RetrievalPlan& plan, int layer, const char* key, const ParamDomain& wide) {
  const auto it = plan.layer_search.find(layer);
  if (it == plan.layer_search.end()) return wide;
  const auto own = it->second.params.find(key);
  return own == it->second.params.end() ? wide : own->second;
}

// On the tuning queries with the confidence margin; held-out figures are
// reported as measured.
bool meets(const SearchTrial& t, const SearchTuneOptions& opt, bool held_out = false) {
  if (!opt.every_head) return (held_out ? t.recall : recall_lower_bound(t, opt.confidence)) >= opt.min_recall;
  return std::all_of(t.head_recall.begin(), t.head_recall.end(), [&](double r) { return r >= opt.min_recall; });
}

bool fewer_keys(const SearchTrial& a, const SearchTrial& b) {
  return a.scored_fraction != b.scored_fraction ? a.scored_fraction < b.scored_fraction : a.us_per_query < b.us_per_query;
}

bool same_but_queue(const DecodeSearch& a, const DecodeSearch& b) {
  return a.patience == b.patience && a.seeds == b.seeds && a.expand_first == b.expand_first &&
         a.full_expand == b.full_expand;
}

}  // namespace

double confidence_z(double confidence) {
  if (!(confidence >= 0.5 && confidence < 1))
    fail(Status::invalid_argument, "tune: confidence must be in [0.5, 1), got " + std::to_string(confidence));
  // P(Z > z) = erfc(z / sqrt 2) / 2 falls with z: bisect for 1 - confidence.
  double lo = 0, hi = 10;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(mid / std::sqrt(2.0)) > 1 - confidence ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double rate_lower_bound(int64_t hits, int64_t n, double confidence) {
  if (n <= 0 || hits < 0 || hits > n) fail(Status::invalid_argument, "rate_lower_bound: needs 0 <= hits <= n, n > 0");
  const double p = double(hits) / double(n);
  const double z = confidence_z(confidence), z2 = z * z, nn = double(n);
  const double centre = p + z2 / (2 * nn);
  const double spread = z * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  return std::max(0.0, (centre - spread) / (1 + z2 / nn));
}

int64_t most_misses_allowed(int64_t n, double min_rate, double confidence) {
  // The bound falls as the misses grow.
  int64_t misses = -1;
  while (misses + 1 <= n && rate_lower_bound(n - (misses + 1), n, confidence) >= min_rate) ++misses;
  return misses;
}

double recall_lower_bound(const SearchTrial& t, double confidence) {
  return t.recall - confidence_z(confidence) * t.recall_se;
}

SearchTrial evaluate_search(const std::vector<harness::HeadIndex>& heads, const DecodeSearch& s,
                            const ConcretePlan& plan, const std::vector<int>& queries, int recall_k,
                            std::vector<harness::IdLists>* ids_out, int recall_depth) {
  SearchTrial t;
  t.search = s;
  if (ids_out) ids_out->assign(heads.size(), {});
  double total_us = 0;
  std::vector<double> query_recall(queries.size(), 0.0);  // mean over the heads
  for (size_t h = 0; h < heads.size(); ++h) {
    const harness::HeadIndex& head = heads[h];
    const SearchParams sp = harness::decode_params(plan, s, recall_k, head.keys.rows);
    const harness::SearchQuality q = harness::measure_search(*head.index, head.keys, head.test, head.exact, sp,
                                                             s.seeds, queries, recall_k,
                                                             ids_out ? &(*ids_out)[h] : nullptr, recall_depth);
    t.head_recall.push_back(q.recall);
    t.head_scored_fraction.push_back(q.scored_fraction);
    total_us += q.us_per_query;
    for (size_t j = 0; j < q.query_recall.size(); ++j) query_recall[j] += q.query_recall[j] / double(heads.size());
  }
  // The standard error from the runs' means.
  std::vector<double> runs;
  for (size_t j = 0; j + kRecallRunLength <= query_recall.size(); j += kRecallRunLength) {
    double sum = 0;
    for (size_t i = j; i < j + kRecallRunLength; ++i) sum += query_recall[i];
    runs.push_back(sum / kRecallRunLength);
  }
  if (runs.size() >= 2) {
    double mean = 0, var = 0;
    for (double r : runs) mean += r / double(runs.size());
    for (double r : runs) var += (r - mean) * (r - mean) / double(runs.size() - 1);
    t.recall_se = std::sqrt(var / double(runs.size()));
  }
  for (size_t i = 0; i < heads.size(); ++i) {
    t.recall += t.head_recall[i] / double(heads.size());
    t.scored_fraction += t.head_scored_fraction[i] / double(heads.size());
  }
  t.us_per_query = total_us / double(heads.size());
  return t;
}

void sweep_grid(const std::vector<DecodeSearch>& grid, int min_queue,
                const std::function<SweepStep(const DecodeSearch&)>& measure) {
  bool sweep_done = false;
  double best_met = 2;  // keys scored of the cheapest setting that met the target
  for (size_t i = 0; i < grid.size(); ++i) {
    const DecodeSearch& s = grid[i];
    if (i == 0 || !same_but_queue(grid[i - 1], s)) sweep_done = false;
    if (sweep_done || s.queue < min_queue) continue;
    const SweepStep step = measure(s);
    if (step.met) best_met = std::min(best_met, step.scored_fraction);
    sweep_done = step.met || step.scored_fraction >= best_met;
  }
}

QuerySplit split_test_queries(int m, double holdout, int block) {
  if (!(holdout == 0 || holdout == 0.5)) fail(Status::invalid_argument, "tune: holdout must be 0 or 0.5");
  if (block < 1) fail(Status::invalid_argument, "tune: holdout_block must be >= 1");
  QuerySplit split;
  for (int i = 0; i < m; ++i) (holdout > 0 && (i / block) % 2 == 1 ? split.validation : split.tuning).push_back(i);
  return split;
}

std::vector<DecodeSearch> decode_search_grid(const RetrievalPlan& plan, int layer) {
  namespace k = plan_keys;
  const auto queue = domain_of(plan, layer, k::search_queue, plan.search_queue).candidates();
  const auto patience = domain_of(plan, layer, k::search_patience, plan.search_patience).candidates();
  const auto seeds = domain_of(plan, layer, k::search_seeds, plan.search_seeds).candidates();
  const auto first = domain_of(plan, layer, k::search_expand_first, plan.search_expand_first).candidates();
  const ParamDomain& full_domain = domain_of(plan, layer, k::search_full_expand, plan.search_full_expand);
  const auto full = full_domain.candidates();
  std::vector<DecodeSearch> grid;
  for (double p : patience)
    for (double s : seeds)
      for (double f : first)
        for (double r : full) {
          // Whole lists (expand_first 0) ignore full_expand: one sweep, at its default.
          if (f == 0 && r != full_domain.default_value()) continue;
          for (double q : queue) grid.push_back(DecodeSearch{int(q), int(p), int(s), int(f), int(r)});
        }
  return grid;
}

GraphBuildParams for_search_grid(GraphBuildParams bp, const std::vector<DecodeSearch>& grid) {
  bp.cooccurrence_order =
      std::any_of(grid.begin(), grid.end(), [](const DecodeSearch& s) { return s.expand_first > 0; });
  return bp;
}

namespace {

// The calibration data checked against the program and the options.
struct TuneInputs {
  CalibManifest man;
  std::vector<int> layers;
  int64_t keys = 0;  // indexed per head: the context's tokens before the test queries
};

TuneInputs check_inputs(const Program& program, const std::string& calib_dir, const SearchTuneOptions& opt) {
  const ModelLayout& model = program.model;
  const CalibManifest man = read_calib_manifest(calib_dir);
  if (man.num_q_heads != model.num_q_heads || man.num_kv_heads != model.num_kv_heads || man.head_dim != model.head_dim)
    fail(Status::invalid_argument, "tune: " + calib_dir + " holds " + std::to_string(man.num_q_heads) + "/" +
                                       std::to_string(man.num_kv_heads) + " heads of dimension " +
                                       std::to_string(man.head_dim) + "; the plan's model has " +
                                       std::to_string(model.num_q_heads) + "/" + std::to_string(model.num_kv_heads) +
                                       " of " + std::to_string(model.head_dim));
  if (!(opt.min_recall >= 0 && opt.min_recall <= 1)) fail(Status::invalid_argument, "tune: min_recall must be in [0, 1]");
  confidence_z(opt.confidence);  // checks it
  if (opt.test_queries < 1 || opt.recall_k < 1) fail(Status::invalid_argument, "tune: test_queries and recall_k must be >= 1");
  if (split_test_queries(opt.test_queries, opt.holdout, opt.holdout_block).tuning.empty())
    fail(Status::invalid_argument, "tune: no test query is left to tune on");
  if (opt.holdout > 0 && opt.test_queries <= opt.holdout_block)
    fail(Status::invalid_argument, "tune: " + std::to_string(opt.test_queries) + " test queries leave none for " +
                                       "validation in blocks of " + std::to_string(opt.holdout_block));
  // T: the stride of a head's rows on disk; used: the prefix tuned for.
  const int64_t T = man.tokens, used = opt.context > 0 ? opt.context : T, m = opt.test_queries, n = used - m;
  if (opt.context < 0 || used > T)
    fail(Status::invalid_argument, "tune: a context of " + std::to_string(opt.context) + " tokens; " + calib_dir +
                                       " holds " + std::to_string(T));
  if (n <= int64_t(opt.recall_k))
    fail(Status::invalid_argument, "tune: " + std::to_string(used) + " calibration tokens leave " + std::to_string(n) +
                                       " keys after " + std::to_string(m) + " test queries; recall@" +
                                       std::to_string(opt.recall_k) + " needs more");
  std::vector<int> layers = opt.layers.empty() ? man.layers : opt.layers;
  for (int layer : layers) {
    if (std::find(man.layers.begin(), man.layers.end(), layer) == man.layers.end())
      fail(Status::invalid_argument, "tune: " + calib_dir + " holds no layer " + std::to_string(layer));
    if (!model.is_global(layer))
      fail(Status::invalid_argument, "tune: layer " + std::to_string(layer) + " is not a global layer of the plan's model");
  }
  return TuneInputs{man, layers, n};
}

// Every layer's decode searches tuned on the indexes `plan` builds; adds
// the builds' wall time to *build_s.
// Progress in layers: a layer's index builds take `build_share` of it (half
// until the first layer measured it), its sweep the rest, a share per
// setting measured (settings the sweep skips are counted at its end).
struct LayerProgress {
  const SearchTuneOptions& opt;
  double total = 1, done = 0, build_share = 0.5;
  bool measured = false;
  void add(double units, const std::string& now) {
    done += units;
    if (opt.progress) opt.progress(done, total, now);
  }
};

std::vector<LayerTuning> tune_layers(const Program& program, const ConcretePlan& plan, const std::string& calib_dir,
                                     const TuneInputs& in, const SearchTuneOptions& opt,
                                     const std::function<void(const std::string&)>& say, double* build_s,
                                     LayerProgress& progress) {
  const ModelLayout& model = program.model;
  const CalibManifest& man = in.man;
  const int64_t T = man.tokens, m = opt.test_queries, n = in.keys;
  const int d = model.head_dim, group = model.group_size();
  const QuerySplit split = split_test_queries(int(m), opt.holdout, opt.holdout_block);
  std::vector<LayerTuning> out;
  for (int layer : in.layers) {
    const double layer_start = progress.done, t_start = seconds_now();
    const std::string name = "layer " + std::to_string(layer);
    const CalibLayer data = read_calib_layer(calib_dir, man, layer);
    const GraphBuildParams bp = for_search_grid(harness::head_build_params(plan, model, layer, opt.threads),
                                                decode_search_grid(program.plan, layer));
    std::vector<harness::HeadIndex> heads;
    for (int kvh = 0; kvh < model.num_kv_heads; ++kvh) {
      std::vector<const float*> train, test;
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        train.push_back(data.q.data() + size_t(h) * size_t(T) * size_t(d));
        test.push_back(train.back() + size_t(n) * size_t(d));
      }
      const RowsView keys{data.k.data() + size_t(kvh) * size_t(T) * size_t(d), DType::f32, n, d};
      say("layer " + std::to_string(layer) + " KV head " + std::to_string(kvh) + ": building " +
          (plan.shared_graph ? "its group's shared index" : "its query heads' indexes") + " of " + std::to_string(n) +
          " keys");
      for (auto& h : harness::build_group(keys, train.data(), n, test.data(), group, plan.shared_graph, bp, m,
                                          opt.recall_k, build_s))
        heads.push_back(std::move(h));
      progress.add(progress.build_share / model.num_kv_heads,
                   name + (kvh + 1 < model.num_kv_heads ? ": index builds" : ": searches"));
    }
    const double t_built = seconds_now();
    LayerTuning lt;
    lt.layer = layer;
    lt.keys = n;
    const std::vector<DecodeSearch> grid = decode_search_grid(program.plan, layer);
    sweep_grid(grid, 0, [&](const DecodeSearch& s) {
      lt.trials.push_back(evaluate_search(heads, s, plan, split.tuning, opt.recall_k));
      const SearchTrial& t = lt.trials.back();
      say("layer " + std::to_string(layer) + ": queue " + std::to_string(s.queue) + " patience " +
          std::to_string(s.patience) + " seeds " + std::to_string(s.seeds) + " expand " + std::to_string(s.expand_first) +
          ":" + std::to_string(s.full_expand) + " -> recall " + std::to_string(t.recall) + ", " +
          std::to_string(100 * t.scored_fraction) + "% scored");
      progress.add((1 - progress.build_share) / double(grid.size()), name + ": searches");
      return SweepStep{meets(t, opt), t.scored_fraction};
    });
    std::vector<const SearchTrial*> meeting;
    for (const SearchTrial& t : lt.trials)
      if (meets(t, opt)) meeting.push_back(&t);
    lt.met = !meeting.empty();
    if (lt.met) {
      lt.chosen = **std::min_element(meeting.begin(), meeting.end(),
                                     [](const SearchTrial* a, const SearchTrial* b) { return fewer_keys(*a, *b); });
    } else {
      lt.chosen = *std::max_element(lt.trials.begin(), lt.trials.end(), [](const SearchTrial& a, const SearchTrial& b) {
        return a.recall != b.recall ? a.recall < b.recall : fewer_keys(b, a);
      });
    }
    if (!split.validation.empty()) {
      lt.validated = true;
      lt.validation = evaluate_search(heads, lt.chosen.search, plan, split.validation, opt.recall_k);
      lt.validation_met = meets(lt.validation, opt, true);
      say("layer " + std::to_string(layer) + ": on the held-out queries recall " +
          std::to_string(lt.validation.recall) + ", " + std::to_string(100 * lt.validation.scored_fraction) +
          "% scored" + (lt.disagrees() ? " (the tuning queries disagree)" : ""));
    }
    out.push_back(std::move(lt));
    progress.add(layer_start + 1 - progress.done, name + " tuned");
    if (!progress.measured) {
      const double t_end = seconds_now();
      progress.build_share = std::clamp((t_built - t_start) / std::max(1e-9, t_end - t_start), 0.05, 0.95);
      progress.measured = true;
    }
  }
  return out;
}

}  // namespace

std::vector<LayerTuning> tune_decode_searches(const Program& program, const std::string& calib_dir,
                                              const SearchTuneOptions& opt,
                                              const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  const TuneInputs in = check_inputs(program, calib_dir, opt);
  double build_s = 0;
  LayerProgress progress{opt, double(in.layers.size())};
  return tune_layers(program, default_concrete_plan(program.plan), calib_dir, in, opt, say, &build_s, progress);
}

std::vector<BuildSetting> build_grid(const RetrievalPlan& plan) {
  std::vector<BuildSetting> grid;
  for (double degree : plan.graph_degree.candidates())
    for (double neighbors : plan.query_neighbors.candidates())
      for (double sample : plan.build_sample.candidates())
        for (double shared : plan.shared_graph.candidates())
          grid.push_back(BuildSetting{int(degree), int(neighbors), sample, shared != 0});
  return grid;
}

PlanTuning tune_builds_and_searches(const Program& program, const std::string& calib_dir,
                                    const SearchTuneOptions& opt,
                                    const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  const TuneInputs in = check_inputs(program, calib_dir, opt);
  PlanTuning out;
  const std::vector<BuildSetting> grid = build_grid(program.plan);
  LayerProgress progress{opt, double(grid.size() * in.layers.size())};
  for (const BuildSetting& b : grid) {
    say("build: graph_degree " + std::to_string(b.graph_degree) + ", query_neighbors " +
        std::to_string(b.query_neighbors) + ", build_sample " + std::to_string(b.build_sample) + ", shared_graph " +
        (b.shared_graph ? "1" : "0"));
    ConcretePlan plan = default_concrete_plan(program.plan);
    plan.graph_degree = b.graph_degree;
    plan.query_neighbors = b.query_neighbors;
    plan.build_sample = b.build_sample;
    plan.shared_graph = b.shared_graph;
    BuildTuning bt;
    bt.build = b;
    bt.layers = tune_layers(program, plan, calib_dir, in, opt, say, &bt.build_s, progress);
    bt.all_met = std::all_of(bt.layers.begin(), bt.layers.end(), [](const LayerTuning& l) { return l.met; });
    for (const LayerTuning& l : bt.layers) {
      bt.scored_fraction += l.chosen.scored_fraction / double(bt.layers.size());
      bt.recall += l.chosen.recall / double(bt.layers.size());
    }
    out.builds.push_back(std::move(bt));
  }
  // Among builds where every layer met: the fewest keys scored (ties: the
  // faster build); when none did, the best mean recall.
  auto better = [](const BuildTuning& a, const BuildTuning& b) {
    if (a.all_met != b.all_met) return a.all_met;
    if (a.all_met) return a.scored_fraction != b.scored_fraction ? a.scored_fraction < b.scored_fraction
                                                                 : a.build_s < b.build_s;
    return a.recall > b.recall;
  };
  for (size_t i = 1; i < out.builds.size(); ++i)
    if (better(out.builds[i], out.builds[out.chosen])) out.chosen = i;
  return out;
}

Program apply_plan_tuning(const Program& program, const PlanTuning& tuned) {
  if (tuned.builds.empty()) return program;
  const BuildTuning& b = tuned.builds[tuned.chosen];
  Program p = apply_decode_searches(program, b.layers);
  p.plan.graph_degree = ParamDomain::fixed_value(b.build.graph_degree);
  p.plan.query_neighbors = ParamDomain::fixed_value(b.build.query_neighbors);
  p.plan.build_sample = ParamDomain::fixed_value(b.build.build_sample);
  p.plan.shared_graph = ParamDomain::fixed_value(b.build.shared_graph ? 1 : 0);
  return p;
}

Program apply_decode_searches(const Program& program, const std::vector<LayerTuning>& tuned) {
  namespace k = plan_keys;
  Program p = program;
  for (const LayerTuning& lt : tuned) {
    const DecodeSearch& s = lt.chosen.search;
    LayerSearchDomains& own = p.plan.layer_search[lt.layer];
    own.params[k::search_queue] = ParamDomain::fixed_value(s.queue);
    own.params[k::search_patience] = ParamDomain::fixed_value(s.patience);
    own.params[k::search_seeds] = ParamDomain::fixed_value(s.seeds);
    own.params[k::search_expand_first] = ParamDomain::fixed_value(s.expand_first);
    own.params[k::search_full_expand] = ParamDomain::fixed_value(s.full_expand);
  }
  return p;
}

}  // namespace rattn
