#pragma once
// The autotuner's first pass: per global layer, the decode-search settings
// (search_queue, search_patience, search_seeds, search_expand_first,
// search_full_expand) that score the fewest keys while the layer's recall@k
// meets a target, measured on calibration data (`rattn capture`) with the
// index the plan's build knobs give. `rattn tune` drives it.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsl/ir.h"
#include "harness/index_harness.h"

namespace rattn {

// Consecutive test queries per run in a recall's standard error.
inline constexpr int kRecallRunLength = 8;

// The one-sided normal quantile of `confidence` in [0.5, 1): the standard
// errors a recall must clear the target by (0.95 -> 1.645).
double confidence_z(double confidence);

struct SearchTuneOptions {
  double min_recall = 0.95;  // the layer's recall@recall_k, averaged over its query heads
  // The recall target is met on the tuning queries at this one-sided
  // confidence (recall_lower_bound); 0.5: the mean itself.
  double confidence = 0.95;
  bool every_head = false;   // instead: each query head's recall@recall_k
  int64_t context = 0;       // use the first this many calibration tokens (a shorter deployment); 0: all of them
  int test_queries = 256;    // the queries of the last this many tokens (of `context`); the index holds the keys before them
  int recall_k = 100;
  // Held-out validation: the test queries are cut into blocks of
  // holdout_block consecutive queries, and every other block (a share of
  // `holdout`, 0.5 or 0) is kept out of the choice: settings are chosen on
  // the rest and the chosen one is reported on them. 0: no hold-out.
  double holdout = 0.5;
  int holdout_block = 32;
  int threads = 2;           // index builds (searches run on one thread, as timed)
  std::vector<int> layers;   // global layers to tune; empty: every one the calibration data holds
  // Progress (done, total, what runs now), in layers tuned (times the build
  // settings searched); called between measurements; may be empty.
  std::function<void(double, double, const std::string&)> progress;
};

struct SearchTrial {
  DecodeSearch search;
  double recall = 0;                    // mean over the layer's query heads
  // The standard error of `recall`, from the means of runs of
  // kRecallRunLength consecutive queries (a seeded search's neighbours are
  // not independent draws, runs nearly are); 0 with fewer than two runs.
  double recall_se = 0;
  std::vector<double> head_recall;
  double scored_fraction = 0;           // keys scored per search / keys indexed, mean over heads
  std::vector<double> head_scored_fraction;
  double us_per_query = 0;              // wall time of one search, one thread
};

// A trial meets a recall target on the tuning queries when its recall less
// confidence_z(confidence) standard errors does: a setting that meets it
// barely on the queries it was chosen on falls short on others about half
// the time.
double recall_lower_bound(const SearchTrial& t, double confidence);

// The one-sided lower bound at `confidence` of a rate seen as `hits` of `n`
// (Wilson's score interval: unlike the mean less z standard errors it stays
// below a rate of 1 seen without a miss). 0.5: hits / n.
double rate_lower_bound(int64_t hits, int64_t n, double confidence);

// The most misses of `n` whose rate_lower_bound still meets `min_rate`; -1
// when not even none does.
int64_t most_misses_allowed(int64_t n, double min_rate, double confidence);

struct LayerTuning {
  int layer = 0;
  int64_t keys = 0;   // keys each head's index holds
  SearchTrial chosen; // the fewest keys scored among the trials that met the target, else the best recall
  bool met = false;
  std::vector<SearchTrial> trials;  // every setting evaluated, in order (on the tuning queries)
  // The chosen setting on the held-out queries (SearchTuneOptions::holdout),
  // which the choice never saw; absent without a hold-out.
  bool validated = false;
  SearchTrial validation;
  bool validation_met = false;
  // The two parts disagree: the target was met on one and not the other.
  bool disagrees() const { return validated && validation_met != met; }
};

// The test queries' split: `tuning` and `validation` hold query indexes in
// [0, m), in order, together each index once. Blocks of `block` consecutive
// queries alternate between the two (the first block tunes), so both parts
// span the whole test range and the seeded searches keep their chains
// within a block. holdout 0: every query tunes.
struct QuerySplit {
  std::vector<int> tuning, validation;
};
QuerySplit split_test_queries(int m, double holdout, int block);

// Setting `s` on every head's test queries `queries` (indexes in order),
// each search seeded as the decode step seeds it (harness::measure_search):
// recall@k and keys scored per head and as means over the heads, the time
// of one search. With ids_out: [head][j] the best recall_k ids of search j.
// recall_depth > 0: recall over the best min(recall_depth, recall_k) ids.
SearchTrial evaluate_search(const std::vector<harness::HeadIndex>& heads, const DecodeSearch& s,
                            const ConcretePlan& plan, const std::vector<int>& queries, int recall_k,
                            std::vector<harness::IdLists>* ids_out = nullptr, int recall_depth = 0);

// What one measured setting of a sweep gave.
struct SweepStep {
  bool met = false;            // the target was met
  double scored_fraction = 0;  // keys scored / keys indexed
};

// Walks `grid` (decode_search_grid's order, the queue innermost and
// ascending), calling measure() on each setting with a queue of at least
// min_queue, except that along the queue a longer queue only scores more:
// a sweep ends at its first setting that meets the target, or that scores
// as many keys as the cheapest setting met so far.
void sweep_grid(const std::vector<DecodeSearch>& grid, int min_queue,
                const std::function<SweepStep(const DecodeSearch&)>& measure);

// Every decode-search setting the plan allows for `layer`: the product of the
// layer block's domains, or the plan-wide ones, ordered with search_queue
// innermost and ascending.
std::vector<DecodeSearch> decode_search_grid(const RetrievalPlan& plan, int layer);

// `bp` for an index the tuner searches with every setting of `grid`: its
// lists ordered by co-occurrence when any of them expands partially (a
// concrete plan's build orders them only for its own searches).
GraphBuildParams for_search_grid(GraphBuildParams bp, const std::vector<DecodeSearch>& grid);

// Tunes each global layer of `program` that `calib_dir` holds (or
// opt.layers). For each setting of the grid, every query head's index is
// searched with each test query in turn (seeded, like the decode step, with
// the previous query's results), and recall@k counts the exact top-k found.
// Along search_queue the sweep stops at the first setting that meets the
// target (a longer queue only scores more). Throws Error(invalid_argument)
// when the data does not fit the model (heads, head_dim, a layer that is not
// global, too few tokens, a context longer than the data).
std::vector<LayerTuning> tune_decode_searches(const Program& program, const std::string& calib_dir,
                                              const SearchTuneOptions& opt,
                                              const std::function<void(const std::string&)>& log = {});

// `program` with a layer block per tuned layer, its search keys fixed to the
// chosen setting (format_program writes it as a .ra file).
Program apply_decode_searches(const Program& program, const std::vector<LayerTuning>& tuned);

// The index build knobs the tuner searches with opt-in (`rattn tune
// --build`): model-wide, so every global layer shares one setting.
struct BuildSetting {
  int graph_degree = 0;
  int query_neighbors = 0;
  double build_sample = 0;
  bool shared_graph = false;  // one graph per KV head (1 / group of the index memory)
};

struct BuildTuning {
  BuildSetting build;
  std::vector<LayerTuning> layers;  // each layer's decode searches tuned on this build
  bool all_met = false;
  double scored_fraction = 0;  // mean over the layers of their chosen setting's keys scored
  double recall = 0;           // mean over the layers of their chosen setting's recall
  double build_s = 0;          // wall time of this setting's index builds
};

struct PlanTuning {
  std::vector<BuildTuning> builds;  // in build_grid order
  size_t chosen = 0;  // the fewest keys scored among builds where every layer met; else the best recall
};

// The product of the plan's graph_degree, query_neighbors, build_sample and
// shared_graph domains, graph_degree outermost.
std::vector<BuildSetting> build_grid(const RetrievalPlan& plan);

// For each setting of build_grid, the indexes are built with it and every
// layer's decode searches tuned as tune_decode_searches does.
PlanTuning tune_builds_and_searches(const Program& program, const std::string& calib_dir,
                                    const SearchTuneOptions& opt,
                                    const std::function<void(const std::string&)>& log = {});

// apply_decode_searches with the chosen build's layers, and the chosen build
// knobs fixed plan-wide.
Program apply_plan_tuning(const Program& program, const PlanTuning& tuned);

}  // namespace rattn
