// The memory plan of `rattn inspect`, checked against the formulas written out
// here independently, and the command line itself.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "dsl/dsl.h"
#include "dsl/memory_plan.h"
#include "tools/rattn/commands.h"

namespace {

std::string model_path(const char* f) { return std::string(RATTN_SOURCE_DIR) + "/models/" + f; }

// Runs `rattn inspect ARGS...` in-process and returns its stdout.
std::string run_inspect(std::vector<std::string> args, int* rc = nullptr) {
  args.insert(args.begin(), "inspect");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  testing::internal::CaptureStdout();
  int status = -1;
  try {
    status = rattn::cli::inspect_main(int(args.size()), argv.data());
  } catch (...) {
    testing::internal::GetCapturedStdout();
    throw;
  }
  if (rc) *rc = status;
  return testing::internal::GetCapturedStdout();
}

TEST(DslInspect, Llama3At128KJson) {
  const std::string out = run_inspect({model_path("llama3-8b-262k.ra"), "--context", "131072", "--json"});
  const boost::json::object o = boost::json::parse(out).as_object();
  // 32 layers x 131072 tokens x (K+V: 2 x 8 heads x 128 x 2 B) = 16 GiB.
  EXPECT_EQ(o.at("kv_bytes_full").to_number<uint64_t>(), 17179869184ull);
  EXPECT_EQ(o.at("num_indexes").to_number<int64_t>(), 1024);
  const uint64_t per_token = 2ull * 8 * 128 * 2;
  const uint64_t static_tokens = 128 + 512, offloaded = 131072 - static_tokens;
  EXPECT_EQ(o.at("kv_bytes_gpu").to_number<uint64_t>(), 32 * static_tokens * per_token);
  EXPECT_EQ(o.at("kv_bytes_cpu").to_number<uint64_t>(), 32 * offloaded * per_token);
  EXPECT_EQ(o.at("index_bytes").to_number<uint64_t>(), 32ull * 32 * offloaded * (4 * (32 + 4 + 1) + 8));
  EXPECT_EQ(o.at("context").to_number<int64_t>(), 131072);
  const auto& layers = o.at("layers").as_array();
  ASSERT_EQ(layers.size(), 32u);
  EXPECT_EQ(layers[7].as_object().at("num_indexes").to_number<int>(), 32);
  EXPECT_EQ(layers[7].as_object().at("kv_bytes_full").to_number<uint64_t>(), 131072 * per_token);
  EXPECT_EQ(o.at("plan").as_object().at("graph_degree").to_number<int>(), 32);
  EXPECT_EQ(o.at("plan_domains").as_object().at("graph_degree").as_string(), "16..48 step 8 default 32");
}

TEST(DslInspect, DefaultContextIsTheModels) {
  const std::string out = run_inspect({model_path("llama3-8b-262k.ra"), "--json"});
  const boost::json::object o = boost::json::parse(out).as_object();
  EXPECT_EQ(o.at("context").to_number<int64_t>(), 262144);
  EXPECT_EQ(o.at("kv_bytes_full").to_number<uint64_t>(), 2 * 17179869184ull);
}

TEST(DslInspect, SlidingWindowLayersKeepTheirWindowAndHaveNoIndex) {
  const rattn::Program p = rattn::load_program(model_path("gemma3-270m.ra"));
  const rattn::MemoryPlan m = rattn::plan_memory(p, 32768);
  const uint64_t per_token = 2ull * 1 * 256 * 2;  // bf16
  ASSERT_EQ(m.layers.size(), 18u);
  EXPECT_EQ(m.num_indexes, 3 * 4);
  for (const auto& l : m.layers) {
    if (l.global) {
      EXPECT_EQ(l.static_tokens, 640);
      EXPECT_EQ(l.offloaded_tokens, 32768 - 640);
      EXPECT_EQ(l.kv_bytes_full, 32768 * per_token);
      EXPECT_EQ(l.index_bytes, 4ull * (32768 - 640) * (4 * (32 + 4 + 1) + 8));
    } else {
      EXPECT_EQ(l.static_tokens, 512);
      EXPECT_EQ(l.offloaded_tokens, 0);
      EXPECT_EQ(l.kv_bytes_full, 512 * per_token);
      EXPECT_EQ(l.index_bytes, 0u);
      EXPECT_EQ(l.num_indexes, 0);
    }
  }
  EXPECT_EQ(m.kv_bytes_full, (3 * 32768 + 15 * 512) * per_token);
  // gpu = none: nothing on the GPU, the static set is in CPU memory too.
  EXPECT_FALSE(m.gpu);
  EXPECT_EQ(m.kv_bytes_gpu, 0u);
  EXPECT_EQ(m.kv_bytes_cpu, m.kv_bytes_full);
}

TEST(DslInspect, ShortContextKeepsEverythingInTheStaticSet) {
  const rattn::Program p = rattn::load_program(model_path("llama3-8b-262k.ra"));
  const rattn::MemoryPlan m = rattn::plan_memory(p, 300);
  EXPECT_EQ(m.kv_bytes_offloaded, 0u);
  EXPECT_EQ(m.index_bytes, 0u);
  EXPECT_EQ(m.kv_bytes_gpu, m.kv_bytes_full);
  EXPECT_EQ(m.num_indexes, 1024);
}

TEST(DslInspect, ReportGroupsIdenticalLayers) {
  const std::string out = run_inspect({model_path("llama3-8b-262k.ra"), "--context", "131072"});
  EXPECT_NE(out.find("Llama-3-8B-Instruct-262k"), std::string::npos);
  EXPECT_NE(out.find("0-31 (x32)"), std::string::npos) << out;
  EXPECT_NE(out.find("17179869184 B"), std::string::npos) << out;
  EXPECT_NE(out.find("1024 = 32 global layers x 32 query heads"), std::string::npos) << out;
  EXPECT_LT(std::count(out.begin(), out.end(), '\n'), 30) << out;

  const std::string gemma = run_inspect({model_path("gemma3-270m.ra")});
  EXPECT_NE(gemma.find("0-4,6-10,12-16 (x15)"), std::string::npos) << gemma;
  EXPECT_NE(gemma.find("5,11,17 (x3)"), std::string::npos) << gemma;
}

TEST(DslInspect, ManyRunsOfLayersAreAbbreviated) {
  const rattn::Program p = rattn::parse_program(
      "model \"Alt\" { layers = 64; q_heads = 8; kv_heads = 8; head_dim = 64; context = 65536;"
      " pattern = repeat [local(1024), global]; }",
      "alt.ra");
  const std::string out = rattn::format_report(p, rattn::plan_memory(p, 65536));
  EXPECT_NE(out.find("0,2,4,6,... (x32)"), std::string::npos) << out;
  EXPECT_NE(out.find("1,3,5,7,... (x32)"), std::string::npos) << out;
}

// The text and JSON reports at 64K tokens of model "M" (2 layers, 8 query
// and 2 KV heads, head_dim 128, and `model_fields`) with the plan block's
// `plan` keys.
struct Reports {
  std::string text;
  boost::json::object json;
};
Reports reports_of(const std::string& plan, const std::string& model_fields = "") {
  const rattn::Program p = rattn::parse_program(
      "model \"M\" { layers = 2; q_heads = 8; kv_heads = 2; head_dim = 128; context = 65536; " + model_fields +
          " } plan { " + plan + " }",
      "m.ra");
  const rattn::MemoryPlan mem = rattn::plan_memory(p, 65536);
  return {rattn::format_report(p, mem), rattn::report_json(p, mem)};
}

// Traversal code bytes per key and KV head: the raw keys' 8-bit codes are
// one shared set per KV head (head_dim bytes); projected codes one row per
// query head of the group (4 here): 80 directions with 32 coarse are 48 +
// 16 = 64 bytes, 80 8-bit ones 128 (two lines), 96 with 32 coarse 64 + 16.
TEST(DslInspect, CodeBytesCountSharedOrProjectedCodes) {
  const int64_t offloaded = 65536 - 640;
  const uint64_t node = 4 * (32 + 4 + 1) + 8;
  const struct {
    std::string plan;
    uint64_t per_key;
  } cases[] = {{"traversal_codes = 0; code_dims = 80;", 0},
               {"traversal_codes = 1;", 128},
               {"traversal_codes = 1; code_dims = 128;", 128},  // all dims, all 8-bit: the raw keys' codes
               {"traversal_codes = 1; code_dims = 80; code_coarse_dims = 32;", 4 * 64},
               {"traversal_codes = 1; code_dims = 80;", 4 * 128},
               {"traversal_codes = 1; code_dims = 96; code_coarse_dims = 32;", 4 * 128},
               {"traversal_codes = 1; code_dims = 128; code_coarse_dims = 64;", 4 * 128}};
  for (const auto& c : cases) {
    const Reports r = reports_of(c.plan);
    const boost::json::object& o = r.json;
    EXPECT_EQ(o.at("code_bytes_per_key").to_number<uint64_t>(), c.per_key) << c.plan;
    // 2 layers x (8 query heads x node bytes + 2 KV heads x code bytes) per offloaded token.
    EXPECT_EQ(o.at("index_bytes").to_number<uint64_t>(), 2 * uint64_t(offloaded) * (8 * node + 2 * c.per_key)) << c.plan;
    const bool projected = c.per_key > 128;
    EXPECT_EQ(r.text.find("projected traversal codes (one set per query head)") != std::string::npos, projected) << r.text;
  }
}

// The index knobs appear in the report (their own line) and in the JSON plan
// and domains, with the plan's defaults.
TEST(DslInspect, IndexKnobsArePrinted) {
  const Reports r = reports_of("key_metric = {0, 2} default 2; repair_fraction = 0.25; insert_queue = 16..64 step 16;");
  const std::string& out = r.text;
  EXPECT_NE(out.find("  index    build_queue 128, pivot_capacity 6, pivots_per_query 6, two_hop_fill 0, "
                     "extra_slots 4, entry_points 4, repair_fraction 0.25, key_metric 2, key_metric_ridge 0.001, "
                     "key_metric_passes 7, causal 0, insert_queue 16, insert_pivots 2, insert_reverse 8, "
                     "insert_key_queue 12, traversal_codes 0, code_dims 0, code_coarse_dims 0, search_patience 0, search_seeds 100, search_expand_first 0, search_full_expand 0, shift_queries 0, shift_span 2048, "
                     "refresh_sample 0, shared_graph 0, knn_cluster_keys 256, knn_probes 0, repair_max_queries 16384\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("key_metric {0, 2} default 2"), std::string::npos) << out;  // tunable line
  const boost::json::object& o = r.json;
  const auto& plan = o.at("plan").as_object();
  EXPECT_EQ(plan.at("key_metric").to_number<int>(), 2);
  EXPECT_EQ(plan.at("repair_fraction").to_number<double>(), 0.25);
  EXPECT_EQ(plan.at("insert_queue").to_number<int>(), 16);
  EXPECT_EQ(plan.at("causal").to_number<int>(), 0);
  EXPECT_EQ(plan.at("graph_degree").to_number<int>(), 32);
  const auto& domains = o.at("plan_domains").as_object();
  EXPECT_EQ(domains.at("key_metric").as_string(), "{0, 2} default 2");
  EXPECT_EQ(domains.at("insert_queue").as_string(), "16..64 step 16");
  EXPECT_EQ(domains.at("entry_points").as_string(), "4");
}

// search_seeds is a decode search knob: on the index line next to
// search_patience, in the JSON plan and domains, tunable when a range.
TEST(DslInspect, SearchSeedsIsPrinted) {
  const Reports r = reports_of("search_seeds = {0, 16, 32} default 16; search_patience = 64;");
  const std::string& out = r.text;
  EXPECT_NE(out.find(", traversal_codes 0, code_dims 0, code_coarse_dims 0, search_patience 64, search_seeds 16, search_expand_first 0, search_full_expand 0, shift_queries 0, shift_span 2048, refresh_sample 0, shared_graph 0, knn_cluster_keys 256, knn_probes 0, repair_max_queries 16384\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  tunable  search_seeds {0, 16, 32} default 16\n"), std::string::npos) << out;
  const boost::json::object& o = r.json;
  EXPECT_EQ(o.at("plan").as_object().at("search_seeds").to_number<int>(), 16);
  EXPECT_EQ(o.at("plan_domains").as_object().at("search_seeds").as_string(), "{0, 16, 32} default 16");

  // Absent: the library default, in the text report and the JSON of a shipped model.
  const std::string yi = run_inspect({model_path("yi-6b-200k.ra")});
  EXPECT_NE(yi.find(", search_seeds 100, "), std::string::npos) << yi;
  const boost::json::object j = boost::json::parse(run_inspect({model_path("yi-6b-200k.ra"), "--json"})).as_object();
  EXPECT_EQ(j.at("plan").as_object().at("search_seeds").to_number<int>(), 100);
  EXPECT_EQ(j.at("plan_domains").as_object().at("search_seeds").as_string(), "100");
}

// A layer's own decode searches: a line per layer after the plan line (its
// values, and its tunable domains), and "layer_search" in the JSON plan and
// domains, present only when the plan has layer blocks.
TEST(DslInspect, LayerSearchIsPrinted) {
  const Reports r = reports_of("search_queue = 160; layer 1 { search_queue = 200..400 step 100; search_expand_first = 8; }");
  const std::string& out = r.text;
  EXPECT_NE(out.find("  layer 1  search_expand_first 8, search_queue 200  (defaults; tunable search_queue 200..400 step 100)\n"
                     "  index    "),
            std::string::npos)
      << out;
  const auto& own = r.json.at("plan").as_object().at("layer_search").as_object().at("1").as_object();
  EXPECT_EQ(own.at("search_queue").to_number<int>(), 200);
  EXPECT_EQ(own.at("search_expand_first").to_number<int>(), 8);
  EXPECT_EQ(own.size(), 2u);
  const auto& domains = r.json.at("plan_domains").as_object().at("layer_search").as_object().at("1").as_object();
  EXPECT_EQ(domains.at("search_queue").as_string(), "200..400 step 100");
  EXPECT_EQ(domains.at("search_expand_first").as_string(), "8");
  const Reports plain = reports_of("search_queue = 160;");
  EXPECT_EQ(plain.json.at("plan").as_object().count("layer_search"), 0u);
  EXPECT_EQ(plain.text.find("  layer "), std::string::npos);
}

// A layer's own top_k and tail_samples print with its searches, and go into
// the JSON plan's layer_search like them.
TEST(DslInspect, LayerRetrievalIsPrinted) {
  const Reports r =
      reports_of("top_k = 100; search_queue = 1000; layer 1 { top_k = 1000; tail_samples = {0, 4096} default 4096; }");
  EXPECT_NE(r.text.find("  layer 1  tail_samples 4096, top_k 1000  (defaults; tunable tail_samples {0, 4096} default 4096)\n"),
            std::string::npos)
      << r.text;
  const auto& own = r.json.at("plan").as_object().at("layer_search").as_object().at("1").as_object();
  EXPECT_EQ(own.at("top_k").to_number<int>(), 1000);
  EXPECT_EQ(own.at("tail_samples").to_number<int>(), 4096);
  EXPECT_EQ(r.json.at("plan").as_object().at("top_k").to_number<int>(), 100);
}

// tail_samples is a retrieval knob: on the plan line (not the index line),
// in the JSON plan and domains, tunable when a range.
TEST(DslInspect, TailSamplesIsPrinted) {
  const Reports r = reports_of("tail_samples = {0, 1024, 2048} default 1024;");
  const std::string& out = r.text;
  EXPECT_NE(out.find("  plan     sinks 128, window 512, top_k 100, graph_degree 32, query_neighbors 100, "
                     "build_sample 1, search_queue 160, tail_samples 1024  (defaults)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("tail_samples {0, 1024, 2048} default 1024"), std::string::npos) << out;
  const boost::json::object& o = r.json;
  EXPECT_EQ(o.at("plan").as_object().at("tail_samples").to_number<int>(), 1024);
  EXPECT_EQ(o.at("plan_domains").as_object().at("tail_samples").as_string(), "{0, 1024, 2048} default 1024");
}

// The RoPE-shifted training queries are index build knobs: on the index line,
// in the JSON plan and domains, tunable when a range; rope_style on the rope
// line and in the JSON model.
TEST(DslInspect, ShiftQueriesAndRopeStyleArePrinted) {
  const Reports r =
      reports_of("shift_queries = {0, 512} default 512; shift_span = 4096;", "rope_base = 5e5; rope_style = gptj;");
  const std::string& out = r.text;
  EXPECT_NE(out.find("  rope     base 500000, gptj pairs\n"), std::string::npos) << out;
  EXPECT_NE(out.find(", search_patience 0, search_seeds 100, search_expand_first 0, search_full_expand 0, shift_queries 512, shift_span 4096, refresh_sample 0, shared_graph 0, knn_cluster_keys 256, knn_probes 0, repair_max_queries 16384\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  tunable  shift_queries {0, 512} default 512\n"), std::string::npos) << out;
  const boost::json::object& o = r.json;
  EXPECT_EQ(o.at("model").as_object().at("rope_style").as_string(), "gptj");
  EXPECT_EQ(o.at("plan").as_object().at("shift_queries").to_number<int>(), 512);
  EXPECT_EQ(o.at("plan").as_object().at("shift_span").to_number<int>(), 4096);
  EXPECT_EQ(o.at("plan_domains").as_object().at("shift_queries").as_string(), "{0, 512} default 512");
  EXPECT_EQ(o.at("plan_domains").as_object().at("shift_span").as_string(), "4096");

  // Absent: neox, shift off.
  const std::string llama = run_inspect({model_path("llama3-8b-262k.ra")});
  EXPECT_NE(llama.find("  rope     base 283461213, neox pairs\n"), std::string::npos) << llama;
  EXPECT_NE(llama.find("shift_queries 0, shift_span 2048"), std::string::npos) << llama;
  const boost::json::object j = boost::json::parse(run_inspect({model_path("llama3-8b-262k.ra"), "--json"})).as_object();
  EXPECT_EQ(j.at("model").as_object().at("rope_style").as_string(), "neox");
}

TEST(DslInspect, HelpAndBadArguments) {
  int rc = -1;
  const std::string help = run_inspect({"--help"}, &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(help.find("usage: rattn inspect FILE.ra"), std::string::npos);

  auto expect_error = [](std::vector<std::string> args, const std::string& want) {
    try {
      run_inspect(args);
      ADD_FAILURE() << "no error for " << want;
    } catch (const rattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  const std::string llama = model_path("llama3-8b-262k.ra");
  expect_error({}, "rattn inspect: error: expects a FILE.ra");
  expect_error({llama, "--context"}, "--context expects a token count");
  expect_error({llama, "--context", "12k"}, "--context expects a token count, got '12k'");
  expect_error({llama, "--context", "0"}, "--context must be at least 1");
  expect_error({llama, "--context", "99999999999999999999"}, "is too large");
  expect_error({llama, "--context", "300000"}, "exceeds the context of Llama-3-8B-Instruct-262k (262144)");
  expect_error({llama, "--frobnicate"}, "unknown option '--frobnicate'");
  expect_error({llama, llama}, "expects one file");
  expect_error({"/nonexistent.ra"}, "/nonexistent.ra: error: cannot open the file");
}

TEST(DslInspect, OverflowingEstimateIsAnErrorNotAWrap) {
  // The largest model the DSL accepts: its index estimate needs more than 64 bits.
  const rattn::Program p = rattn::parse_program(
      "model \"Huge\" { layers = 1024; q_heads = 1024; kv_heads = 1024; head_dim = 256; kv_dtype = f32;"
      " context = 4294967296; } plan { graph_degree = 1024; }",
      "huge.ra");
  try {
    rattn::plan_memory(p, 4294967296);
    FAIL() << "no overflow reported";
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("overflows 64 bits"), std::string::npos);
  }
  // The KV part alone (2^63 bytes) still fits at a smaller degree.
  const rattn::Program q = rattn::parse_program(
      "model \"Huge\" { layers = 1024; q_heads = 1024; kv_heads = 1024; head_dim = 256; kv_dtype = f32;"
      " context = 4294967296; } plan { graph_degree = 2; }",
      "huge.ra");
  EXPECT_EQ(rattn::plan_memory(q, 4294967296).kv_bytes_full, uint64_t(1) << 63);
}

// refresh_sample: on the index line, tunable when a set, in the JSON plan.
TEST(DslInspect, RefreshSampleIsPrinted) {
  const Reports r = reports_of("refresh_sample = {0, 0.25, 0.5} default 0.5;");
  const std::string& out = r.text;
  EXPECT_NE(out.find(", shift_span 2048, refresh_sample 0.5, shared_graph 0, knn_cluster_keys 256, knn_probes 0, repair_max_queries 16384\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  tunable  refresh_sample {0, 0.25, 0.5} default 0.5\n"), std::string::npos) << out;
  const boost::json::object& o = r.json;
  EXPECT_EQ(o.at("plan").as_object().at("refresh_sample").to_number<double>(), 0.5);
}

// shared_graph: one graph per KV head, so a quarter of the index bytes at
// group 4 (here 8 query heads over 2 KV heads, 2 layers), on the index line
// and in the indexes line; the Llama-3-8B plan at 128K goes from 1.22x its
// offloaded KV to 0.305x (156 B per node) and to 0.289x with two extra
// slots fewer.
TEST(DslInspect, SharedGraphCountsOneGraphPerKvHead) {
  const int64_t offloaded = 65536 - 640;
  const uint64_t node = 4 * (32 + 4 + 1) + 8;
  const Reports per_head = reports_of(""), shared = reports_of("shared_graph = 1;");
  EXPECT_EQ(per_head.json.at("index_bytes").to_number<uint64_t>(), 2 * 8 * offloaded * node);
  EXPECT_EQ(shared.json.at("index_bytes").to_number<uint64_t>(), 2 * 2 * offloaded * node);
  EXPECT_EQ(shared.json.at("num_indexes").to_number<int64_t>(), 4);
  EXPECT_NE(shared.text.find(", refresh_sample 0, shared_graph 1, knn_cluster_keys 256, knn_probes 0, repair_max_queries 16384\n"), std::string::npos) << shared.text;
  EXPECT_NE(shared.text.find("  indexes  4 = 2 global layers x 2 KV heads (shared_graph); index estimate = KV heads x"),
            std::string::npos)
      << shared.text;
  rattn::Program llama = rattn::load_program(model_path("llama3-8b-262k.ra"));
  const auto ratio = [&llama](double shared_graph, double extra_slots) {
    llama.plan.shared_graph = rattn::ParamDomain::fixed_value(shared_graph);
    llama.plan.extra_slots = rattn::ParamDomain::fixed_value(extra_slots);
    const rattn::MemoryPlan m = rattn::plan_memory(llama, 131072);
    return double(m.index_bytes) / double(m.kv_bytes_offloaded);
  };
  EXPECT_NEAR(ratio(0, 4), 156.0 * 4 / 512, 1e-9);
  EXPECT_NEAR(ratio(1, 4), 156.0 / 512, 1e-9);
  EXPECT_NEAR(ratio(1, 2), 148.0 / 512, 1e-9);
}

TEST(DslInspect, PlanMemoryRejectsBadContext) {
  const rattn::Program p = rattn::load_program(model_path("llama3-8b-262k.ra"));
  EXPECT_THROW(rattn::plan_memory(p, 0), rattn::Error);
  EXPECT_THROW(rattn::plan_memory(p, 262145), rattn::Error);
}

}  // namespace
