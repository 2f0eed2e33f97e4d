#include "autotune/build_recipe.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "autotune/plan_measure.h"
#include "autotune/plan_tuner.h"
#include "autotune/search_tuner.h"
#include "core/error.h"
#include "dsl/memory_plan.h"
#include "harness/index_harness.h"

namespace rattn {

namespace {
// Runs of consecutive insertions a screen's insertion time is the median of.
constexpr int kInsertRounds = 8;
}  // namespace

std::string BuildRecipe::text() const {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "graph_degree %d, query_neighbors %d, build_sample %g, key_metric %d, traversal_codes %d, "
                "code_dims %d, shift_queries %d, shared_graph %d",
                graph_degree, query_neighbors, build_sample, key_metric, traversal_codes ? 1 : 0, code_dims,
                shift_queries, shared_graph ? 1 : 0);
  return buf;
}

BuildRecipe default_recipe(const RetrievalPlan& plan) {
  const ConcretePlan c = default_concrete_plan(plan);
  return BuildRecipe{c.graph_degree, c.query_neighbors, c.build_sample,   c.key_metric,
                     c.traversal_codes, c.code_dims,    c.shift_queries, c.shared_graph};
}

std::vector<BuildRecipe> recipe_grid(const RetrievalPlan& plan) {
  std::vector<BuildRecipe> grid;
  for (double degree : plan.graph_degree.candidates())
    for (double neighbors : plan.query_neighbors.candidates())
      for (double sample : plan.build_sample.candidates())
        for (double metric : plan.key_metric.candidates())
          for (double codes : plan.traversal_codes.candidates()) {
            // Code dims only shape a walk over codes.
            const std::vector<double> dims =
                codes != 0 ? plan.code_dims.candidates() : std::vector<double>{plan.code_dims.default_value()};
            for (double dim : dims)
              for (double shift : plan.shift_queries.candidates())
                for (double shared : plan.shared_graph.candidates())
                  grid.push_back(BuildRecipe{int(degree), int(neighbors), sample, int(metric), codes != 0, int(dim),
                                             int(shift), shared != 0});
          }
  return grid;
}

Program with_recipe(const Program& program, const BuildRecipe& r) {
  Program p = program;
  RetrievalPlan& pl = p.plan;
  pl.graph_degree = ParamDomain::fixed_value(r.graph_degree);
  pl.query_neighbors = ParamDomain::fixed_value(r.query_neighbors);
  pl.build_sample = ParamDomain::fixed_value(r.build_sample);
  pl.key_metric = ParamDomain::fixed_value(r.key_metric);
  pl.traversal_codes = ParamDomain::fixed_value(r.traversal_codes ? 1 : 0);
  pl.code_dims = ParamDomain::fixed_value(r.code_dims);
  pl.shift_queries = ParamDomain::fixed_value(r.shift_queries);
  pl.shared_graph = ParamDomain::fixed_value(r.shared_graph ? 1 : 0);
  return p;
}

double index_memory_ratio(const Program& program, const BuildRecipe& r, int64_t context) {
  const Program p = with_recipe(program, r);
  if (p.model.max_context > 0) context = std::min(context, p.model.max_context);
  const MemoryPlan mem = plan_memory(p, std::max<int64_t>(context, 1));
  return mem.kv_bytes_offloaded > 0 ? double(mem.index_bytes) / double(mem.kv_bytes_offloaded) : 0.0;
}

RecipeScreen measure_recipe_screen(const MeasureInputs& in, const GroupData& data, int layer, int kv, int top_k,
                                   int64_t index_keys) {
  const Program& program = *in.program;
  const ConcretePlan concrete = default_concrete_plan(program.plan);
  const int G = in.q_heads > 0 ? std::min(in.q_heads, data.group) : data.group, m = in.test_queries;
  const int64_t n = data.tokens - m;
  if (index_keys > n || index_keys <= top_k)
    fail(Status::invalid_argument, "tune: an index of " + std::to_string(index_keys) + " keys for top_k " +
                                       std::to_string(top_k) + " out of " + std::to_string(n));
  RecipeScreen s;
  s.layer = layer;
  s.kv_head = kv;
  s.top_k = top_k;
  s.index_keys = index_keys;
  // As the full measurement builds them: with shared_graph one index from
  // all the group's queries, even when fewer heads are measured.
  const GraphBuildParams bp = for_search_grid(harness::head_build_params(concrete, program.model, layer, in.threads),
                                              decode_search_grid(program.plan, layer));
  const int built = concrete.shared_graph ? data.group : G;
  std::vector<const float*> train, test;
  for (int g = 0; g < built; ++g) {
    train.push_back(data.query(g, 0));
    test.push_back(data.query(g, n));
  }
  std::vector<harness::HeadIndex> heads = harness::build_group(
      data.key_rows(index_keys), train.data(), n, test.data(), built, concrete.shared_graph, bp, m, top_k, &s.build_s);
  heads.resize(size_t(G));

  const QuerySplit split = split_test_queries(m, in.holdout, in.holdout_block);
  std::vector<double> per_key;
  sweep_grid(decode_search_grid(program.plan, layer), top_k, [&](const DecodeSearch& st) {
    const SearchTrial t = evaluate_search(heads, st, concrete, split.tuning, top_k);
    const bool met = recall_lower_bound(t, in.confidence) >= in.min_recall;
    if (t.scored_fraction > 0 && t.us_per_query > 0)
      per_key.push_back(t.us_per_query / (t.scored_fraction * double(index_keys)));
    ++s.settings;
    const bool take = met ? !s.met || t.scored_fraction < s.scored : !s.met && (s.settings == 1 || t.recall > s.recall);
    if (take) {
      s.met = met;
      s.search = st;
      s.recall = t.recall;
      s.scored = t.scored_fraction;
    }
    return SweepStep{met, t.scored_fraction};
  });
  if (!per_key.empty()) {
    std::nth_element(per_key.begin(), per_key.begin() + std::ptrdiff_t(per_key.size() / 2), per_key.end());
    s.us_per_key = per_key[per_key.size() / 2];
  }
  // Screens of recipes are compared with each other: the median of runs.
  s.insert_us = time_insertion(*heads.front().index, data, index_keys, m, kInsertRounds);
  return s;
}

boost::json::value recipe_screen_to_json(const RecipeScreen& s) {
  return boost::json::object{{"layer", s.layer},
                             {"kv_head", s.kv_head},
                             {"top_k", s.top_k},
                             {"index_keys", s.index_keys},
                             {"met", s.met},
                             {"search",
                              {{"queue", s.search.queue},
                               {"patience", s.search.patience},
                               {"seeds", s.search.seeds},
                               {"expand_first", s.search.expand_first},
                               {"full_expand", s.search.full_expand}}},
                             {"recall", s.recall},
                             {"scored", s.scored},
                             {"us_per_key", s.us_per_key},
                             {"insert_us", s.insert_us},
                             {"build_s", s.build_s},
                             {"settings", s.settings}};
}

RecipeScreen recipe_screen_from_json(const boost::json::value& v) {
  try {
    const auto& o = v.as_object();
    auto i = [&](const boost::json::object& from, const char* key) { return int(from.at(key).to_number<int64_t>()); };
    RecipeScreen s;
    s.layer = i(o, "layer");
    s.kv_head = i(o, "kv_head");
    s.top_k = i(o, "top_k");
    s.index_keys = o.at("index_keys").to_number<int64_t>();
    s.met = o.at("met").as_bool();
    const auto& st = o.at("search").as_object();
    s.search = DecodeSearch{i(st, "queue"), i(st, "patience"), i(st, "seeds"), i(st, "expand_first"), i(st, "full_expand")};
    s.recall = o.at("recall").to_number<double>();
    s.scored = o.at("scored").to_number<double>();
    s.us_per_key = o.at("us_per_key").to_number<double>();
    s.insert_us = o.at("insert_us").to_number<double>();
    s.build_s = o.at("build_s").to_number<double>();
    s.settings = i(o, "settings");
    return s;
  } catch (const std::exception& e) {
    fail(Status::corrupt_data, std::string("tuning database: a malformed recipe screen: ") + e.what());
  }
}

bool RecipeResult::met() const {
  return !screens.empty() && std::all_of(screens.begin(), screens.end(), [](const RecipeScreen& s) { return s.met; });
}

double RecipeResult::mean_scored() const {
  double sum = 0;
  for (const RecipeScreen& s : screens) sum += s.scored / double(screens.size());
  return sum;
}

double RecipeResult::mean_keys_scored() const {
  double sum = 0;
  for (const RecipeScreen& s : screens) sum += s.scored * double(s.index_keys) / double(screens.size());
  return sum;
}

double RecipeResult::mean_insert_us() const {
  double sum = 0;
  for (const RecipeScreen& s : screens) sum += s.insert_us / double(screens.size());
  return sum;
}

namespace {

std::string num(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Best first: recipes whose screens met the target, by modelled CPU time;
// then the others by recall; ties keep the grid's order.
void rank(std::vector<size_t>& ids, const std::vector<RecipeResult>& results) {
  auto recall = [&](size_t i) {
    double sum = 0;
    for (const RecipeScreen& s : results[i].screens) sum += s.recall;
    return sum / double(std::max<size_t>(results[i].screens.size(), 1));
  };
  std::stable_sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
    const RecipeResult &ra = results[a], &rb = results[b];
    if (ra.met() != rb.met()) return ra.met();
    if (ra.met()) return ra.score_us < rb.score_us;
    return recall(a) > recall(b);
  });
}

// Keeps the first `keep` of ranked `ids`; the rest are dropped with why.
void drop_after(std::vector<size_t>& ids, size_t keep, std::vector<RecipeResult>& results, const std::string& round,
                const std::string& what) {
  for (size_t j = keep; j < ids.size(); ++j) {
    RecipeResult& r = results[ids[j]];
    r.why_dropped = r.met() ? round + ": modelled CPU time " + num("%.1f", r.score_us) + " us " + what +
                                  ", not among the best " + std::to_string(keep)
                            : round + ": no decode search met the recall target " + what;
  }
  ids.resize(std::min(ids.size(), keep));
}

}  // namespace

int search_recipes(std::vector<RecipeResult>& results, const std::vector<double>& sample_weight, int finalists,
                   double max_memory_ratio, const RecipeSearchHooks& hooks) {
  if (sample_weight.empty()) fail(Status::invalid_argument, "tune: no sampled layer to screen recipes on");
  const size_t finals = size_t(std::max(finalists, 1));
  std::vector<size_t> alive;
  double smallest = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < results.size(); ++i) {
    RecipeResult& r = results[i];
    smallest = std::min(smallest, r.memory_ratio);
    if (max_memory_ratio > 0 && r.memory_ratio > max_memory_ratio)
      r.why_dropped = "index memory " + num("%.3f", r.memory_ratio) + " of the offloaded KV, over --max-index-memory " +
                      num("%g", max_memory_ratio);
    else
      alive.push_back(i);
  }
  if (alive.empty())
    fail(Status::invalid_argument, "tune: no build recipe fits --max-index-memory " + num("%g", max_memory_ratio) +
                                       " (the smallest index needs " + num("%.3f", smallest) + " of the offloaded KV)");
  // Round 3: the full measurement, and the choice.
  auto measure_fully = [&](const std::vector<size_t>& ids) {
    for (size_t i : ids) {
      results[i].round = 3;
      hooks.full(i, results[i]);
    }
    const int chosen = choose_recipe(results);
    for (size_t i : ids)
      if (int(i) != chosen)
        results[i].why_dropped = results[i].feasible ? "round 3: " + num("%.3f", results[i].token_ms) + " ms per token"
                                                     : "round 3: no plan candidate met the constraints";
    return chosen;
  };
  // No more recipes than finalists: nothing to halve.
  if (alive.size() <= finals) return measure_fully(alive);
  // Round 1: every recipe on the first sample.
  for (size_t i : alive) {
    RecipeResult& r = results[i];
    r.round = 1;
    r.screens.push_back(hooks.screen(i, 0));
    r.build_s += r.screens.back().build_s;
  }
  if (hooks.price) hooks.price(results, alive, 0);
  for (size_t i : alive) results[i].score_us = results[i].screens.front().cpu_us;
  rank(alive, results);
  drop_after(alive, std::max(finals, (alive.size() + 1) / 2), results, "round 1", "on the first sampled layer");
  // Round 2: the survivors on every other sample; the score is the whole
  // model's CPU time (each sample weighted by the global layers it stands for).
  for (size_t s = 1; s < sample_weight.size(); ++s) {
    for (size_t i : alive) {
      results[i].screens.push_back(hooks.screen(i, s));
      results[i].build_s += results[i].screens.back().build_s;
    }
    if (hooks.price) hooks.price(results, alive, s);
  }
  for (size_t i : alive) {
    RecipeResult& r = results[i];
    r.round = 2;
    r.score_us = 0;
    for (size_t s = 0; s < sample_weight.size(); ++s) r.score_us += sample_weight[s] * r.screens[s].cpu_us;
  }
  rank(alive, results);
  drop_after(alive, finals, results, "round 2", "over the sampled layers");
  return measure_fully(alive);
}

int choose_recipe(const std::vector<RecipeResult>& results) {
  double fastest = std::numeric_limits<double>::infinity();
  for (const RecipeResult& r : results)
    if (r.round == 3 && r.feasible) fastest = std::min(fastest, r.token_ms);
  int best = -1;
  for (size_t i = 0; i < results.size(); ++i) {
    const RecipeResult& r = results[i];
    if (r.round != 3 || !r.feasible || r.token_ms > fastest * (1 + kTimeTolerance)) continue;
    if (best < 0) {
      best = int(i);
      continue;
    }
    const RecipeResult& b = results[size_t(best)];
    if (r.memory_ratio < b.memory_ratio || (r.memory_ratio == b.memory_ratio && r.token_ms < b.token_ms)) best = int(i);
  }
  return best;
}

}  // namespace rattn
