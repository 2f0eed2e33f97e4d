// The front end's limits on hostile input: the source size cap, the set cap,
// the pattern length, the length of quoted source, and the byte order mark.
// Inputs are large enough that a quadratic path would time the test out.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "dsl/dsl.h"

namespace {

#define MODEL "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096; }\n"

// The message parse_program throws for `src` ("" when it parses).
std::string error_of(const std::string& src) {
  try {
    rattn::parse_program(src, "big.ra");
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::parse_error) << e.what();
    return e.what();
  }
  return {};
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

size_t longest_line(const std::string& s) {
  std::istringstream in(s);
  size_t n = 0;
  for (std::string l; std::getline(in, l);) n = std::max(n, l.size());
  return n;
}

// `plan { top_k = {1, 2, ..., n}; }`
std::string set_plan(int n, const char* key = "top_k") {
  std::string s = MODEL "plan { " + std::string(key) + " = {";
  for (int i = 1; i <= n; ++i) s += (i > 1 ? ", " : "") + std::to_string(i);
  return s + "}; }\n";
}

TEST(DslLimits, HalfAMillionMemberSetIsRefusedBySize) {
  const std::string src = set_plan(500000);
  ASSERT_GT(src.size(), rattn::kMaxSourceBytes);
  const std::string msg = error_of(src);
  EXPECT_EQ(first_line(msg).rfind("big.ra:1:1: error: the file is ", 0), 0u) << msg;
  EXPECT_NE(msg.find("at most 1048576 (1 MiB)"), std::string::npos) << msg;
}

TEST(DslLimits, SetIsCappedLikeARange) {
  // 10001 members is under the size cap: the set cap refuses it, at the 10001st.
  const std::string src = set_plan(10001, "search_patience");
  ASSERT_LT(src.size(), rattn::kMaxSourceBytes);
  const std::string msg = error_of(src);
  const size_t col = src.find(", 10001}") + 3;  // 1-based column of "10001"
  const size_t line_start = src.find('\n') + 1;
  EXPECT_EQ(first_line(msg), "big.ra:2:" + std::to_string(col - line_start) +
                                 ": error: the set of 'search_patience' has more than 10000 members; at most 10000 are allowed")
      << first_line(msg);
  EXPECT_EQ(error_of(set_plan(10000, "search_patience")), "");
}

TEST(DslLimits, DuplicateInALargeSetIsFoundAtItsSecondOccurrence) {
  // 9999 distinct members, then 5000 again: the repeat is the last member.
  std::string src = set_plan(9999, "search_patience");
  src.insert(src.rfind('}', src.size() - 4), ", 5000");
  const std::string msg = error_of(src);
  EXPECT_NE(first_line(msg).find("the value 5000 appears twice in the set of 'search_patience'"), std::string::npos) << msg;
  const size_t col = src.rfind("5000") - src.find('\n');
  EXPECT_EQ(first_line(msg).rfind("big.ra:2:" + std::to_string(col) + ":", 0), 0u) << first_line(msg);
  // Several repeats: the earliest second occurrence is named.
  EXPECT_NE(error_of(MODEL "plan { search_patience = {7, 3, 9, 3, 7}; }").find("big.ra:2:36: error: the value 3 appears twice"),
            std::string::npos);
}

TEST(DslLimits, LongPatternStopsAtTheLayerLimit) {
  std::string src = "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096;\n  pattern = global";
  for (int i = 0; i < 100000; ++i) src += ", global";
  src += "; }\n";
  ASSERT_LT(src.size(), rattn::kMaxSourceBytes);
  const std::string msg = error_of(src);
  EXPECT_NE(first_line(msg).find("the layer pattern lists more than 1024 items; a model has at most 1024 layers"),
            std::string::npos) << first_line(msg);
  // The same inside a group.
  std::string group = "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096;\n  pattern = [global";
  for (int i = 0; i < 5000; ++i) group += ", global";
  group += "]; }\n";
  EXPECT_NE(error_of(group).find("lists more than 1024 items"), std::string::npos);
}

TEST(DslLimits, LongLayerListStopsAtTheLayerLimit) {
  std::string src = MODEL "plan { layer 0";
  for (int i = 0; i < 200000; ++i) src += ", 1";
  src += " { search_queue = 200; } }\n";
  ASSERT_LT(src.size(), rattn::kMaxSourceBytes);
  const std::string msg = error_of(src);
  EXPECT_NE(first_line(msg).find("the layer block lists more than 1024 layers"), std::string::npos) << first_line(msg);
}

TEST(DslLimits, SixteenMegabytePatternLineIsRefusedBySize) {
  std::string src = "model \"M\" { layers = 4; q_heads = 8; kv_heads = 2; head_dim = 128; context = 4096;\n  pattern = global";
  while (src.size() < (size_t(16) << 20)) src += ", global";
  const std::string msg = error_of(src + "; }\n");
  EXPECT_NE(first_line(msg).find("a .ra file may have at most 1048576"), std::string::npos) << first_line(msg);
}

TEST(DslLimits, HugeNumberIsNotEchoedWhole) {
  const std::string digits(900000, '7');
  ASSERT_LT(digits.size() + 200, rattn::kMaxSourceBytes);
  for (const std::string& src : {std::string(MODEL "plan { top_k = ") + digits + "; }\n",
                                 std::string(MODEL "plan { repair_fraction = ") + digits + ".5; }\n",
                                 std::string(MODEL "plan { top_k = ") + digits + "x; }\n",
                                 std::string(MODEL "plan { build_sample = 2.") + std::string(900000, '0') + "; }\n"}) {
    const std::string msg = error_of(src);
    ASSERT_FALSE(msg.empty());
    EXPECT_LT(longest_line(msg), 200u) << msg.substr(0, 400);
    EXPECT_TRUE(msg.find("777...") != std::string::npos || msg.find("000...") != std::string::npos) << msg.substr(0, 400);
  }
}

TEST(DslLimits, LongLineIsQuotedAroundTheColumn) {
  // The error sits 5000 characters into the line; the quote keeps it in view.
  const std::string pad(5000, ' ');
  const std::string msg = error_of(MODEL "plan {" + pad + "top_k = 8 search_queue = 9; }\n");
  std::istringstream in(msg);
  std::string head, quote, caret;
  std::getline(in, head);
  std::getline(in, quote);
  std::getline(in, caret);
  EXPECT_EQ(head, "big.ra:2:5017: error: expected ';' after the value of 'top_k', got 'search_queue'");
  EXPECT_LE(quote.size(), 2 + 80u) << quote;
  EXPECT_EQ(quote.rfind("  ...", 0), 0u) << quote;
  ASSERT_EQ(caret.back(), '^');
  EXPECT_EQ(quote.substr(caret.size() - 1, 12), "search_queue") << quote << "\n" << caret;
}

TEST(DslLimits, ByteOrderMarkIsSkipped) {
  const std::string bom = "\xEF\xBB\xBF";
  const rattn::Program p = rattn::parse_program(bom + MODEL, "bom.ra");
  EXPECT_EQ(p.model.num_layers, 4);
  // Columns on the first line count from after the mark.
  const std::string msg = error_of(bom + "model \"M\" { layers = 4 q_heads = 8; }");
  EXPECT_EQ(first_line(msg).rfind("big.ra:1:24: error: expected ';'", 0), 0u) << msg;
  // Only at the start: elsewhere it is still an unexpected byte.
  EXPECT_NE(error_of(std::string(MODEL) + bom).find("unexpected character byte 0xEF"), std::string::npos);
}

TEST(DslLimits, FileLargerThanTheCapIsRefusedUnread) {
  const std::string path = testing::TempDir() + "/rattn_dsl_too_large.ra";
  {
    std::ofstream out(path, std::ios::binary);
    out << MODEL << std::string(rattn::kMaxSourceBytes, '#');
  }
  try {
    rattn::load_program(path);
    FAIL() << "a file over the cap loaded";
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::parse_error);
    EXPECT_EQ(first_line(e.what()), path + ":1:1: error: the file is " + std::to_string(rattn::kMaxSourceBytes + sizeof MODEL - 1) +
                                        " bytes; a .ra file may have at most 1048576 (1 MiB)");
  }
  // Exactly at the cap is fine.
  {
    std::ofstream out(path, std::ios::binary);
    const std::string model = MODEL;
    out << model << std::string(rattn::kMaxSourceBytes - model.size(), '#');
  }
  EXPECT_EQ(rattn::load_program(path).model.num_layers, 4);
  std::remove(path.c_str());
}

}  // namespace
