// The build-recipe search of the pass per hardware (`rattn tune MODEL.ra
// --build`): the recipe grid, successive halving (the ranking it keeps and
// the measurements it never repeats for a dropped recipe), the index-memory
// bound, and a run on a small synthetic model replayed from the database.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "tests/autotune/tiny_options.h"
#include "tests/temp_dir.h"
#include "autotune/build_recipe.h"
#include "autotune/plan_tuner.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "tools/rattn/commands.h"

namespace rattn {
namespace {

namespace fs = std::filesystem;

// Two global layers of 2 query heads on one KV head (3072 tokens in the
// tests); four recipes: graph degree 8 or 16, one graph per query head or
// one shared by the group.
const std::string kModel =
    "model \"Tiny\" { layers = 2; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192; }\n"
    "plan { sinks = 16; window = {256, 1024} default 256; top_k = {32, 64} default 32;\n"
    "  graph_degree = {8, 16} default 16; query_neighbors = 32; build_sample = 1.0; shared_graph = {0, 1} default 0;\n"
    "  search_queue = 40..200 step 40 default 40; }\n";

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("rattn_build_recipe") {}
};

// With the build recipes searched, one finalist.
PlanTuneOptions tiny_options() {
  PlanTuneOptions o = test::tiny_options();
  o.search_build = true;
  o.build_finalists = 1;
  return o;
}

TEST(BuildRecipes, TheGridIsTheProductOfTheBuildDomains) {
  const Program p = parse_program(
      "model \"M\" { layers = 1; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192; }\n"
      "plan { graph_degree = {16, 32} default 32; key_metric = {0, 1} default 0; traversal_codes = {0, 1} default 0;\n"
      "  code_dims = {0, 32} default 0; shift_queries = {0, 64} default 0; shared_graph = {0, 1} default 0; }\n",
      "m.ra");
  const std::vector<BuildRecipe> grid = recipe_grid(p.plan);
  // Code dims only with codes: 2 x 2 x (1 + 2) x 2 x 2.
  ASSERT_EQ(grid.size(), 48u);
  std::set<std::string> texts;
  for (const BuildRecipe& r : grid) {
    texts.insert(r.text());
    if (!r.traversal_codes) {
      EXPECT_EQ(r.code_dims, 0);
    }
  }
  EXPECT_EQ(texts.size(), grid.size());  // no recipe twice
  EXPECT_EQ(grid.front().graph_degree, 16);
  EXPECT_EQ(grid.back().graph_degree, 32);
  EXPECT_TRUE(std::count(grid.begin(), grid.end(), default_recipe(p.plan)) == 1);
  // A recipe fixes its knobs; the plan's defaults become the recipe.
  const BuildRecipe r = grid[17];
  EXPECT_EQ(default_recipe(with_recipe(p, r).plan), r);
  EXPECT_TRUE(with_recipe(p, r).plan.shared_graph.is_fixed());
}

// Index memory over offloaded KV memory, against the formula worked by
// hand: graphs x (4 (degree + 4 extra slots + 1) + 8) bytes per node over
// kv_heads x head_dim x 2 (K and V) x 2 (f16) bytes per token.
TEST(BuildRecipes, IndexMemoryRatioIsTheMemoryPlans) {
  const Program p = parse_program(kModel, "tiny.ra");
  for (const BuildRecipe& r : recipe_grid(p.plan)) {
    const double graphs = r.shared_graph ? 1 : 2;
    const double want = graphs * (4.0 * (r.graph_degree + 4 + 1) + 8) / (1 * 64 * 2 * 2.0);
    EXPECT_NEAR(index_memory_ratio(p, r, 3072), want, 1e-12) << r.text();
    EXPECT_NEAR(index_memory_ratio(p, r, 8192), want, 1e-12) << r.text();
  }
}

// Fake measurements: recipe r's screen on sample s costs cost[r][s]
// (+inf: the recall target not met); its full measurement gives ms[r].
struct FakeSearch {
  std::vector<std::vector<double>> cost;
  std::vector<double> ms;
  std::map<std::pair<size_t, size_t>, int> screened;
  std::map<size_t, int> full;
  RecipeSearchHooks hooks() {
    RecipeSearchHooks h;
    h.screen = [this](size_t r, size_t s) {
      ++screened[{r, s}];
      RecipeScreen sc;
      sc.layer = int(s);
      sc.met = std::isfinite(cost[r][s]);
      sc.cpu_us = cost[r][s];
      sc.recall = sc.met ? 0.95 : 0.5;
      return sc;
    };
    h.full = [this](size_t r, RecipeResult& rr) {
      ++full[r];
      rr.feasible = ms[r] > 0;
      rr.token_ms = ms[r];
    };
    return h;
  }
};

std::vector<RecipeResult> recipes(size_t n, const std::vector<double>& memory = {}) {
  std::vector<RecipeResult> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].recipe.graph_degree = 8 + int(i);
    out[i].memory_ratio = i < memory.size() ? memory[i] : 0.5;
  }
  return out;
}

TEST(BuildRecipes, HalvingKeepsTheBestRankedAndNeverMeasuresADroppedRecipeAgain) {
  const double inf = std::numeric_limits<double>::infinity();
  FakeSearch f;
  // Round 1 (sample 0) ranks 2 < 5 < 0 < 6 < 3 < 7 < 1; 4 misses the target.
  // Round 2 (weights 1, 2, 1) ranks the survivors 6 (70) < 0 (120) < 2 (190) < 5 (230).
  f.cost = {{30, 30, 30}, {90, 1, 1}, {10, 60, 60}, {50, 1, 1},
            {inf, 1, 1}, {20, 70, 70}, {40, 10, 10}, {60, 1, 1}};
  f.ms = {2.0, 0.1, 1.0, 0.1, 0.1, 0.1, 3.0, 0.1};
  std::vector<RecipeResult> rs = recipes(8);
  RecipeSearchHooks hooks = f.hooks();
  // Pricing comes once per sample, after every recipe of the round was
  // screened on it.
  std::vector<std::pair<size_t, size_t>> priced;  // (sample, recipes)
  hooks.price = [&](std::vector<RecipeResult>& results, const std::vector<size_t>& ids, size_t s) {
    for (size_t i : ids) EXPECT_GT(results[i].screens.size(), s) << i;
    priced.emplace_back(s, ids.size());
  };
  const int chosen = search_recipes(rs, {1, 2, 1}, 2, 0, hooks);
  EXPECT_EQ(priced, (std::vector<std::pair<size_t, size_t>>{{0, 8}, {1, 4}, {2, 4}}));
  // Round 1 screened every recipe once on sample 0.
  for (size_t r = 0; r < 8; ++r) EXPECT_EQ((f.screened[{r, 0}]), 1) << r;
  // The best half by round 1 went on: 2, 5, 0, 6; the rest never again.
  const std::set<size_t> survivors{0, 2, 5, 6};
  for (size_t r = 0; r < 8; ++r) {
    const bool kept = survivors.count(r) > 0;
    EXPECT_EQ((f.screened.count({r, 1}) + f.screened.count({r, 2})), kept ? 2u : 0u) << r;
    EXPECT_EQ(rs[r].round >= 2, kept) << r;
    if (!kept) {
      EXPECT_EQ(rs[r].round, 1);
      EXPECT_FALSE(rs[r].why_dropped.empty());
    }
  }
  EXPECT_NE(rs[4].why_dropped.find("recall"), std::string::npos) << rs[4].why_dropped;
  // Round 2 re-ranks on every sample.
  EXPECT_DOUBLE_EQ(rs[0].score_us, 30 + 2 * 30 + 30);
  EXPECT_DOUBLE_EQ(rs[6].score_us, 40 + 2 * 10 + 10);
  EXPECT_EQ(f.full.size(), 2u);
  EXPECT_EQ(f.full.count(0), 1u);
  EXPECT_EQ(f.full.count(6), 1u);
  EXPECT_EQ(rs[2].round, 2);
  EXPECT_EQ(rs[5].round, 2);
  // The finalists' per-token times decide: 0 (2.0 ms) over 6 (3.0 ms).
  EXPECT_EQ(chosen, 0);
  EXPECT_EQ(rs[0].round, 3);
  EXPECT_TRUE(rs[0].why_dropped.empty());
  EXPECT_NE(rs[6].why_dropped.find("round 3"), std::string::npos);
  for (const auto& [key, n] : f.screened) EXPECT_EQ(n, 1) << key.first << "," << key.second;
}

TEST(BuildRecipes, TheMemoryBoundExcludesARecipeAndTheOtherIsChosen) {
  FakeSearch f;
  f.cost = {{10}, {20}};
  f.ms = {1.0, 1.5};  // recipe 0 is faster but needs twice the memory
  {
    std::vector<RecipeResult> rs = recipes(2, {0.7, 0.35});
    EXPECT_EQ(search_recipes(rs, {2}, 2, 0, f.hooks()), 0);
    EXPECT_TRUE(f.screened.empty());  // two recipes, two finalists: nothing to screen
    EXPECT_EQ(f.full.size(), 2u);
  }
  f.screened.clear();
  f.full.clear();
  std::vector<RecipeResult> rs = recipes(2, {0.7, 0.35});
  EXPECT_EQ(search_recipes(rs, {2}, 2, 0.5, f.hooks()), 1);
  EXPECT_EQ(rs[0].round, 0);
  EXPECT_NE(rs[0].why_dropped.find("memory"), std::string::npos) << rs[0].why_dropped;
  EXPECT_EQ((f.screened.count({0, 0})), 0u);  // an excluded recipe is never measured
  EXPECT_EQ(f.full.count(0), 0u);
  // No recipe fits: an error, not an empty choice.
  std::vector<RecipeResult> none = recipes(2, {0.7, 0.35});
  EXPECT_THROW(search_recipes(none, {2}, 2, 0.1, f.hooks()), Error);
  // As fast within the tolerance: the smaller index wins.
  std::vector<RecipeResult> tie = recipes(2, {0.7, 0.35});
  for (RecipeResult& r : tie) r.round = 3, r.feasible = true;
  tie[0].token_ms = 1.0;
  tie[1].token_ms = 1.0 * (1 + kTimeTolerance / 2);
  EXPECT_EQ(choose_recipe(tie), 1);
  tie[1].token_ms = 1.0 * (1 + 2 * kTimeTolerance);
  EXPECT_EQ(choose_recipe(tie), 0);
}

// The items the database holds, one per line.
std::vector<std::string> db_items(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(std::string(boost::json::parse(line).as_object().at("item").as_string()));
  return out;
}

TEST(PlanTuner, TheBuildSearchReplaysTheDatabaseAndFixesTheChosenRecipe) {
  TempDir dir;
  const Program program = parse_program(kModel, "tiny.ra");
  PlanTuneOptions opt = tiny_options();
  opt.db_path = (dir.path / "db.jsonl").string();
  const TuningRun first = tune_plan(program, opt);
  ASSERT_EQ(first.recipes.size(), 4u);
  std::map<int, int> per_round;
  for (const RecipeResult& r : first.recipes) ++per_round[r.round];
  EXPECT_EQ(per_round, (std::map<int, int>{{1, 2}, {2, 1}, {3, 1}}));
  ASSERT_GE(first.chosen_recipe, 0);
  const RecipeResult& won = first.recipes[size_t(first.chosen_recipe)];
  EXPECT_EQ(won.round, 3);
  // Round 1 kept the recipes its screens ranked best (or that met the target).
  for (const RecipeResult& dropped : first.recipes)
    for (const RecipeResult& kept : first.recipes)
      if (dropped.round == 1 && kept.round >= 2 && dropped.met() && kept.met()) {
        EXPECT_LE(kept.screens.front().cpu_us, dropped.screens.front().cpu_us);
      }
  // What the database holds for each recipe: one screen per sample it
  // reached, and full samples for the finalist only.
  const std::vector<std::string> items = db_items(opt.db_path);
  const std::string plain = default_recipe(program.plan).text();
  for (const RecipeResult& r : first.recipes) {
    int screens = 0, full = 0;
    for (const std::string& item : items) {
      const bool mine = item.size() > r.recipe.text().size() &&
                        item.compare(item.size() - r.recipe.text().size(), std::string::npos, r.recipe.text()) == 0;
      const bool plain_full = r.recipe.text() == plain && item.rfind("layer ", 0) == 0 && item.find(';') == std::string::npos;
      if (mine && item.rfind("screen ", 0) == 0) ++screens;
      if ((mine && item.rfind("layer ", 0) == 0) || plain_full) ++full;
    }
    EXPECT_EQ(screens, r.round == 1 ? 1 : 2) << r.recipe.text();
    EXPECT_EQ(full, r.round == 3 ? 2 : 0) << r.recipe.text();
  }
  // The tuned plan builds with the chosen recipe.
  ASSERT_GE(first.chosen, 0);
  const Program tuned = parse_program(format_program(apply_plan_choice(program, first)), "tuned.ra");
  EXPECT_EQ(default_recipe(tuned.plan), won.recipe);
  EXPECT_TRUE(tuned.plan.graph_degree.is_fixed());
  // Again: every measurement from the database, the same choice.
  const TuningRun second = tune_plan(program, opt);
  EXPECT_EQ(second.db_measured, 0);
  EXPECT_EQ(second.db_reused, first.db_measured + first.db_reused);
  EXPECT_EQ(second.chosen_recipe, first.chosen_recipe);
  ASSERT_EQ(second.chosen, first.chosen);
  EXPECT_DOUBLE_EQ(second.candidates[size_t(second.chosen)].token_ms, first.candidates[size_t(first.chosen)].token_ms);
  for (size_t i = 0; i < first.recipes.size(); ++i) {
    EXPECT_EQ(second.recipes[i].round, first.recipes[i].round);
    EXPECT_EQ(second.recipes[i].why_dropped, first.recipes[i].why_dropped);
  }
  // A bound between the shared graphs' memory (0.234, 0.359) and the
  // per-head graphs' (0.469, 0.719): only shared graphs are measured and chosen.
  PlanTuneOptions bounded = opt;
  bounded.max_index_memory = 0.4;
  const TuningRun small = tune_plan(program, bounded);
  ASSERT_GE(small.chosen_recipe, 0);
  EXPECT_TRUE(small.recipes[size_t(small.chosen_recipe)].recipe.shared_graph);
  for (const RecipeResult& r : small.recipes) {
    EXPECT_EQ(r.round == 0, !r.recipe.shared_graph) << r.recipe.text();
    EXPECT_NE(r.round, 2) << r.recipe.text();
    if (!r.recipe.shared_graph) {
      EXPECT_TRUE(r.screens.empty());
    }
  }
}

TEST(PlanTuner, TheCommandReportsTheRecipes) {
  TempDir dir;
  const std::string model = (dir.path / "tiny.ra").string();
  write_file_atomic(model, kModel);
  const std::string out = (dir.path / "out").string();
  std::vector<std::string> args = {"tune", model, "--synthetic", "--context", "3072", "--queries", "64",
                                   "--holdout-block", "16", "--min-recall", "0.9", "--max-output-error", "0.2",
                                   "--gpu", "none", "--sample-layers", "1", "--build", "--build-finalists", "1",
                                   "--max-index-memory", "0.4", "--no-db", "--no-library", "--quiet", "-o", out};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  const int rc = cli::tune_main(int(argv.size()), argv.data());
  EXPECT_TRUE(rc == 0 || rc == 3) << rc;
  const std::string report = read_file(out + "/report.md");
  EXPECT_NE(report.find("## The build recipe"), std::string::npos);
  EXPECT_NE(report.find("over --max-index-memory 0.4"), std::string::npos);
  const boost::json::object json = boost::json::parse(read_file(out + "/tuned.json")).as_object();
  ASSERT_TRUE(json.contains("build_recipes"));
  EXPECT_EQ(json.at("build_recipes").as_array().size(), 4u);
  const Program tuned = load_program(out + "/tuned.ra");
  if (rc == 0) {
    EXPECT_TRUE(tuned.plan.shared_graph.is_fixed());
    EXPECT_EQ(tuned.plan.shared_graph.default_value(), 1);
  }
}

}  // namespace
}  // namespace rattn
