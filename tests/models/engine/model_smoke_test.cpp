// With the real model installed (scripts/get-gemma; found through
// $RATTN_GEMMA_GGUF or the Python package's cache path), the engine must
// predict sensible English. Skipped with a notice otherwise.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "tests/models/engine/installed_model.h"

namespace rattn::engine {
namespace {


int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(GemmaModel, PredictsSensibleEnglish) {
  const std::string path = testing::installed_gemma_gguf();
  if (path.empty()) GTEST_SKIP() << "Gemma-3 GGUF not installed: run scripts/get-gemma or set RATTN_GEMMA_GGUF";
  set_engine_threads(2);
  auto m = GemmaModel::load(path);
  const auto& c = m->config();
  EXPECT_EQ(c.global_layers(), (std::vector<int>{5, 11, 17}));
  const Tokenizer& tok = m->tokenizer();
  // Known token ids of Gemma-3's vocabulary.
  EXPECT_EQ(tok.encode("The capital of France is", true), (std::vector<int32_t>{2, 818, 5279, 529, 7001, 563}));
  // Round trip through the real vocabulary: newline runs, space runs, tabs,
  // non-ASCII text and bytes with no piece of their own.
  for (const std::string& text : {std::string("File: coreutils.info,  Node: ls invocation\n\n10.1 'ls': List directory contents\n"),
                                 std::string("\tTabs,   spaces   and \xC3\xA9t\xC3\xA9 \xE2\x82\xAC 12345.\n\n\n")}) {
    EXPECT_EQ(tok.decode(tok.encode(text, true)), text);
  }
  auto expect_next = [&](const std::string& prompt, const std::vector<std::string>& accepted) {
    const auto ids = tok.encode(prompt, true);
    GemmaSequence s(*m, int64_t(ids.size()) + 4);
    const std::vector<float> h = s.prefill(ids, {int64_t(ids.size()) - 1});
    std::vector<float> logits(static_cast<size_t>(c.vocab));
    m->output_head(h.data(), 1, logits.data());
    const std::string next = tok.piece(argmax(logits));
    EXPECT_NE(std::find(accepted.begin(), accepted.end(), next), accepted.end())
        << "'" << prompt << "' -> '" << next << "'";
    // The decode path must agree with the prefill path on the next position.
    const auto logits2 = s.decode(argmax(logits));
    GemmaSequence s2(*m, int64_t(ids.size()) + 4);
    auto ids2 = ids;
    ids2.push_back(argmax(logits));
    const std::vector<float> h2 = s2.prefill(ids2, {int64_t(ids2.size()) - 1});
    std::vector<float> logits3(static_cast<size_t>(c.vocab));
    m->output_head(h2.data(), 1, logits3.data());
    EXPECT_EQ(argmax(logits2), argmax(logits3));
  };
  expect_next("The capital of France is", {" Paris", " the"});
  expect_next("One, two, three, four,", {" five"});
  expect_next("Monday, Tuesday, Wednesday,", {" Thursday"});
}

}  // namespace
}  // namespace rattn::engine
