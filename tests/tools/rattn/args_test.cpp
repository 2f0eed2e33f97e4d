// The option-value pieces every subcommand parses with (tools/rattn/args.h), and `rattn eval --variant`.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tools/rattn/args.h"
#include "tools/rattn/eval.h"

namespace {

using rattn::cli::int_arg;
using rattn::cli::split;
using rattn::cli::to_double;
using rattn::cli::to_int;

TEST(CliArgs, NumbersMustBeTheWholeString) {
  EXPECT_EQ(to_int("42"), 42);
  EXPECT_EQ(to_int("-7"), -7);
  EXPECT_FALSE(to_int(""));
  EXPECT_FALSE(to_int("4x"));
  EXPECT_FALSE(to_int("1.5"));
  EXPECT_DOUBLE_EQ(*to_double("0.25"), 0.25);
  EXPECT_FALSE(to_double(""));
  EXPECT_FALSE(to_double("0.25s"));
}

TEST(CliArgs, SplitDropsEmptyItemsUnlessAsked) {
  EXPECT_EQ(split("a,,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split("a,,b", ',', true), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split("1:2:3", ':'), (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_TRUE(split("").empty());
}

// The usage error's text for `s`, or "" when it parses.
std::string int_error(const std::string& s, int64_t lo, int64_t hi) {
  try {
    int_arg("rattn x", "--n", s, lo, hi);
  } catch (const rattn::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(CliArgs, IntegerOptionsSayTheirBounds) {
  EXPECT_EQ(int_arg("rattn x", "--n", "5", 1, 9), 5);
  EXPECT_EQ(int_error("0", 1, 9), "rattn x: error: --n expects an integer in [1, 9], got '0'");
  EXPECT_EQ(int_error("x", 1, std::numeric_limits<int64_t>::max()), "rattn x: error: --n expects an integer >= 1, got 'x'");
  EXPECT_EQ(int_error("", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()),
            "rattn x: error: --n expects an integer, got ''");
  EXPECT_THROW(rattn::cli::real_arg("rattn x", "--f", "z"), rattn::UsageError);
  EXPECT_DOUBLE_EQ(rattn::cli::real_arg("rattn x", "--f", "1e-3"), 1e-3);
}

// `rattn eval --variant` takes the index build's knobs, so a build recipe is
// compared with the plan on one prefill; -1 keeps the plan's.
rattn::cli::eval::Options eval_options(const std::string& variant) {
  std::vector<std::string> args = {"eval", "--gguf", "m.gguf", "--text", "t.txt", "--variant", variant};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  bool help = false;
  return rattn::cli::eval::parse_options(int(argv.size()), argv.data(), &help);
}

std::string eval_error(const std::string& variant) {
  try {
    rattn::cli::eval::variants_of(eval_options(variant));
  } catch (const rattn::UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(EvalVariant, TakesTheIndexBuildKnobs) {
  const auto vs = rattn::cli::eval::variants_of(eval_options("build_sample=0.25,graph_degree=24,query_neighbors=50"));
  ASSERT_EQ(vs.size(), 2u);
  EXPECT_EQ(vs[0].build_sample, -1.f);
  EXPECT_EQ(vs[0].graph_degree, -1);
  EXPECT_EQ(vs[1].build_sample, 0.25f);
  EXPECT_EQ(vs[1].graph_degree, 24);
  EXPECT_EQ(vs[1].query_neighbors, 50);
  EXPECT_EQ(vs[1].top_k, -1);
  EXPECT_NE(eval_error("build_sample=0").find("build_sample must be in (0, 1], got '0'"), std::string::npos);
  EXPECT_NE(eval_error("build_sample=1.5").find("build_sample must be in (0, 1]"), std::string::npos);
  EXPECT_NE(eval_error("graph_degree=0").find("graph_degree expects an integer >= 1"), std::string::npos);
  EXPECT_NE(eval_error("shared_graph=1").find("unknown key 'shared_graph'"), std::string::npos);
}

// plan=FILE: the variant runs another plan file (a tuned.ra with its
// per-layer values); an unreadable one is refused before any work.
TEST(EvalVariant, TakesAnotherPlanFile) {
  const std::string plan = std::string(RATTN_SOURCE_DIR) + "/models/gemma3-270m.ra";
  const auto vs = rattn::cli::eval::variants_of(eval_options("plan=" + plan + ",top_k=300"));
  ASSERT_EQ(vs.size(), 2u);
  EXPECT_EQ(vs[0].plan, "");
  EXPECT_EQ(vs[1].plan, plan);
  EXPECT_EQ(vs[1].top_k, 300);
  EXPECT_NE(eval_error("plan=/nonexistent/x.ra").find("--variant plan: cannot read '/nonexistent/x.ra'"),
            std::string::npos);
  EXPECT_NE(eval_error("plan=").find("--variant plan: cannot read ''"), std::string::npos);
}

}  // namespace
