// The decode-search tuner on a synthetic calibration directory: its grid,
// its choice (the fewest keys scored among the settings that meet the
// target), the recall it reports (a queue past every key must find the exact
// top-k), the tuned plan it writes, and its refusals.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "autotune/search_tuner.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "runtime/data/calib.h"
#include "runtime/data/synthetic.h"
#include "tools/rattn/commands.h"

namespace rattn {
namespace {

namespace fs = std::filesystem;

constexpr int kTokens = 2400, kDim = 64, kQueries = 64;

// Layer 1 of a 2-layer model (local, global): 2 query heads on one KV head.
const std::string kModel =
    "model \"T\" { layers = 2; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192;"
    " pattern = local(64), global; }\n";

struct CalibDir {
  fs::path path;
  CalibDir() {
    path = fs::temp_directory_path() /
           ("rattn_tune_test_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    SyntheticSpec spec;
    spec.tokens = kTokens;
    spec.head_dim = kDim;
    spec.group = 2;
    spec.seed = 7;
    spec.tokens_per_topic = 128;
    spec.min_target_distance = 256;
    const SyntheticHead h = make_synthetic(spec);
    CalibManifest m;
    m.model = "T";
    m.layers = {1};
    m.num_q_heads = 2;
    m.num_kv_heads = 1;
    m.head_dim = kDim;
    m.tokens = kTokens;
    m.dtype = DType::f32;
    write_calib_manifest(path.string(), m);
    write_calib_layer(path.string(), 1, h.queries.data(), h.keys.data(), h.values.data(), m);
  }
  ~CalibDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const CalibDir& calib() {
  static const CalibDir dir;
  return dir;
}

Program plan(const std::string& body) {
  return parse_program(kModel + "plan { top_k = 20; graph_degree = 16; query_neighbors = 20; " + body + " }", "t.ra");
}

SearchTuneOptions options(double min_recall) {
  SearchTuneOptions o;
  o.min_recall = min_recall;
  o.test_queries = kQueries;
  o.recall_k = 20;
  o.holdout = 0;  // these tests read the choice over every test query
  o.confidence = 0.5;  // and the mean recall itself (recall_margin_test.cpp: the margin)
  return o;
}

const char* kGridPlan = "search_queue = 20..100 step 20; search_seeds = {0, 20};"
                        " layer 1 { search_expand_first = {0, 4}; search_full_expand = 8; }";

TEST(SearchTuner, GridIsTheProductOfTheLayersDomainsWithTheQueueInnermost) {
  const Program p = plan(kGridPlan);
  const auto grid = decode_search_grid(p.plan, 1);
  ASSERT_EQ(grid.size(), 5u * 2u * 2u);
  for (size_t i = 0; i < grid.size(); ++i) {
    EXPECT_EQ(grid[i].queue, 20 * int(i % 5 + 1)) << i;
    EXPECT_EQ(grid[i].full_expand, 8);
    EXPECT_EQ(grid[i].patience, 0);
  }
  EXPECT_EQ(grid[0].seeds, 0);
  EXPECT_EQ(grid[0].expand_first, 0);
  EXPECT_EQ(grid[5].expand_first, 4);
  EXPECT_EQ(grid[10].seeds, 20);
  // Layer 0 has no block: the plan-wide domains (no partial expansion).
  const auto plain = decode_search_grid(p.plan, 0);
  ASSERT_EQ(plain.size(), 10u);
  for (const auto& s : plain) EXPECT_EQ(s.expand_first, 0);
  // Whole lists ignore full_expand: one sweep of them, at its default.
  const Program q = plan("search_queue = 20..100 step 20; search_expand_first = {0, 4};"
                         " search_full_expand = {8, 16} default 16;");
  const auto partial = decode_search_grid(q.plan, 0);
  ASSERT_EQ(partial.size(), 5u * (1u + 2u));
  for (const auto& s : partial) {
    if (s.expand_first == 0) {
      EXPECT_EQ(s.full_expand, 16);
    }
  }
  // The index a grid is measured on has ordered lists exactly when one of
  // its settings expands partially (layer 1's block, not the plan-wide grid).
  GraphBuildParams bp;
  EXPECT_TRUE(for_search_grid(bp, grid).cooccurrence_order);
  EXPECT_TRUE(for_search_grid(bp, partial).cooccurrence_order);
  EXPECT_FALSE(for_search_grid(bp, plain).cooccurrence_order);
  EXPECT_EQ(for_search_grid(bp, plain).degree, bp.degree);  // the rest is the caller's
}

TEST(SearchTuner, ChoosesTheFewestKeysScoredAmongSettingsThatMeetTheTarget) {
  const Program p = plan(kGridPlan);
  const auto tuned = tune_decode_searches(p, calib().path.string(), options(0.9));
  ASSERT_EQ(tuned.size(), 1u);
  const LayerTuning& lt = tuned[0];
  EXPECT_EQ(lt.layer, 1);
  EXPECT_EQ(lt.keys, kTokens - kQueries);
  ASSERT_TRUE(lt.met);
  EXPECT_GE(lt.chosen.recall, 0.9);
  ASSERT_EQ(lt.chosen.head_recall.size(), 2u);
  EXPECT_NEAR(lt.chosen.recall, (lt.chosen.head_recall[0] + lt.chosen.head_recall[1]) / 2, 1e-12);
  for (const SearchTrial& t : lt.trials) {
    EXPECT_GE(t.recall, 0.0);
    EXPECT_LE(t.recall, 1.0);
    EXPECT_GT(t.scored_fraction, 0.0);
    if (t.recall >= 0.9) {
      EXPECT_LE(lt.chosen.scored_fraction, t.scored_fraction);
    }
  }
  // Each queue sweep stops at its first setting that meets the target, or
  // that scores as many keys as the cheapest one met before it.
  double best_met = 2;
  for (size_t i = 0; i < lt.trials.size(); ++i) {
    const SearchTrial& t = lt.trials[i];
    if (i > 0 && lt.trials[i - 1].search.seeds == t.search.seeds &&
        lt.trials[i - 1].search.expand_first == t.search.expand_first) {
      EXPECT_LT(lt.trials[i - 1].search.queue, t.search.queue);
      EXPECT_LT(lt.trials[i - 1].recall, 0.9) << "the sweep went on after meeting the target";
      EXPECT_LT(lt.trials[i - 1].scored_fraction, best_met) << "the sweep went on past the cheapest setting met";
    }
    if (t.recall >= 0.9) best_met = std::min(best_met, t.scored_fraction);
  }
  // The pruning loses nothing: with the target at 1, sweeps run on past 0.9
  // (they stop only at recall 1, or at the keys scored of a setting that
  // reached it), and the cheapest of their settings that reach 0.9 is the choice.
  const auto all = tune_decode_searches(p, calib().path.string(), options(1.0));
  double cheapest = 2;
  for (const SearchTrial& t : all[0].trials)
    if (t.recall >= 0.9) cheapest = std::min(cheapest, t.scored_fraction);
  EXPECT_EQ(cheapest, lt.chosen.scored_fraction);
  // Every head at the target costs no less than their mean at it.
  auto strict = options(0.9);
  strict.every_head = true;
  const auto each = tune_decode_searches(p, calib().path.string(), strict);
  ASSERT_TRUE(each[0].met);  // the data are fixed (seed 7): the grid holds such a setting
  EXPECT_GE(*std::min_element(each[0].chosen.head_recall.begin(), each[0].chosen.head_recall.end()), 0.9);
  EXPECT_GE(each[0].chosen.scored_fraction, lt.chosen.scored_fraction);
  // A looser target costs no more.
  const auto loose = tune_decode_searches(p, calib().path.string(), options(0.6));
  EXPECT_LE(loose[0].chosen.scored_fraction, lt.chosen.scored_fraction);
}

// A queue longer than the keys visits every key (all are reachable): the
// reported recall must be exactly 1 and every key scored.
TEST(SearchTuner, ProgressCountsLayersAndEndsAtTheTotal) {
  const Program p = plan(kGridPlan);
  SearchTuneOptions o = options(0.9);
  std::vector<double> done;
  std::vector<double> totals;
  o.progress = [&](double d, double total, const std::string& now) {
    done.push_back(d);
    totals.push_back(total);
    EXPECT_FALSE(now.empty());
  };
  const auto tuned = tune_decode_searches(p, calib().path.string(), o);
  ASSERT_EQ(tuned.size(), 1u);
  // One call after the (one) KV head's build, one per setting measured, one at the layer's end.
  ASSERT_EQ(done.size(), tuned[0].trials.size() + 2);
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(totals[i], 1.0) << i;
    if (i > 0) {
      EXPECT_GE(done[i], done[i - 1]) << i;
    }
    EXPECT_LE(done[i], 1.0 + 1e-12) << i;
  }
  EXPECT_NEAR(done.back(), 1.0, 1e-12);
  // The bar changes nothing tuned.
  const auto plain = tune_decode_searches(p, calib().path.string(), options(0.9));
  ASSERT_EQ(plain[0].trials.size(), tuned[0].trials.size());
  for (size_t i = 0; i < plain[0].trials.size(); ++i)
    EXPECT_EQ(plain[0].trials[i].head_recall, tuned[0].trials[i].head_recall) << i;
}

TEST(SearchTuner, AQueuePastEveryKeyReportsExactRecall) {
  const Program p = plan("search_queue = 4000; search_seeds = {0, 20};");
  const auto tuned = tune_decode_searches(p, calib().path.string(), options(1.0));
  ASSERT_EQ(tuned.size(), 1u);
  ASSERT_EQ(tuned[0].trials.size(), 2u);
  for (const SearchTrial& full : tuned[0].trials) {
    EXPECT_EQ(full.search.queue, 4000);
    EXPECT_EQ(full.recall, 1.0);
    EXPECT_EQ(full.head_recall, (std::vector<double>{1.0, 1.0}));
    EXPECT_EQ(full.scored_fraction, 1.0);
  }
  EXPECT_TRUE(tuned[0].met);
}

TEST(SearchTuner, AnUnreachableTargetChoosesTheBestRecall) {
  const Program p = plan("search_queue = {20, 40}; search_seeds = {0, 20};");
  const auto tuned = tune_decode_searches(p, calib().path.string(), options(1.0));
  const LayerTuning& lt = tuned[0];
  ASSERT_FALSE(lt.met) << "queue 40 found every top-20 key of every test query: pick a harder target";
  ASSERT_EQ(lt.trials.size(), 4u);
  for (const SearchTrial& t : lt.trials) EXPECT_LE(t.recall, lt.chosen.recall);
}

TEST(SearchTuner, TheTunedPlanFixesTheChosenSettingInALayerBlock) {
  const Program p = plan(kGridPlan);
  const auto tuned = tune_decode_searches(p, calib().path.string(), options(0.9));
  const Program back = parse_program(format_program(apply_decode_searches(p, tuned)), "tuned.ra");
  const ConcretePlan c = default_concrete_plan(back.plan);
  const DecodeSearch s = c.decode_search(1), want = tuned[0].chosen.search;
  EXPECT_EQ(s.queue, want.queue);
  EXPECT_EQ(s.seeds, want.seeds);
  EXPECT_EQ(s.expand_first, want.expand_first);
  EXPECT_EQ(s.full_expand, want.full_expand);
  for (const auto& [key, d] : back.plan.layer_search.at(1).params) EXPECT_TRUE(d.is_fixed()) << key;
  EXPECT_EQ(back.plan.search_queue.candidates(), p.plan.search_queue.candidates());  // the rest untouched
}

TEST(SearchTuner, DataThatDoesNotFitThePlanIsRefused) {
  const std::string dir = calib().path.string();
  const Program p = plan("search_queue = 20;");
  auto opts = options(0.9);
  opts.layers = {0};  // a local layer
  EXPECT_THROW(tune_decode_searches(p, dir, opts), Error);
  opts.layers = {3};  // not in the model, nor in the data
  EXPECT_THROW(tune_decode_searches(p, dir, opts), Error);
  opts = options(0.9);
  opts.test_queries = kTokens - 10;  // leaves fewer keys than recall@k needs
  EXPECT_THROW(tune_decode_searches(p, dir, opts), Error);
  opts = options(1.5);
  EXPECT_THROW(tune_decode_searches(p, dir, opts), Error);
  const Program other = parse_program(
      "model \"T\" { layers = 2; q_heads = 4; kv_heads = 1; head_dim = 64; context = 8192; pattern = local(64), global; }",
      "o.ra");
  EXPECT_THROW(tune_decode_searches(other, dir, options(0.9)), Error);
  EXPECT_THROW(tune_decode_searches(p, dir + "/missing", options(0.9)), Error);
}

// --context C tunes on the first C tokens: the same trials as on data
// captured with only C tokens.
TEST(SearchTuner, AContextTunesOnTheDatasFirstTokens) {
  constexpr int64_t kContext = 1600;
  const CalibDir& full = calib();
  const fs::path short_dir = full.path.string() + "_short";
  CalibManifest m = read_calib_manifest(full.path.string());
  const CalibLayer data = read_calib_layer(full.path.string(), m, 1);
  auto prefix = [&](const std::vector<float>& rows, int heads) {
    std::vector<float> out;
    for (int h = 0; h < heads; ++h) {
      const auto head = rows.begin() + std::ptrdiff_t(h) * kTokens * kDim;
      out.insert(out.end(), head, head + kContext * kDim);
    }
    return out;
  };
  m.tokens = kContext;
  write_calib_manifest(short_dir.string(), m);
  write_calib_layer(short_dir.string(), 1, prefix(data.q, 2).data(), prefix(data.k, 1).data(), prefix(data.v, 1).data(),
                    m);

  const Program p = plan("search_queue = 20..100 step 20; search_seeds = {0, 20};");
  SearchTuneOptions opts = options(0.9);
  opts.threads = 1;
  const auto on_short = tune_decode_searches(p, short_dir.string(), opts);
  opts.context = kContext;
  const auto on_prefix = tune_decode_searches(p, full.path.string(), opts);
  opts.context = 0;
  const auto on_all = tune_decode_searches(p, full.path.string(), opts);
  std::error_code ec;
  fs::remove_all(short_dir, ec);

  ASSERT_EQ(on_short.size(), 1u);
  ASSERT_EQ(on_prefix.size(), 1u);
  EXPECT_EQ(on_prefix[0].keys, kContext - kQueries);
  EXPECT_EQ(on_all[0].keys, kTokens - kQueries);
  ASSERT_EQ(on_prefix[0].trials.size(), on_short[0].trials.size());
  for (size_t i = 0; i < on_short[0].trials.size(); ++i) {
    EXPECT_EQ(on_prefix[0].trials[i].search.queue, on_short[0].trials[i].search.queue);
    EXPECT_EQ(on_prefix[0].trials[i].head_recall, on_short[0].trials[i].head_recall);
    EXPECT_EQ(on_prefix[0].trials[i].head_scored_fraction, on_short[0].trials[i].head_scored_fraction);
  }
  // A different context is different data: the first trial scores a different share.
  EXPECT_NE(on_all[0].trials[0].head_scored_fraction, on_prefix[0].trials[0].head_scored_fraction);

  opts.context = kTokens + 1;  // longer than the data
  EXPECT_THROW(tune_decode_searches(p, full.path.string(), opts), Error);
  opts.context = kQueries + 10;  // leaves fewer keys than recall@k needs
  EXPECT_THROW(tune_decode_searches(p, full.path.string(), opts), Error);
}

// The command: exit 0 with every layer met, 3 without; the tuned plan written.
TEST(SearchTuner, CommandWritesTheTunedPlanAndSaysWhetherTheTargetWasMet) {
  const fs::path dir = calib().path;
  const std::string plan_file = (dir / "plan.ra").string(), out = (dir / "tuned.ra").string();
  {
    std::FILE* f = std::fopen(plan_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text = kModel + "plan { top_k = 20; graph_degree = 16; query_neighbors = 20; " + kGridPlan + " }\n";
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  auto run = [&](const std::string& min_recall) {
    std::vector<std::string> args = {"tune", "--plan", plan_file, "--calib", dir.string(), "--queries",
                                     std::to_string(kQueries), "--recall-k", "20", "--min-recall", min_recall,
                                     "-o", out, "--quiet"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    ::testing::internal::CaptureStdout();
    const int rc = cli::tune_main(int(argv.size()), argv.data());
    const std::string printed = ::testing::internal::GetCapturedStdout();
    EXPECT_NE(printed.find("\"chosen\""), std::string::npos);
    return rc;
  };
  EXPECT_EQ(run("0.5"), 0);
  const Program tuned = load_program(out);
  EXPECT_EQ(tuned.plan.layer_search.at(1).params.size(), 5u);
  EXPECT_EQ(run("1"), 3);  // queue 100 cannot find every top-20 key of every query here
  char bad_arg[] = "--min-recall", bad_val[] = "2", name[] = "tune";
  char* argv[] = {name, bad_arg, bad_val};
  EXPECT_THROW(cli::tune_main(3, argv), Error);
}

TEST(SearchTuner, TheSplitAlternatesBlocksAndCoversEveryQueryOnce) {
  const QuerySplit s = split_test_queries(100, 0.5, 32);
  std::vector<int> want_tuning, want_validation;
  for (int i = 0; i < 32; ++i) want_tuning.push_back(i);
  for (int i = 32; i < 64; ++i) want_validation.push_back(i);
  for (int i = 64; i < 96; ++i) want_tuning.push_back(i);
  for (int i = 96; i < 100; ++i) want_validation.push_back(i);
  EXPECT_EQ(s.tuning, want_tuning);
  EXPECT_EQ(s.validation, want_validation);
  EXPECT_EQ(split_test_queries(10, 0, 4).tuning.size(), 10u);
  EXPECT_TRUE(split_test_queries(10, 0, 4).validation.empty());
  EXPECT_THROW(split_test_queries(10, 0.3, 4), Error);
  EXPECT_THROW(split_test_queries(10, 0.5, 0), Error);
}

TEST(SearchTuner, HeldOutQueriesReportTheChoiceTheyNeverSaw) {
  SearchTuneOptions o = options(0.9);
  o.holdout = 0.5;
  o.holdout_block = 16;
  const auto tuned = tune_decode_searches(plan(kGridPlan), calib().path.string(), o);
  ASSERT_EQ(tuned.size(), 1u);
  const LayerTuning& lt = tuned[0];
  ASSERT_TRUE(lt.validated);
  EXPECT_EQ(lt.validation.search.queue, lt.chosen.search.queue);
  EXPECT_EQ(lt.validation.search.seeds, lt.chosen.search.seeds);
  EXPECT_EQ(lt.validation.search.expand_first, lt.chosen.search.expand_first);
  EXPECT_EQ(lt.validation_met, lt.validation.recall >= 0.9);
  // The choice and its "met" come from the tuning part alone: the chosen
  // trial is one of the trials the sweep ran there.
  EXPECT_TRUE(std::any_of(lt.trials.begin(), lt.trials.end(), [&](const SearchTrial& t) {
    return t.search.queue == lt.chosen.search.queue && t.search.seeds == lt.chosen.search.seeds &&
           t.search.expand_first == lt.chosen.search.expand_first && t.recall == lt.chosen.recall;
  }));
  EXPECT_EQ(lt.met, lt.chosen.recall >= 0.9);
  // Unseeded searches do not depend on the order of the queries: the two
  // parts' recalls, weighted by their sizes, are the recall over all of them.
  const Program one = plan("search_queue = 40; search_seeds = 0;");
  const auto whole = tune_decode_searches(one, calib().path.string(), options(0.9));
  const auto parts = tune_decode_searches(one, calib().path.string(), o);
  ASSERT_EQ(whole[0].trials.size(), 1u);
  ASSERT_EQ(parts[0].trials.size(), 1u);
  const QuerySplit split = split_test_queries(kQueries, 0.5, 16);
  const double nt = double(split.tuning.size()), nv = double(split.validation.size());
  for (size_t h = 0; h < whole[0].chosen.head_recall.size(); ++h)
    EXPECT_NEAR(whole[0].chosen.head_recall[h],
                (nt * parts[0].chosen.head_recall[h] + nv * parts[0].validation.head_recall[h]) / (nt + nv), 1e-12)
        << "head " << h;
  EXPECT_FALSE(whole[0].validated);
  o.test_queries = 16;  // one block: nothing left to hold out
  EXPECT_THROW(tune_decode_searches(one, calib().path.string(), o), Error);
}

// With a confidence margin the target holds for the recall less z standard
// errors: the choice clears it, and it costs no less than the mean's choice.
TEST(SearchTuner, AConfidenceMarginChoosesASettingThatClearsIt) {
  const Program p = plan(kGridPlan);
  const auto mean_only = tune_decode_searches(p, calib().path.string(), options(0.9));
  SearchTuneOptions o = options(0.9);
  o.confidence = 0.99;
  const auto guarded = tune_decode_searches(p, calib().path.string(), o);
  ASSERT_TRUE(mean_only[0].met);
  ASSERT_TRUE(guarded[0].met);  // fixed data (seed 7): a setting clears the margin
  const SearchTrial& c = guarded[0].chosen;
  EXPECT_GT(c.recall_se, 0.0);
  EXPECT_GE(recall_lower_bound(c, 0.99), 0.9);
  EXPECT_GE(c.scored_fraction, mean_only[0].chosen.scored_fraction);
  for (const SearchTrial& t : guarded[0].trials)
    if (recall_lower_bound(t, 0.99) >= 0.9) {
      EXPECT_GE(t.scored_fraction, c.scored_fraction);
    }
}

TEST(SearchTuner, BuildGridIsTheProductOfTheBuildDomainsWithTheDegreeOutermost) {
  const Program p = parse_program(
      kModel + "plan { graph_degree = {8, 16}; query_neighbors = {10, 20}; build_sample = {0.5, 1.0}; }", "t.ra");
  const std::vector<BuildSetting> grid = build_grid(p.plan);
  ASSERT_EQ(grid.size(), 8u);
  EXPECT_EQ(grid[0].graph_degree, 8);
  EXPECT_EQ(grid[0].query_neighbors, 10);
  EXPECT_EQ(grid[0].build_sample, 0.5);
  EXPECT_EQ(grid[1].build_sample, 1.0);
  EXPECT_EQ(grid[2].query_neighbors, 20);
  EXPECT_EQ(grid[4].graph_degree, 16);
  EXPECT_EQ(grid[7].graph_degree, 16);
  EXPECT_EQ(grid[7].query_neighbors, 20);
  EXPECT_EQ(grid[7].build_sample, 1.0);
  EXPECT_EQ(build_grid(plan("").plan).size(), 1u);  // fixed knobs: the one build
  // shared_graph, innermost: each setting per query head, then per KV head.
  const std::vector<BuildSetting> shared =
      build_grid(parse_program(kModel + "plan { graph_degree = {8, 16}; shared_graph = {0, 1}; }", "t.ra").plan);
  ASSERT_EQ(shared.size(), 4u);
  EXPECT_FALSE(shared[0].shared_graph);
  EXPECT_TRUE(shared[1].shared_graph);
  EXPECT_EQ(shared[1].graph_degree, 8);
  EXPECT_EQ(shared[2].graph_degree, 16);
}

// Each build setting tunes the layers exactly as a plan with those knobs
// fixed does, and the choice is the cheapest build where every layer met.
TEST(SearchTuner, EachBuildTunesLikeThePlanWithItsKnobsFixedAndTheCheapestMetWins) {
  const std::string searches = "search_queue = 20..100 step 20; search_seeds = {0, 20};";
  const Program p = parse_program(
      kModel + "plan { top_k = 20; graph_degree = {4, 16}; query_neighbors = {10, 20}; " + searches + " }", "t.ra");
  SearchTuneOptions opts = options(0.9);
  opts.threads = 1;
  const PlanTuning tuned = tune_builds_and_searches(p, calib().path.string(), opts);
  ASSERT_EQ(tuned.builds.size(), 4u);
  for (const BuildTuning& b : tuned.builds) {
    const Program fixed = parse_program(kModel + "plan { top_k = 20; graph_degree = " +
                                            std::to_string(b.build.graph_degree) + "; query_neighbors = " +
                                            std::to_string(b.build.query_neighbors) + "; " + searches + " }",
                                        "f.ra");
    const auto alone = tune_decode_searches(fixed, calib().path.string(), opts);
    ASSERT_EQ(b.layers.size(), 1u);
    ASSERT_EQ(b.layers[0].trials.size(), alone[0].trials.size()) << b.build.graph_degree;
    for (size_t i = 0; i < alone[0].trials.size(); ++i) {
      EXPECT_EQ(b.layers[0].trials[i].head_recall, alone[0].trials[i].head_recall);
      EXPECT_EQ(b.layers[0].trials[i].head_scored_fraction, alone[0].trials[i].head_scored_fraction);
    }
    EXPECT_EQ(b.all_met, alone[0].met);
    EXPECT_EQ(b.scored_fraction, alone[0].chosen.scored_fraction);
    EXPECT_GT(b.build_s, 0);
  }
  // Degree 4 and degree 16 lists do not walk alike.
  EXPECT_NE(tuned.builds[0].layers[0].trials[0].head_scored_fraction,
            tuned.builds[2].layers[0].trials[0].head_scored_fraction);
  const BuildTuning& chosen = tuned.builds[tuned.chosen];
  ASSERT_TRUE(chosen.all_met);
  for (const BuildTuning& b : tuned.builds) {
    if (b.all_met) {
      EXPECT_LE(chosen.scored_fraction, b.scored_fraction);
    }
  }

  const Program back = parse_program(format_program(apply_plan_tuning(p, tuned)), "tuned.ra");
  EXPECT_TRUE(back.plan.graph_degree.is_fixed());
  EXPECT_EQ(back.plan.graph_degree.default_value(), chosen.build.graph_degree);
  EXPECT_EQ(back.plan.query_neighbors.default_value(), chosen.build.query_neighbors);
  EXPECT_EQ(default_concrete_plan(back.plan).decode_search(1).queue, chosen.layers[0].chosen.search.queue);
}

TEST(SearchTuner, CommandWithBuildReportsEveryBuildAndWritesTheChosenKnobs) {
  const fs::path dir = calib().path;
  const std::string plan_file = (dir / "build-plan.ra").string(), out = (dir / "build-tuned.ra").string();
  {
    std::FILE* f = std::fopen(plan_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string text =
        kModel + "plan { top_k = 20; graph_degree = {8, 16}; query_neighbors = 20; search_queue = 20..100 step 20; }\n";
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  std::vector<std::string> args = {"tune", "--plan", plan_file, "--calib", dir.string(), "--queries",
                                   std::to_string(kQueries), "--recall-k", "20", "--min-recall", "0.5",
                                   "--build", "-o", out, "--quiet"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const int rc = cli::tune_main(int(argv.size()), argv.data());
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  const auto value = boost::json::parse(printed).as_object();
  const auto& builds = value.at("builds").as_array();
  ASSERT_EQ(builds.size(), 2u);
  int chosen = 0, chosen_degree = 0;
  for (const auto& b : builds)
    if (b.as_object().at("chosen").as_bool()) {
      ++chosen;
      chosen_degree = int(b.as_object().at("graph_degree").as_int64());
    }
  EXPECT_EQ(chosen, 1);
  const Program tuned = load_program(out);
  EXPECT_TRUE(tuned.plan.graph_degree.is_fixed());
  EXPECT_EQ(tuned.plan.graph_degree.default_value(), chosen_degree);
}

}  // namespace
}  // namespace rattn
