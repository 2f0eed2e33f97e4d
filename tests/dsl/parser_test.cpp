// What the DSL accepts and what it lowers to: one test per language feature.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "dsl/dsl.h"

namespace {

using rattn::ParamDomain;
using rattn::Program;

const char* kModel =
    "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }\n";

Program parse(const std::string& extra, const std::string& model = kModel) {
  return rattn::parse_program(model + extra, "t.ra");
}

TEST(DslParser, MinimalModelGetsDefaults) {
  const Program p = parse("");
  EXPECT_EQ(p.path, "t.ra");
  EXPECT_EQ(p.model.name, "M");
  EXPECT_EQ(p.model.num_layers, 4);
  EXPECT_EQ(p.model.num_q_heads, 8);
  EXPECT_EQ(p.model.num_kv_heads, 2);
  EXPECT_EQ(p.model.group_size(), 4);
  EXPECT_EQ(p.model.head_dim, 128);
  EXPECT_EQ(p.model.max_context, 4096);
  EXPECT_EQ(p.model.kv_dtype, rattn::DType::f16);
  EXPECT_EQ(p.model.rope_base_global, 10000.0);
  EXPECT_FALSE(p.model.rope_base_local.has_value());
  ASSERT_EQ(p.model.layers.size(), 4u);
  for (const auto& l : p.model.layers) {
    EXPECT_TRUE(l.global);
    EXPECT_EQ(l.sliding_window, 0);
  }
  // No plan block: the IR's defaults (the paper's plan).
  const auto c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.sinks, 128);
  EXPECT_EQ(c.window, 512);
  EXPECT_EQ(c.top_k, 100);
  EXPECT_EQ(p.target.gpu_arch, "none");
  EXPECT_EQ(p.target.cpu, "host");
  EXPECT_FALSE(p.target.has_gpu());
}

TEST(DslParser, CommentsWhitespaceUnderscoresAndBlockOrder) {
  const Program p = rattn::parse_program(
      "# leading comment\n"
      "target { gpu = sm_80; }   # blocks in any order\n"
      "plan{sinks=4;}\n"
      "model \"A \\\"quoted\\\" \\\\ name\"{layers=2;q_heads=4;kv_heads=4;head_dim=64;\n"
      "\tcontext = 1_048_576; # a comment after a value\n"
      "  source = \"https://example.org/config.json\"; kv_dtype = \"bf16\"; }\n",
      "t.ra");
  EXPECT_EQ(p.model.name, "A \"quoted\" \\ name");
  EXPECT_EQ(p.model.max_context, 1048576);
  EXPECT_EQ(p.model.source, "https://example.org/config.json");
  EXPECT_EQ(p.model.kv_dtype, rattn::DType::bf16);
  EXPECT_EQ(p.plan.sinks.values, std::vector<double>{4});
  EXPECT_EQ(p.target.gpu_arch, "sm_80");
  EXPECT_TRUE(p.target.has_gpu());
}

TEST(DslParser, DtypeSpellings) {
  for (auto [spelled, want] : {std::pair{"f32", rattn::DType::f32}, {"fp16", rattn::DType::f16},
                               {"bfloat16", rattn::DType::bf16}}) {
    const Program p = rattn::parse_program(
        std::string("model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 96; context = 8; kv_dtype = ") +
            spelled + "; }",
        "t.ra");
    EXPECT_EQ(p.model.kv_dtype, want) << spelled;
  }
}

TEST(DslParser, RopeBaseSingleAndPerKind) {
  Program p = parse("", "model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 64; context = 8; rope_base = 5e5; }");
  EXPECT_EQ(p.model.rope_base_global, 500000.0);
  EXPECT_EQ(p.model.layers[0].rope_base, 500000.0);
  p = parse("",
            "model \"M\" { layers = 2; q_heads = 1; kv_heads = 1; head_dim = 64; context = 8;\n"
            "  rope_base { global = 1e6; local = 10_000; } pattern = local(4), global; }");
  EXPECT_EQ(p.model.rope_base_global, 1e6);
  ASSERT_TRUE(p.model.rope_base_local.has_value());
  EXPECT_EQ(*p.model.rope_base_local, 1e4);
  EXPECT_EQ(p.model.layers[0].rope_base, 1e4);  // local layer
  EXPECT_EQ(p.model.layers[1].rope_base, 1e6);  // global layer
  // A local layer without a local base uses the global one.
  p = parse("", "model \"M\" { layers = 2; q_heads = 1; kv_heads = 1; head_dim = 64; context = 8; rope_base { global = 7; } pattern = local(4), global; }");
  EXPECT_EQ(p.model.layers[0].rope_base, 7.0);
}

std::string pattern_of(const Program& p) {
  std::string s;
  for (const auto& l : p.model.layers) s += l.global ? "G" : "L" + std::to_string(l.sliding_window);
  return s;
}

Program with_pattern(int layers, const std::string& pattern) {
  return rattn::parse_program("model \"M\" { layers = " + std::to_string(layers) +
                                  "; q_heads = 4; kv_heads = 1; head_dim = 256; context = 32768; pattern = " +
                                  pattern + "; }",
                              "t.ra");
}

TEST(DslParser, LayerPatterns) {
  EXPECT_EQ(pattern_of(with_pattern(3, "global, local(8), global")), "GL8G");
  EXPECT_EQ(pattern_of(with_pattern(4, "global x 4")), "GGGG");
  EXPECT_EQ(pattern_of(with_pattern(4, "local(8)x3, global")), "L8L8L8G");  // 'x3' glued
  EXPECT_EQ(pattern_of(with_pattern(12, "repeat [local(512) x 5, global]")),
            "L512L512L512L512L512GL512L512L512L512L512G");
  // Nested groups with counts.
  EXPECT_EQ(pattern_of(with_pattern(10, "[[local(2), global] x 2, local(4)] x 2")), "L2GL2GL4L2GL2GL4");
  // An explicit tail where the block does not divide the layers (Gemma-3-1B: 26 layers).
  const Program g = with_pattern(26, "[local(512) x 5, global] x 4, local(512) x 2");
  EXPECT_EQ(g.model.num_global_layers(), 4);
  EXPECT_FALSE(g.model.layers[24].global);
  EXPECT_TRUE(g.model.layers[23].global);
}

TEST(DslParser, PlanDomains) {
  const Program p = parse(
      "plan {\n"
      "  sinks = 64;\n"
      "  window = 256..1024 step 256;\n"
      "  top_k = {500, 100, 200} default 200;\n"
      "  graph_degree = 16..48 step 8 default 32;\n"
      "  query_neighbors = 50..100 step 25;\n"
      "  build_sample = 0.25..1.0 step 0.25 default 0.5;\n"
      "  search_queue = 200..600 step 100;\n"
      "  kernel.cuda.splits = {1, 2, 4, 8};\n"
      "  kernel.halide.vector = 8..64 step *2 default 16;\n"
      "  kernel.cuda.warps = 4;\n"
      "}\n");
  EXPECT_TRUE(p.plan.sinks.is_fixed());
  EXPECT_EQ(p.plan.sinks.default_value(), 64);

  EXPECT_EQ(p.plan.window.kind, ParamDomain::Kind::range);
  EXPECT_EQ(p.plan.window.candidates(), (std::vector<double>{256, 512, 768, 1024}));
  EXPECT_EQ(p.plan.window.default_value(), 256);  // no 'default': the first candidate

  EXPECT_EQ(p.plan.top_k.kind, ParamDomain::Kind::set);
  EXPECT_EQ(p.plan.top_k.candidates(), (std::vector<double>{100, 200, 500}));  // sorted
  EXPECT_EQ(p.plan.top_k.default_value(), 200);

  EXPECT_EQ(p.plan.graph_degree.candidates(), (std::vector<double>{16, 24, 32, 40, 48}));
  EXPECT_EQ(p.plan.graph_degree.default_value(), 32);
  EXPECT_EQ(p.plan.query_neighbors.candidates(), (std::vector<double>{50, 75, 100}));
  EXPECT_EQ(p.plan.build_sample.candidates(), (std::vector<double>{0.25, 0.5, 0.75, 1.0}));
  EXPECT_EQ(p.plan.build_sample.default_value(), 0.5);

  ASSERT_EQ(p.plan.kernel.count("cuda.splits"), 1u);
  EXPECT_EQ(p.plan.kernel.at("cuda.splits").candidates(), (std::vector<double>{1, 2, 4, 8}));
  const ParamDomain& vec = p.plan.kernel.at("halide.vector");
  EXPECT_TRUE(vec.geometric);
  EXPECT_EQ(vec.candidates(), (std::vector<double>{8, 16, 32, 64}));
  EXPECT_EQ(vec.default_value(), 16);
  EXPECT_TRUE(p.plan.kernel.at("cuda.warps").is_fixed());

  // Source locations of domains point at their values.
  EXPECT_EQ(p.plan.window.loc.file, "t.ra");
  EXPECT_EQ(p.plan.window.loc.line, 4);
  EXPECT_EQ(p.plan.window.loc.col, 12);

  const auto c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.top_k, 200);
  EXPECT_EQ(c.graph_degree, 32);
  EXPECT_EQ(c.kernel.at("halide.vector"), 16);
  // A split range is the tuner's: untuned, the runtime sizes the splits to the set.
  EXPECT_EQ(c.kernel.count("cuda.splits"), 0u);
}

// The index's build and insert knobs: absent, the library's defaults
// (GraphBuildParams; tests/runtime/index/plan_index_test.cpp checks the two agree);
// fixed, ranges and sets like the other parameters.
TEST(DslParser, IndexKnobsDefaultToTheLibrarys) {
  const auto c = rattn::default_concrete_plan(parse("").plan);
  EXPECT_EQ(c.build_queue, 128);
  EXPECT_EQ(c.pivot_capacity, 6);
  EXPECT_EQ(c.pivots_per_query, 6);
  EXPECT_FALSE(c.two_hop_fill);
  EXPECT_EQ(c.extra_slots, 4);
  EXPECT_EQ(c.entry_points, 4);
  EXPECT_EQ(c.repair_fraction, 0.0);
  EXPECT_EQ(c.key_metric, 0);
  EXPECT_EQ(c.key_metric_ridge, 1e-3);
  EXPECT_EQ(c.key_metric_passes, 7);
  EXPECT_FALSE(c.causal);
  EXPECT_EQ(c.insert_queue, 32);
  EXPECT_EQ(c.insert_pivots, 2);
  EXPECT_EQ(c.insert_reverse, 8);
  EXPECT_EQ(c.insert_key_queue, 12);
  EXPECT_EQ(c.search_patience, 0);
  EXPECT_EQ(c.code_dims, 0);  // the shared codes of the raw keys
  EXPECT_EQ(c.code_coarse_dims, 0);
  EXPECT_EQ(c.search_seeds, 100);  // on unless a plan turns it off
  EXPECT_EQ(c.tail_samples, 0);  // off unless a plan asks
  EXPECT_EQ(c.shift_queries, 0);  // off unless a plan asks
  EXPECT_EQ(c.shift_span, 2048);
  EXPECT_EQ(c.refresh_sample, 0.0);  // nothing kept unless a plan asks
}

TEST(DslParser, IndexKnobsFixedRangesAndSets) {
  const Program p = parse(
      "plan {\n"
      "  key_metric = {0, 2} default 2;\n"
      "  causal = 1;\n"
      "  repair_fraction = 0..1 step 0.25 default 0.5;\n"
      "  key_metric_ridge = 0.01;\n"
      "  key_metric_passes = 3;\n"
      "  two_hop_fill = 0..1;\n"
      "  build_queue = 64..256 step *2 default 128;\n"
      "  pivot_capacity = 4..8 step 2;\n"
      "  pivots_per_query = {3, 6, 9} default 6;\n"
      "  extra_slots = 0;\n"
      "  entry_points = 1..8;\n"
      "  insert_queue = 16..64 step 16 default 48;\n"
      "  insert_pivots = 2;\n"
      "  insert_reverse = 0;\n"
      "  insert_key_queue = {0, 16, 32};\n"
      "  search_patience = {0, 32, 64} default 64;\n"
      "  tail_samples = {0, 1024, 2048} default 1024;\n"
      "}\n");
  EXPECT_EQ(p.plan.key_metric.kind, ParamDomain::Kind::set);
  EXPECT_EQ(p.plan.key_metric.candidates(), (std::vector<double>{0, 2}));
  EXPECT_EQ(p.plan.repair_fraction.candidates(), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(p.plan.two_hop_fill.candidates(), (std::vector<double>{0, 1}));
  EXPECT_EQ(p.plan.build_queue.candidates(), (std::vector<double>{64, 128, 256}));
  EXPECT_EQ(p.plan.pivot_capacity.candidates(), (std::vector<double>{4, 6, 8}));
  EXPECT_EQ(p.plan.entry_points.candidates().size(), 8u);
  EXPECT_EQ(p.plan.insert_key_queue.candidates(), (std::vector<double>{0, 16, 32}));
  EXPECT_EQ(p.plan.key_metric.loc.line, 3);  // line 1 is the model
  EXPECT_EQ(p.plan.key_metric.loc.col, 16);

  const auto c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.key_metric, 2);
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.repair_fraction, 0.5);
  EXPECT_EQ(c.key_metric_ridge, 0.01);
  EXPECT_EQ(c.key_metric_passes, 3);
  EXPECT_FALSE(c.two_hop_fill);  // no 'default': the first candidate
  EXPECT_EQ(c.build_queue, 128);
  EXPECT_EQ(c.pivot_capacity, 4);
  EXPECT_EQ(c.pivots_per_query, 6);
  EXPECT_EQ(c.extra_slots, 0);
  EXPECT_EQ(c.entry_points, 1);
  EXPECT_EQ(c.insert_queue, 48);
  EXPECT_EQ(c.insert_pivots, 2);
  EXPECT_EQ(c.insert_reverse, 0);
  EXPECT_EQ(c.insert_key_queue, 0);
  EXPECT_EQ(c.search_patience, 64);
  EXPECT_EQ(p.plan.tail_samples.candidates(), (std::vector<double>{0, 1024, 2048}));
  EXPECT_EQ(c.tail_samples, 1024);
}

TEST(DslParser, TailSamplesRange) {
  const Program p = parse("plan { tail_samples = 0..4096 step 1024 default 2048; }");
  EXPECT_EQ(p.plan.tail_samples.candidates(), (std::vector<double>{0, 1024, 2048, 3072, 4096}));
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).tail_samples, 2048);
}

// RoPE-shifted training queries: fixed, range and set, each lowered to its
// domain and its default.
TEST(DslParser, ShiftQueriesAndSpanFixedRangesAndSets) {
  Program p = parse("plan { shift_queries = 256; shift_span = 4096; }");
  EXPECT_TRUE(p.plan.shift_queries.is_fixed());
  EXPECT_EQ(p.plan.shift_queries.candidates(), (std::vector<double>{256}));
  EXPECT_EQ(p.plan.shift_span.candidates(), (std::vector<double>{4096}));
  EXPECT_EQ(p.plan.shift_queries.loc.line, 2);
  EXPECT_EQ(p.plan.shift_queries.loc.col, 24);
  auto c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.shift_queries, 256);
  EXPECT_EQ(c.shift_span, 4096);

  p = parse("plan { shift_queries = 0..512 step 256 default 256; shift_span = 1024..8192 step *2; }");
  EXPECT_EQ(p.plan.shift_queries.kind, ParamDomain::Kind::range);
  EXPECT_EQ(p.plan.shift_queries.candidates(), (std::vector<double>{0, 256, 512}));
  EXPECT_EQ(p.plan.shift_span.candidates(), (std::vector<double>{1024, 2048, 4096, 8192}));
  c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.shift_queries, 256);
  EXPECT_EQ(c.shift_span, 1024);  // no 'default': the first candidate

  p = parse("plan { shift_queries = {0, 128, 1024}; shift_span = {8, 2048, 16777216} default 16777216; }");
  EXPECT_EQ(p.plan.shift_queries.kind, ParamDomain::Kind::set);
  EXPECT_EQ(p.plan.shift_queries.candidates(), (std::vector<double>{0, 128, 1024}));
  EXPECT_EQ(p.plan.shift_span.candidates(), (std::vector<double>{8, 2048, 16777216}));  // both ends allowed
  c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.shift_queries, 0);
  EXPECT_EQ(c.shift_span, 16777216);
}

// Projected traversal code shapes: sets and ranges of code_dims and
// code_coarse_dims lower to their domains and defaults.
TEST(DslParser, CodeDimsAndCoarseDims) {
  Program p = parse("plan { traversal_codes = 1; code_dims = {0, 64, 80} default 80; code_coarse_dims = 0..32 step 16 default 32; }");
  EXPECT_EQ(p.plan.code_dims.candidates(), (std::vector<double>{0, 64, 80}));
  EXPECT_EQ(p.plan.code_coarse_dims.candidates(), (std::vector<double>{0, 16, 32}));
  const auto c = rattn::default_concrete_plan(p.plan);
  EXPECT_TRUE(c.traversal_codes);
  EXPECT_EQ(c.code_dims, 80);
  EXPECT_EQ(c.code_coarse_dims, 32);
  p = parse("plan { code_dims = 128; }");  // up to head_dim
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).code_dims, 128);
}

// Partial expansion of the decode searches: off (0) unless a plan sets it,
// tunable as a set (negative values: tests/dsl/diagnostics_test.cpp).
TEST(DslParser, PartialExpansionKeys) {
  Program p = parse("plan { search_expand_first = {0, 8, 12} default 8; search_full_expand = 50; }");
  EXPECT_EQ(p.plan.search_expand_first.candidates(), (std::vector<double>{0, 8, 12}));
  const rattn::ConcretePlan c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.search_expand_first, 8);
  EXPECT_EQ(c.search_full_expand, 50);
  const rattn::ConcretePlan d = rattn::default_concrete_plan(parse("plan { top_k = 100; }").plan);
  EXPECT_EQ(d.search_expand_first, 0);
  EXPECT_EQ(d.search_full_expand, 0);
}

// Warm-start seeds of the decode searches: fixed, range and set, each lowered
// to its domain and its default; both ends of 0 .. 1<<16 are allowed.
TEST(DslParser, SearchSeedsFixedRangesAndSets) {
  Program p = parse("plan { search_seeds = 16; }");
  EXPECT_TRUE(p.plan.search_seeds.is_fixed());
  EXPECT_EQ(p.plan.search_seeds.candidates(), (std::vector<double>{16}));
  EXPECT_EQ(p.plan.search_seeds.loc.line, 2);  // line 1 is the model
  EXPECT_EQ(p.plan.search_seeds.loc.col, 23);
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 16);

  p = parse("plan { search_seeds = 0..32 step 8 default 16; }");
  EXPECT_EQ(p.plan.search_seeds.kind, ParamDomain::Kind::range);
  EXPECT_EQ(p.plan.search_seeds.candidates(), (std::vector<double>{0, 8, 16, 24, 32}));
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 16);

  p = parse("plan { search_seeds = 4..64 step *2; }");
  EXPECT_EQ(p.plan.search_seeds.candidates(), (std::vector<double>{4, 8, 16, 32, 64}));
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 4);  // no 'default': the first candidate

  p = parse("plan { search_seeds = {0, 32, 65536} default 65536; }");
  EXPECT_EQ(p.plan.search_seeds.kind, ParamDomain::Kind::set);
  EXPECT_EQ(p.plan.search_seeds.candidates(), (std::vector<double>{0, 32, 65536}));
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 65536);

  // Absent: the library default (100), and setting it leaves its neighbours alone.
  p = parse("plan { search_patience = 64; }");
  EXPECT_TRUE(p.plan.search_seeds.is_fixed());
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 100);
  p = parse("plan { search_seeds = 0; }");
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_seeds, 0);
  p = parse("plan { search_seeds = 8; }");
  EXPECT_EQ(rattn::default_concrete_plan(p.plan).search_patience, 0);
}

// `layer N, ... { ... }` blocks: each named global layer gets the block's
// decode-search domains; the concrete plan holds their defaults, and a
// layer's decode searches are the plan-wide ones with its own on top.
TEST(DslParser, LayerBlocksSetDecodeSearchesPerLayer) {
  const std::string model =
      "model \"M\" { layers = 6; q_heads = 4; kv_heads = 1; head_dim = 64; context = 8192;\n"
      "  pattern = repeat [local(128) x 2, global]; }\n";
  Program p = parse("plan { search_queue = 120; search_seeds = 10;\n"
                    "  layer 5 { search_queue = 200..400 step 100 default 300; search_expand_first = 8; }\n"
                    "  layer 2 { search_full_expand = {25, 50}; } }",
                    model);
  ASSERT_EQ(p.plan.layer_search.size(), 2u);
  const auto& five = p.plan.layer_search.at(5);
  EXPECT_EQ(five.loc.line, 4);
  EXPECT_EQ(five.loc.col, 3);
  EXPECT_EQ(five.params.size(), 2u);
  EXPECT_EQ(five.params.at("search_queue").candidates(), (std::vector<double>{200, 300, 400}));
  EXPECT_EQ(p.plan.layer_search.at(2).params.at("search_full_expand").candidates(), (std::vector<double>{25, 50}));
  rattn::ConcretePlan c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.layer_search.at(5), (std::map<std::string, int>{{"search_queue", 300}, {"search_expand_first", 8}}));
  const rattn::DecodeSearch s5 = c.decode_search(5), s2 = c.decode_search(2), s0 = c.decode_search(0);
  EXPECT_EQ(s5.queue, 300);
  EXPECT_EQ(s5.seeds, 10);
  EXPECT_EQ(s5.expand_first, 8);
  EXPECT_EQ(s5.full_expand, 0);
  EXPECT_EQ(s2.queue, 120);
  EXPECT_EQ(s2.full_expand, 25);
  EXPECT_EQ(s0.queue, 120);
  EXPECT_EQ(s0.expand_first, 0);
  // An explicit plan-wide value replaces the layers' own values of its key only.
  c.drop_layer_search("search_queue");
  EXPECT_EQ(c.decode_search(5).queue, 120);
  EXPECT_EQ(c.decode_search(5).expand_first, 8);
  c.drop_layer_search("search_expand_first");
  EXPECT_EQ(c.layer_search.count(5), 0u);  // nothing of its own left
  EXPECT_EQ(c.layer_search.count(2), 1u);

  // One block for several layers; none at all.
  p = parse("plan { layer 2, 5 { search_seeds = 0; } }", model);
  c = rattn::default_concrete_plan(p.plan);
  EXPECT_EQ(c.decode_search(2).seeds, 0);
  EXPECT_EQ(c.decode_search(5).seeds, 0);
  EXPECT_TRUE(rattn::default_concrete_plan(parse("plan { search_seeds = 0; }", model).plan).layer_search.empty());
}

TEST(DslParser, RopeStyle) {
  const std::string head = "model \"M\" { layers = 1; q_heads = 1; kv_heads = 1; head_dim = 64; context = 8;";
  EXPECT_EQ(parse("", head + " }").model.rope_style, rattn::RopeStyle::neox);  // absent: neox
  EXPECT_EQ(parse("", head + " rope_style = neox; }").model.rope_style, rattn::RopeStyle::neox);
  EXPECT_EQ(parse("", head + " rope_style = gptj; }").model.rope_style, rattn::RopeStyle::gptj);
  EXPECT_EQ(parse("", head + " rope_style = \"gptj\"; }").model.rope_style, rattn::RopeStyle::gptj);
  EXPECT_STREQ(rattn::rope_style_name(rattn::RopeStyle::neox), "neox");
  EXPECT_STREQ(rattn::rope_style_name(rattn::RopeStyle::gptj), "gptj");
}

TEST(DslParser, RangeWithoutStepStepsByOneForIntegers) {
  const Program p = parse("plan { sinks = 0..4; }");
  EXPECT_EQ(p.plan.sinks.candidates(), (std::vector<double>{0, 1, 2, 3, 4}));
}

TEST(DslParser, TargetSpellings) {
  EXPECT_EQ(parse("target { gpu = none; cpu = \"skylake-avx512\"; }").target.cpu, "skylake-avx512");
  EXPECT_EQ(parse("target { gpu = \"sm_120\"; cpu = znver4; }").target.gpu_arch, "sm_120");
  EXPECT_EQ(parse("target { gpu = sm_75; }").target.gpu_arch, "sm_75");
}

TEST(DslParser, FormatDomainRoundTrips) {
  const Program p = parse(
      "plan { sinks = 64; window = 256..1024 step 256; top_k = {100, 200} default 200;"
      " build_sample = 0.25..1 step 0.25; kernel.halide.vector = 8..64 step *2; search_queue = 300; }");
  EXPECT_EQ(rattn::format_domain(p.plan.sinks), "64");
  EXPECT_EQ(rattn::format_domain(p.plan.window), "256..1024 step 256");
  EXPECT_EQ(rattn::format_domain(p.plan.top_k), "{100, 200} default 200");
  EXPECT_EQ(rattn::format_domain(p.plan.build_sample), "0.25..1 step 0.25");
  EXPECT_EQ(rattn::format_domain(p.plan.kernel.at("halide.vector")), "8..64 step *2");
  // What format_domain prints parses back to the same candidates.
  const Program q = parse("plan { window = " + rattn::format_domain(p.plan.window) + "; top_k = " +
                          rattn::format_domain(p.plan.top_k) + "; search_queue = 300; }");
  EXPECT_EQ(q.plan.window.candidates(), p.plan.window.candidates());
  EXPECT_EQ(q.plan.top_k.default_value(), 200);
}

}  // namespace
