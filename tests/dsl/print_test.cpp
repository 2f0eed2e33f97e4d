// format_program writes DSL text that parses back to the same program: the
// shipped models and a program using every construct the printer emits.
#include <gtest/gtest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <string>

#include "dsl/dsl.h"
#include "dsl/memory_plan.h"

namespace {

// Everything inspect reports of a program (model, plan values and domains,
// layer blocks, target, memory), less the file name.
boost::json::object report_of(const rattn::Program& p) {
  boost::json::object o = rattn::report_json(p, rattn::plan_memory(p, std::min<int64_t>(p.model.max_context, 4096)));
  o.erase("file");
  return o;
}

void expect_round_trip(const rattn::Program& p) {
  const std::string text = rattn::format_program(p);
  const rattn::Program back = rattn::parse_program(text, "printed.ra");
  EXPECT_EQ(report_of(back), report_of(p)) << text;
  EXPECT_EQ(rattn::format_program(back), text);
  ASSERT_EQ(back.model.layers.size(), p.model.layers.size());
  for (size_t i = 0; i < p.model.layers.size(); ++i) {
    EXPECT_EQ(back.model.layers[i].global, p.model.layers[i].global) << i;
    EXPECT_EQ(back.model.layers[i].sliding_window, p.model.layers[i].sliding_window) << i;
    EXPECT_EQ(back.model.layers[i].rope_base, p.model.layers[i].rope_base) << i;
  }
}

TEST(DslPrint, ShippedModelsRoundTrip) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(RATTN_SOURCE_DIR) + "/models")) {
    if (e.path().extension() != ".ra") continue;
    SCOPED_TRACE(e.path().string());
    expect_round_trip(rattn::load_program(e.path().string()));
    ++n;
  }
  EXPECT_GE(n, 7);
}

TEST(DslPrint, EveryConstructRoundTrips) {
  const rattn::Program p = rattn::parse_program(
      "model \"M \\\"q\\\" \\\\ x\" { source = \"a\\tb\"; layers = 8; q_heads = 8; kv_heads = 2; head_dim = 128;\n"
      "  kv_dtype = bf16; rope_base { global = 5e5; local = 1e4; } rope_style = gptj; context = 65536;\n"
      "  pattern = global, [local(100) x 2, global] x 2, local(7); }\n"
      "plan { build_sample = 0.1..0.7 step 0.2 default 0.3; key_metric_ridge = 0.000123456789;\n"
      "  search_queue = 100..1600 step *2; top_k = {50, 100} default 100; repair_fraction = 0.3;\n"
      "  kernel.cuda.splits = 1..8 step *2 default 4; kernel.halide.vector = 16;\n"
      "  layer 3, 0 { search_queue = 120..240 step 40 default 160; search_seeds = {0, 64}; }\n"
      "  layer 6 { search_expand_first = 8; } }\n"
      "target { gpu = sm_90; cpu = \"skylake-avx512\"; }\n",
      "every.ra");
  expect_round_trip(p);
  const std::string text = rattn::format_program(p);
  EXPECT_NE(text.find("pattern = global, local(100) x 2, global, local(100) x 2, global, local(7);"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  build_sample = 0.1..0.7 step 0.2 default 0.3;\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  layer 0 { search_queue = 120..240 step 40 default 160; search_seeds = {0, 64}; }\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(p.plan.key_metric_ridge.values.at(0), rattn::parse_program(text, "x.ra").plan.key_metric_ridge.values.at(0));
}

}  // namespace
