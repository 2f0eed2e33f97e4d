// The SentencePiece-style tokenizer on a small hand-built vocabulary.
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/engine/gguf.h"
#include "models/engine/tokenizer.h"
#include "tests/models/engine/gguf_builder.h"

namespace rattn::engine {
namespace {

const std::string S = "\xE2\x96\x81";  // U+2581
// S + text, built by append (GCC 12 warns falsely on operator+ here).
std::string sp(const char* text) { return std::string(S).append(text); }

// ids: 0 <pad>(control) 1 <eos> 2 <bos> 3 <unk> 4 "\n"(user) 5 "  "(user)
// 6.. byte tokens <0x00>..<0xFF>, then pieces with scores (higher = merged first).
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int32_t add(const std::string& t, float s, int32_t type = 1) {
    tokens.push_back(t);
    scores.push_back(s);
    types.push_back(type);
    return int32_t(tokens.size() - 1);
  }
};

Vocab small_vocab() {
  Vocab v;
  v.add("<pad>", 0, 3);
  v.add("<eos>", 0, 3);
  v.add("<bos>", 0, 3);
  v.add("<unk>", 0, 2);
  v.add("\n", 0, 4);
  v.add("  ", 0, 4);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.add(name, 0, 6);
  }
  for (const char* c : {"h", "e", "l", "o", "w", "r", "d", "a", "b"}) v.add(c, -100);
  v.add(S, -100);
  v.add("he", -10);
  v.add("ll", -11);
  v.add("hell", -5);
  v.add("hello", -1);
  v.add(sp("w"), -20);
  v.add(sp("wor"), -15);
  v.add("or", -30);
  v.add("ld", -25);
  v.add(sp("world"), -2);
  v.add("\xC3\xA9", -50);  // é
  return v;
}

Tokenizer make(const Vocab& v) { return Tokenizer(v.tokens, v.scores, v.types, 2, 1, 3, true, false); }

TEST(Tokenizer, MergesByScoreAndPrependsBos) {
  const Vocab v = small_vocab();
  const Tokenizer t = make(v);
  const auto ids = t.encode("hello world", true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(t.piece(ids[1]), "hello");
  EXPECT_EQ(t.piece(ids[2]), " world");
  EXPECT_EQ(t.decode(ids), "hello world");
}

TEST(Tokenizer, ScoreOrderDecidesTheSegmentation) {
  // "wor" is reachable as (▁w + or) or (▁ + wor); the pieces that exist and
  // the scores decide: ▁w (-20) merges before or (-30), then ▁wor (-15).
  const Vocab v = small_vocab();
  const Tokenizer t = make(v);
  const auto ids = t.encode(" wor", false);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(t.piece(ids[0]), " wor");
}

TEST(Tokenizer, ByteFallbackAndUserDefinedTokens) {
  const Vocab v = small_vocab();
  const Tokenizer t = make(v);
  // 'z' is not in the vocabulary: one byte token; "ü" (2 bytes): two.
  const std::string text = "hello\n  z\xC3\xBC\xC3\xA9";
  const auto ids = t.encode(text, false);
  std::vector<std::string> pieces;
  for (auto id : ids) pieces.push_back(v.tokens[size_t(id)]);
  const std::vector<std::string> want = {"hello", "\n", "  ", "<0x7A>", "<0xC3>", "<0xBC>", "\xC3\xA9"};
  EXPECT_EQ(pieces, want);
  EXPECT_EQ(t.decode(ids), text);  // round trip, bytes included
}

TEST(Tokenizer, RoundTripsArbitraryText) {
  const Vocab v = small_vocab();
  const Tokenizer t = make(v);
  for (const char* s : {"", "a", "hello hello  world\n\nabc", "\xE2\x82\xAC 100", "  leading", "tab\there"}) {
    EXPECT_EQ(t.decode(t.encode(s, true)), s) << s;
  }
}

TEST(Tokenizer, ControlTokensAreNotMatchedFromText) {
  const Vocab v = small_vocab();
  const Tokenizer t = make(v);
  const auto ids = t.encode("<bos>", false);
  for (auto id : ids) EXPECT_NE(id, 2);
  EXPECT_EQ(t.decode(ids), "<bos>");
}

TEST(Tokenizer, FromGgufReadsVocabularyAndFlags) {
  const Vocab v = small_vocab();
  testing::GgufBuilder b;
  b.kv_str("tokenizer.ggml.model", "llama");
  b.kv_str_array("tokenizer.ggml.tokens", v.tokens);
  b.kv_f32_array("tokenizer.ggml.scores", v.scores);
  b.kv_i32_array("tokenizer.ggml.token_type", v.types);
  b.kv_u32("tokenizer.ggml.bos_token_id", 2);
  b.kv_u32("tokenizer.ggml.eos_token_id", 1);
  b.kv_bool("tokenizer.ggml.add_space_prefix", false);
  const auto bytes = b.build();
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "vocab");
  const Tokenizer t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t.bos(), 2);
  const auto ids = t.encode("hello world", true);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.piece(ids[2]), " world");

  testing::GgufBuilder bad;
  bad.kv_str("tokenizer.ggml.model", "gpt2");
  const auto bb = bad.build();
  auto g = GgufFile::parse(bb.data(), bb.size(), "bpe");
  EXPECT_THROW(Tokenizer::from_gguf(*g), Error);
}

// Found by fuzzing (tests/fuzz): special ids outside the vocabulary were
// accepted and came out of encode(); a byte token with bad hex digits threw
// std::invalid_argument from std::stoi.
TEST(Tokenizer, RejectsSpecialIdsOutsideTheVocabulary) {
  const Vocab v = small_vocab();
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id"}) {
    testing::GgufBuilder b;
    b.kv_str("tokenizer.ggml.model", "llama");
    b.kv_str_array("tokenizer.ggml.tokens", v.tokens);
    b.kv_u32(key, uint32_t(v.tokens.size()));
    const auto bytes = b.build();
    auto f = GgufFile::parse(bytes.data(), bytes.size(), "vocab");
    try {
      (void)Tokenizer::from_gguf(*f);
      ADD_FAILURE() << key << " outside the vocabulary was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data);
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tokenizer(v.tokens, v.scores, v.types, -1, 1, 3, true, false), Error);
}

TEST(Tokenizer, MalformedByteTokenIsPlainText) {
  Vocab v = small_vocab();
  const int32_t odd = v.add("<0xZ1>", 0, 6);
  const Tokenizer t = make(v);
  EXPECT_EQ(t.piece(odd), "<0xZ1>");
  EXPECT_EQ(t.piece(6 + 0x41), "A");  // a well-formed one still decodes to its byte
}

}  // namespace
}  // namespace rattn::engine
