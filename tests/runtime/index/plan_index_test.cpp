// The index knobs of the DSL plan reach the built index: a plan parsed from
// text goes through Runtime::build_index, and the graph reports the knobs it
// was built with. The plan's defaults are the library's (GraphBuildParams).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "dsl/dsl.h"
#include "runtime/index/projected_graph.h"
#include "runtime/runtime.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

constexpr int kDim = 64;

RuntimeConfig config_from(const std::string& plan) {
  const Program p = parse_program(
      "model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 64; context = 65536; }\n" + plan, "t.ra");
  RuntimeConfig c;
  c.layout = p.model;
  c.plan = default_concrete_plan(p.plan);
  c.kernels = KernelPreference::reference;
  c.threads = 1;
  c.use_gpu = false;
  return c;
}

GraphInfo build_with(const RuntimeConfig& c) {
  const Runtime rt(c);
  const int64_t n = 3000;  // above the runtime's exact-index threshold
  const std::vector<float> keys = testing::random_rows(n, kDim, 3);
  // Training queries: one per token position, the sinks' included.
  const std::vector<float> queries = testing::random_rows(c.plan.sinks + n, kDim, 4, 0.5f);
  auto index = rt.build_index(/*layer=*/0, RowsView{keys.data(), DType::f32, n, kDim}, queries.data(), c.plan.sinks + n,
                              /*seed=*/7, /*threads=*/1, {});
  return projected_graph_info(*index);
}

TEST(PlanIndex, PlanDefaultsAreTheLibraryDefaults) {
  const ConcretePlan c = default_concrete_plan(RetrievalPlan{});
  const GraphBuildParams g;
  EXPECT_EQ(c.graph_degree, g.degree);
  EXPECT_EQ(c.query_neighbors, g.query_neighbors);
  EXPECT_EQ(c.build_sample, g.sample_fraction);
  EXPECT_EQ(c.build_queue, g.build_queue);
  EXPECT_EQ(c.pivot_capacity, g.pivot_capacity);
  EXPECT_EQ(c.pivots_per_query, g.pivots_per_query);
  EXPECT_EQ(c.two_hop_fill, g.fill_two_hop);
  EXPECT_EQ(c.extra_slots, g.extra_slots);
  EXPECT_EQ(c.entry_points, g.entry_points);
  EXPECT_EQ(c.repair_fraction, g.repair_fraction);
  EXPECT_EQ(c.key_metric, g.key_metric);
  EXPECT_EQ(c.key_metric_ridge, g.key_metric_ridge);
  EXPECT_EQ(c.key_metric_passes, g.key_metric_passes);
  EXPECT_EQ(c.causal, g.causal);
  EXPECT_EQ(c.insert_queue, g.insert_queue);
  EXPECT_EQ(c.insert_pivots, g.insert_pivots);
  EXPECT_EQ(c.insert_reverse, g.insert_reverse);
  EXPECT_EQ(c.insert_key_queue, g.insert_key_queue);
  EXPECT_EQ(c.shift_queries, g.shift_queries);
  EXPECT_EQ(c.shift_span, g.shift_span);
  EXPECT_EQ(c.knn_cluster_keys, g.knn_cluster_keys);
  EXPECT_EQ(c.knn_probes, g.knn_probes);
}

// The training kNN knobs reach the build parameters (the partitioned kNN
// itself: partitioned_knn_test.cpp).
TEST(PlanIndex, TrainingKnnKnobsReachTheBuildParams) {
  const Program p = parse_program(
      "model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 64; context = 65536; }\n"
      "plan { knn_cluster_keys = {0, 128, 512} default 128; knn_probes = 24; }\n",
      "t.ra");
  const GraphBuildParams g = internal::graph_build_params(default_concrete_plan(p.plan), p.model, 0);
  EXPECT_EQ(g.knn_cluster_keys, 128);
  EXPECT_EQ(g.knn_probes, 24);
  EXPECT_THROW(parse_program("model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 64; context = 4096; }\n"
                             "plan { knn_probes = -1; }\n", "b.ra"),
               Error);
}

// A layer's lists are ordered by co-occurrence only when its searches read
// them partially (search_expand_first > 0, plan-wide or the layer's own).
TEST(PlanIndex, ListsAreOrderedOnlyForPartialExpansion) {
  auto program = [](const std::string& plan) {
    return parse_program("model \"M\" { layers = 2; q_heads = 1; kv_heads = 1; head_dim = 64; context = 65536; }\n" +
                             plan,
                         "t.ra");
  };
  const Program whole = program("plan { }\n");
  const ConcretePlan w = default_concrete_plan(whole.plan);
  EXPECT_FALSE(internal::graph_build_params(w, whole.model, 0).cooccurrence_order);
  EXPECT_FALSE(internal::graph_build_params(w).cooccurrence_order);
  const Program wide = program("plan { search_expand_first = 8; }\n");
  const ConcretePlan pw = default_concrete_plan(wide.plan);
  EXPECT_TRUE(internal::graph_build_params(pw, wide.model, 0).cooccurrence_order);
  EXPECT_TRUE(internal::graph_build_params(pw, wide.model, 1).cooccurrence_order);
  const Program one = program("plan { layer 1 { search_expand_first = 12; } }\n");
  const ConcretePlan po = default_concrete_plan(one.plan);
  EXPECT_FALSE(internal::graph_build_params(po, one.model, 0).cooccurrence_order);
  EXPECT_TRUE(internal::graph_build_params(po, one.model, 1).cooccurrence_order);
  // Without a layer (the insert parameters): on if any layer expands partially.
  EXPECT_TRUE(internal::graph_build_params(po).cooccurrence_order);
}

// shared_graph reaches the plan (one graph per KV head), and its graphs
// train on build_sample / group of their group's pooled queries: as many as
// one query head's graph takes. Without a group (or the knob) the share stays.
TEST(PlanIndex, SharedGraphSamplesTheGroupsPooledQueries) {
  auto params = [](int q_heads, const char* plan) {
    const Program p = parse_program("model \"M\" { layers = 1; q_heads = " + std::to_string(q_heads) +
                                        "; kv_heads = 1; head_dim = 64; context = 65536; }\n" + plan,
                                    "t.ra");
    const ConcretePlan c = default_concrete_plan(p.plan);
    EXPECT_EQ(c.shared_graph, std::string(plan).find("shared_graph = 1") != std::string::npos);
    return internal::graph_build_params(c, p.model, 0);
  };
  EXPECT_DOUBLE_EQ(params(4, "plan { build_sample = 0.4; shared_graph = 1; }").sample_fraction, 0.1);
  EXPECT_DOUBLE_EQ(params(4, "plan { build_sample = 0.4; }").sample_fraction, 0.4);
  EXPECT_DOUBLE_EQ(params(1, "plan { build_sample = 0.4; shared_graph = 1; }").sample_fraction, 0.4);
}

// The shifted training queries take the plan's count and span and the
// layer's RoPE (base per layer kind, the model's pairing).
TEST(PlanIndex, ShiftedQueriesTakeTheLayersRope) {
  const Program p = parse_program(
      "model \"M\" { layers = 2; q_heads = 1; kv_heads = 1; head_dim = 64; context = 65536;\n"
      "  rope_base { global = 1e6; local = 10000; } rope_style = gptj; pattern = local(512), global; }\n"
      "plan { shift_queries = 300; shift_span = 1024; }\n",
      "t.ra");
  const ConcretePlan plan = default_concrete_plan(p.plan);
  const GraphBuildParams local = internal::graph_build_params(plan, p.model, 0);
  const GraphBuildParams global = internal::graph_build_params(plan, p.model, 1);
  EXPECT_EQ(local.rope_base, 10000.0);
  EXPECT_EQ(global.rope_base, 1e6);
  EXPECT_TRUE(global.rope_interleaved);
  EXPECT_EQ(global.shift_queries, 300);
  EXPECT_EQ(global.shift_span, 1024);
  const GraphBuildParams neox =
      internal::graph_build_params(plan, parse_program("model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; "
                                                       "head_dim = 64; context = 4096; }", "n.ra").model, 0);
  EXPECT_FALSE(neox.rope_interleaved);
  EXPECT_EQ(neox.rope_base, 10000.0);

  // Through the runtime: 4 copies of the last 300 of the sinks + n training queries.
  RuntimeConfig c = config_from("plan { sinks = 4; window = 16; top_k = 10; graph_degree = 8; "
                                "shift_queries = 300; shift_span = 64; }");
  EXPECT_EQ(build_with(c).shifted_queries, 1200);
  c.plan.causal = true;
  EXPECT_THROW({ const Runtime rt(c); }, Error);
}

TEST(PlanIndex, PlanKnobsReachTheBuiltIndex) {
  const std::string base = "plan { sinks = 4; window = 16; top_k = 10; search_queue = 32; graph_degree = 8; ";
  const GraphInfo plain = build_with(config_from(base + "}"));
  EXPECT_EQ(plain.key_metric, 0);
  EXPECT_EQ(plain.degree, 8);
  EXPECT_EQ(plain.slots, 8 + 4);
  EXPECT_EQ(plain.insert_queue, 32);

  const GraphInfo tuned = build_with(config_from(
      base + "key_metric = {0, 2} default 2; extra_slots = 2; entry_points = 2; causal = 1; repair_fraction = 0.5;"
             " insert_queue = 24; insert_pivots = 3; insert_reverse = 5; insert_key_queue = 0; }"));
  EXPECT_EQ(tuned.key_metric, 2);
  EXPECT_GT(tuned.key_alignment, 0.0);  // the metric was computed
  EXPECT_EQ(tuned.slots, 8 + 2);
  EXPECT_EQ(tuned.entry_points, 2);
  EXPECT_EQ(tuned.insert_queue, 24);
  EXPECT_EQ(tuned.insert_pivots, 3);
  EXPECT_EQ(tuned.insert_reverse, 5);
  EXPECT_EQ(tuned.insert_key_queue, 0);
  EXPECT_EQ(tuned.unreachable, 0);
}

}  // namespace
}  // namespace rattn
