// The pass on several calibration sets at once: a layer's setting must
// serve every set (the pooled choice meets both sets' constraints where one
// set's own choice misses the other's), samples name their set, the tuning
// database keeps the sets apart, and mismatched sets are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "tests/autotune/tiny_options.h"
#include "tests/temp_dir.h"
#include "autotune/plan_tuner.h"
#include "autotune/tune_report.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "runtime/data/calib.h"
#include "runtime/data/synthetic.h"

namespace rattn {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kTokens = 3072;

// Two global layers of 2 query heads on one KV head; a window of 256 always
// retrieves.
const std::string kModel =
    "model \"Tiny\" { layers = 2; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192; }\n"
    "plan { sinks = 16; window = 256; top_k = {32, 64} default 32;\n"
    "  graph_degree = 16; query_neighbors = 32; build_sample = 1.0; search_queue = 40..200 step 40 default 40; }\n";

// A calibration set of the model's two layers from the synthetic generator.
void write_set(const fs::path& dir, const SyntheticSpec& base, const std::string& model_name = "Tiny", int q_heads = 2,
               int kv_heads = 1) {
  CalibManifest m;
  m.model = model_name;
  m.layers = {0, 1};
  m.num_q_heads = q_heads;
  m.num_kv_heads = kv_heads;
  m.head_dim = 64;
  m.tokens = kTokens;
  m.dtype = DType::f32;
  write_calib_manifest(dir.string(), m);
  for (int layer : m.layers) {
    SyntheticSpec spec = base;
    spec.tokens = kTokens;
    spec.head_dim = 64;
    spec.group = q_heads / kv_heads;
    spec.rope_base = 10000.0;
    spec.seed = base.seed * 31 + uint64_t(layer);
    const SyntheticHead h = make_synthetic(spec);
    std::vector<float> q, k, v;
    for (int kv = 0; kv < kv_heads; ++kv) {
      q.insert(q.end(), h.queries.begin(), h.queries.end());
      k.insert(k.end(), h.keys.begin(), h.keys.end());
      v.insert(v.end(), h.values.begin(), h.values.end());
    }
    write_calib_layer(dir.string(), layer, q.data(), k.data(), v.data(), m);
  }
}

// Set A: the generator's defaults. Set B: its queries target single distant
// keys among noisier ones, which the cheap searches that serve A miss.
SyntheticSpec spec_a() {
  SyntheticSpec s;
  s.seed = 3;
  return s;
}
SyntheticSpec spec_b() {
  SyntheticSpec s;
  s.seed = 5;
  s.tokens_per_topic = 64;
  s.topic_query_fraction = 0.2;
  s.needle_query_fraction = 0.8;
  s.key_only_std = 6.0;
  return s;
}

struct Sets : test::TempDir {
  fs::path a, b;
  Sets() : test::TempDir("rattn_pooled") {
    a = path / "calib-a";
    b = path / "calib-b";
    write_set(a, spec_a());
    write_set(b, spec_b());
  }
};

const Sets& sets() {
  static const Sets s;
  return s;
}

PlanTuneOptions options(const std::vector<fs::path>& dirs) {
  PlanTuneOptions o = test::tiny_options();
  o.synthetic = false;
  o.context = 0;  // the sets' own length
  o.min_recall = 0.94;  // A's cheapest queue meets it on A, not on B's first layer
  for (const fs::path& d : dirs) o.calib_dirs.push_back(d.string());
  return o;
}

const double kZ = 1.6448536269514722;  // confidence 0.95, one-sided

// Whether sample `s` serves setting `x` of the candidate (slot `wi`): a
// setting of x's variant at a queue no longer meets both constraints there.
bool served(const LayerSample& s, const SearchPoint& x, size_t wi, const PlanTuneOptions& opt) {
  for (const SearchPoint& p : s.points)
    if (!p.baseline && p.top_k == x.top_k && p.index_keys == x.index_keys && p.search.patience == x.search.patience &&
        p.search.seeds == x.search.seeds && p.search.expand_first == x.search.expand_first &&
        p.search.full_expand == x.search.full_expand && p.search.queue <= x.search.queue && p.error_tune.size() > wi &&
        p.recall_tune - kZ * p.recall_se_tune >= opt.min_recall && p.error_tune[wi] <= opt.max_output_error)
      return true;
  return false;
}

TEST(PooledCalibration, TheChoiceServesEverySetWhereOneSetsOwnChoiceFailsTheOther) {
  const Program program = parse_program(kModel, "tiny.ra");
  const PlanTuneOptions only_a = options({sets().a}), both = options({sets().a, sets().b}),
                        only_b = options({sets().b});
  const TuningRun a = tune_plan(program, only_a);
  const TuningRun b = tune_plan(program, only_b);
  ASSERT_GE(a.chosen, 0);
  ASSERT_EQ(b.samples.size(), 2u);
  // What makes the test: A's own choice misses B's constraints on some
  // layer (so a pass that ignored B would fail the checks below).
  const PlanCandidate& ca = a.candidates[size_t(a.chosen)];
  bool a_fails_b = false;
  for (const LayerSample& s : b.samples) {
    const SearchPoint* x = ca.layer_point.at(s.layer);
    if (!served(s, *x, b.error_slot(ca.window, ca.tail_samples), only_b)) a_fails_b = true;
  }
  ASSERT_TRUE(a_fails_b) << "set B is too easy: set A's choice serves it";

  const TuningRun t = tune_plan(program, both);
  ASSERT_EQ(t.samples.size(), 4u);  // two layers on two sets
  int on_a = 0, on_b = 0;
  for (const LayerSample& s : t.samples) {
    on_a += s.calib == "calib-a";
    on_b += s.calib == "calib-b";
  }
  EXPECT_EQ(on_a, 2);
  EXPECT_EQ(on_b, 2);
  EXPECT_EQ(t.samples.back().label(), "layer 1 kv 0 (calib-b)");
  ASSERT_GE(t.chosen, 0);
  const PlanCandidate& c = t.candidates[size_t(t.chosen)];
  const size_t wi = t.error_slot(c.window, c.tail_samples);
  for (size_t si = 0; si < t.samples.size(); ++si) {
    const LayerSample& s = t.samples[si];
    EXPECT_TRUE(served(s, *c.layer_point.at(s.layer), wi, both)) << s.label();
    // The validation figures are each sample's own.
    ASSERT_NE(c.sample_point[si], nullptr) << s.label();
    EXPECT_GE(t.validation_error_max, c.sample_point[si]->error_valid[wi]);
    EXPECT_LE(t.validation_recall_min, c.sample_point[si]->recall_valid);
  }
  // The JSON names each sample's set.
  const boost::json::object json = plan_tuning_json(program, both, t);
  const boost::json::array& js = json.at("samples").as_array();
  ASSERT_EQ(js.size(), 4u);
  EXPECT_EQ(js[3].at("calib").as_string(), "calib-b");
  EXPECT_EQ(json.at("chosen").at("samples").as_array().size(), 4u);
  const std::string report = plan_tuning_report(program, both, t, {});
  EXPECT_NE(report.find("layer 0 kv 0 (calib-a)"), std::string::npos);
  EXPECT_NE(report.find("layer 1 kv 0 (calib-b)"), std::string::npos);
}

// With --build, the recipes are screened on each set: the finalist on every
// layer of both.
TEST(PooledCalibration, TheRecipeSearchScreensEverySet) {
  std::string text = kModel;
  text.replace(text.find("graph_degree = 16"), 17, "graph_degree = {12, 16} default 16");
  const Program program = parse_program(text, "tiny-build.ra");
  PlanTuneOptions opt = options({sets().a, sets().b});
  opt.search_build = true;
  opt.build_finalists = 1;
  const TuningRun t = tune_plan(program, opt);
  ASSERT_EQ(t.recipes.size(), 2u);
  ASSERT_GE(t.chosen_recipe, 0);
  EXPECT_EQ(t.samples.size(), 4u);
  const std::vector<RecipeScreen>& screens = t.recipes[size_t(t.chosen_recipe)].screens;
  ASSERT_EQ(screens.size(), 4u);  // two layers on two sets
  EXPECT_EQ(screens[0].calib, "calib-a");
  EXPECT_EQ(screens[1].calib, "calib-b");
  EXPECT_EQ(screens[0].layer, screens[1].layer);
  EXPECT_NE(screens[1].layer, screens[2].layer);
}

TEST(PooledCalibration, TheDatabaseKeepsTheSetsApart) {
  test::TempDir dir("rattn_pooled_db");
  const Program program = parse_program(kModel, "tiny.ra");
  PlanTuneOptions one = options({sets().a}), two = options({sets().a, sets().b});
  one.db_path = two.db_path = (dir.path / "db.jsonl").string();
  const TuningRun first = tune_plan(program, one);
  EXPECT_EQ(first.db_measured, 3);  // the kernels and two layers
  // Each set's samples are kept under its own scope: {A, B} reuses A's and
  // the kernels', and measures B's.
  const TuningRun pooled = tune_plan(program, two);
  EXPECT_EQ(pooled.db_reused, 3);
  EXPECT_EQ(pooled.db_measured, 2);
  // Again: every sample from the database, each set's under its own item.
  const TuningRun again = tune_plan(program, two);
  EXPECT_EQ(again.db_measured, 0);
  EXPECT_EQ(again.db_reused, 5);
  ASSERT_EQ(again.samples.size(), pooled.samples.size());
  for (size_t i = 0; i < again.samples.size(); ++i) {
    EXPECT_EQ(again.samples[i].calib, pooled.samples[i].calib);
    EXPECT_EQ(again.samples[i].points.size(), pooled.samples[i].points.size()) << again.samples[i].label();
  }
  EXPECT_EQ(again.chosen, pooled.chosen);
  // {A} alone still finds its own records.
  EXPECT_EQ(tune_plan(program, one).db_measured, 0);
}

// The error's message, or "" when `f` does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PooledCalibration, MismatchedSetsAreRefusedByName) {
  test::TempDir dir("rattn_pooled_bad");
  const Program program = parse_program(kModel, "tiny.ra");
  const fs::path heads = dir.path / "four-heads", other = dir.path / "other-model";
  write_set(heads, spec_a(), "Tiny", 4, 2);
  write_set(other, spec_a(), "Another");
  std::string e = error_of([&] { tune_plan(program, options({sets().a, heads})); });
  EXPECT_NE(e.find(heads.string()), std::string::npos) << e;
  EXPECT_NE(e.find("heads"), std::string::npos) << e;
  e = error_of([&] { tune_plan(program, options({sets().a, other})); });
  EXPECT_NE(e.find(other.string()), std::string::npos) << e;
  EXPECT_NE(e.find("different models"), std::string::npos) << e;
  e = error_of([&] { tune_plan(program, options({sets().a, sets().a})); });
  EXPECT_NE(e.find("given twice"), std::string::npos) << e;
  PlanTuneOptions longer = options({sets().a, sets().b});
  longer.context = kTokens + 1;
  e = error_of([&] { tune_plan(program, longer); });
  EXPECT_NE(e.find("holds 3072"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { tune_plan(program, options({})); }).find("no calibration data"), std::string::npos);
}

}  // namespace
}  // namespace rattn
