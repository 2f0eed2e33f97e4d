#pragma once
// The build-recipe search of the pass per hardware (`rattn tune MODEL.ra
// --build`): every setting of the plan's index build domains is a recipe,
// and successive halving spends full measurements only on the few that a
// cheap screen ranks best (docs/autotune.md, "Build recipes").
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "dsl/ir.h"

namespace rattn {

struct MeasureInputs;
struct GroupData;

// One index build recipe: the build knobs the pass searches.
struct BuildRecipe {
  int graph_degree = 32;
  int query_neighbors = 100;
  double build_sample = 1.0;
  int key_metric = 0;
  bool traversal_codes = false;
  int code_dims = 0;
  int shift_queries = 0;
  bool shared_graph = false;

  // "graph_degree 32, query_neighbors 100, ...": the tuning database's item
  // keys carry it.
  std::string text() const;
  bool operator==(const BuildRecipe& o) const { return text() == o.text(); }
};

// The recipe of the plan's defaults.
BuildRecipe default_recipe(const RetrievalPlan& plan);

// The product of the plan's graph_degree, query_neighbors, build_sample,
// key_metric, traversal_codes, code_dims (with traversal codes only),
// shift_queries and shared_graph domains; graph_degree outermost.
std::vector<BuildRecipe> recipe_grid(const RetrievalPlan& plan);

// `program` with the recipe's knobs fixed (its defaults are the recipe).
Program with_recipe(const Program& program, const BuildRecipe& r);

// Index bytes over offloaded KV bytes of the global layers at `context`, as
// dsl/memory_plan estimates them under the recipe.
double index_memory_ratio(const Program& program, const BuildRecipe& r, int64_t context);

// A recipe screened on one sampled layer and KV head: its query heads'
// indexes built over `index_keys` keys, the decode-search grid swept at one
// top_k on the tuning queries, the cheapest setting that met the target.
struct RecipeScreen {
  int layer = 0, kv_head = 0, top_k = 0;
  std::string calib;            // the calibration set's name (set by the caller); "" for synthetic data
  int64_t index_keys = 0;
  bool met = false;
  DecodeSearch search;          // the cheapest that met (else the best recall)
  double recall = 0;            // its recall@top_k, tuning queries
  double scored = 0;            // its keys scored / index_keys
  double us_per_key = 0;        // the sweep's median search time per key scored
  double insert_us = 0;         // one token into one index
  double build_s = 0;           // the group's builds
  double cpu_us = 0;            // the layer's modelled CPU time (set by the caller); +inf when not met
  int settings = 0;             // settings swept
};

RecipeScreen measure_recipe_screen(const MeasureInputs& in, const GroupData& data, int layer, int kv, int top_k,
                                   int64_t index_keys);
boost::json::value recipe_screen_to_json(const RecipeScreen& s);
RecipeScreen recipe_screen_from_json(const boost::json::value& v);

// What the search did with one recipe.
struct RecipeResult {
  BuildRecipe recipe;
  double memory_ratio = 0;
  // 0: excluded (index memory), 1: screened on one layer, 2: on every
  // sampled layer, 3: fully measured.
  int round = 0;
  std::vector<RecipeScreen> screens;  // in the order of the samples
  double score_us = std::numeric_limits<double>::infinity();  // the last round's modelled CPU time
  bool feasible = false;   // round 3: a plan candidate met every constraint
  double token_ms = 0;     // round 3: its best candidate's per-token time
  double build_s = 0;      // every build of this recipe's measurements
  std::string why_dropped;
  bool met() const;        // every screen met the recall target
  double mean_scored() const;
  double mean_keys_scored() const;  // keys scored per search
  double mean_insert_us() const;
};

struct RecipeSearchHooks {
  // Screens recipe r on sample s (an index into the sampled layers and KV
  // heads), from the database or measured.
  std::function<RecipeScreen(size_t r, size_t s)> screen;
  // Sets cpu_us of screens[s] of the recipes `ids`, once all of them were
  // screened on sample s (they may share figures, e.g. the time per key).
  // Absent: the screen's own cpu_us.
  std::function<void(std::vector<RecipeResult>& results, const std::vector<size_t>& ids, size_t s)> price;
  // Fully measures recipe r: sets feasible, token_ms and adds to build_s.
  std::function<void(size_t r, RecipeResult&)> full;
};

// Successive halving over `results` (recipe and memory_ratio set): recipes
// over max_memory_ratio (> 0) are excluded; round 1 screens every other
// recipe on sample 0 and keeps the better half (at least `finalists`);
// round 2 screens those on the other samples (sample weights: the global
// layers each stands for) and keeps `finalists`; round 3 measures them
// fully. With no more recipes than finalists, all go to round 3 unscreened. A recipe is never measured after it was dropped. Returns the
// chosen index (choose_recipe), -1 when no finalist had a feasible plan.
int search_recipes(std::vector<RecipeResult>& results, const std::vector<double>& sample_weight, int finalists,
                   double max_memory_ratio, const RecipeSearchHooks& hooks);

// The best fully measured recipe: the lowest token_ms among the feasible,
// ties within kTimeTolerance going to less index memory; -1 if none.
int choose_recipe(const std::vector<RecipeResult>& results);

}  // namespace rattn
