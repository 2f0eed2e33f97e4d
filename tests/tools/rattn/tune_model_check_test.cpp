// `rattn tune --model-check`'s check (tools/rattn/tune_model_check.h) on a
// tiny random Gemma-3 and a plan of its layout: a plan that retrieves every
// offloaded token passes; one that keeps a single key fails on the KL
// against that reference and says so; the scope names what an outcome
// depends on.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "tests/models/engine/tiny_gemma.h"
#include "tests/temp_dir.h"
#include "tools/rattn/tune_model_check.h"

namespace rattn::cli {
namespace {

namespace fs = std::filesystem;

// The tiny model's layout (tests/models/engine/tiny_gemma.h) with a plan.
std::string tiny_plan(const std::string& plan_items) {
  return "model \"Tiny\" { layers = 6; q_heads = 4; kv_heads = 1; head_dim = 64; kv_dtype = f32;\n"
         "  pattern = local(8) x 5, global; context = 1024; }\n"
         "plan { " + plan_items + " }\n";
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class TinyModelCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf_ = (dir_ / "tiny.gguf").string();
    engine::testing::write_tiny_gemma(gguf_, 300, 64);
    std::string words;
    for (int i = 0; words.size() < 2000; ++i) words += std::string(1, char('a' + (i * 7) % 26)) + (i % 5 == 4 ? " " : "");
    for (const char* name : {"a.txt", "b.txt"}) {
      texts_.push_back((dir_ / name).string());
      write(texts_.back(), name[0] == 'a' ? words : std::string(words.rbegin(), words.rend()));
    }
  }
  ModelCheckConfig config() const {
    ModelCheckConfig c;
    c.gguf = gguf_;
    c.texts = texts_;
    c.positions = 64;
    c.tokens = 200;
    c.min_agreement = 0.9;
    c.confidence = 0.5;
    c.max_perplexity_change = 10;
    c.threads = 2;
    c.kv_storage = RATTN_F32;
    return c;
  }
  test::TempDir tmp_{"rattn_model_check_test"};
  const fs::path& dir_ = tmp_.path;
  std::string gguf_;
  std::vector<std::string> texts_;
};

TEST_F(TinyModelCheck, TheReferencesKlBoundsACandidate) {
  const std::string every = tiny_plan("sinks = 4; window = 16; top_k = 1000; search_queue = 1000;");
  const std::string one_key = tiny_plan("sinks = 1; window = 1; top_k = 1; search_queue = 8;");
  ModelCheckConfig c = config();
  c.reference_plan = (dir_ / "reference.ra").string();
  write(c.reference_plan, every);
  int calls = 0;
  auto progress = [&](double fraction, const std::string&) {
    EXPECT_GE(fraction, 0.0);
    EXPECT_LE(fraction, 1.0);
    ++calls;
  };
  const auto check = make_model_check(c);
  const ModelCheckOutcome same = check(every, 0, progress);
  ASSERT_EQ(same.texts.size(), 2u);
  EXPECT_TRUE(same.passed) << same.summary();
  for (const ModelCheckText& t : same.texts) {
    EXPECT_EQ(t.positions, 64);
    EXPECT_EQ(t.agreeing, 64);  // every offloaded token: full attention's tokens
    EXPECT_NEAR(t.perplexity_ratio, 1.0, 1e-3);
  }
  EXPECT_GT(same.kl_bound, 0.0);
  EXPECT_LE(same.kl_mean, same.kl_bound);
  EXPECT_GT(calls, 0);
  const ModelCheckOutcome poor = check(one_key, 0, progress);
  EXPECT_FALSE(poor.passed) << poor.summary();
  EXPECT_GT(poor.kl_mean, poor.kl_bound) << poor.summary();
  EXPECT_NE(poor.summary().find("against a bound of"), std::string::npos);
  // Without the reference the poor plan meets the loose agreement bound.
  ModelCheckConfig loose = config();
  loose.min_agreement = 0.01;
  const ModelCheckOutcome alone = make_model_check(loose)(one_key, 0, progress);
  EXPECT_TRUE(alone.passed) << alone.summary();
  EXPECT_EQ(alone.kl_bound, 0.0);
  // What the outcome depends on is in the scope: the texts' content among it.
  const std::string scope = model_check_scope(c);
  write(texts_[1], "other text entirely");
  EXPECT_NE(model_check_scope(c), scope);
  EXPECT_NE(scope.find("reference "), std::string::npos);
}

}  // namespace
}  // namespace rattn::cli
