// The parser never crashes: every input either parses (and prints back to
// DSL that parses to the same text) or throws rattn::Error with a
// "file:line:col: error: " message. Replays the fuzzer's regressions
// (tests/dsl/regressions/), the model files, every truncation of each model
// file, and byte mutations of them from a fixed seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "dsl/dsl.h"
#include "dsl/memory_plan.h"

namespace {

namespace fs = std::filesystem;

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> files_in(const std::string& dir, const std::string& ext) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && (ext.empty() || e.path().extension() == ext)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Parses `text`; returns "" when it parsed or failed properly, else what went wrong.
std::string check_one(const std::string& text) {
  static const std::regex kPrefix(R"(^in\.ra:([0-9]+):([0-9]+): error: .+)");
  try {
    const rattn::Program p = rattn::parse_program(text, "in.ra");
    // What `rattn tune -o` writes of it parses back and prints the same.
    const std::string printed = rattn::format_program(p);
    try {
      if (rattn::format_program(rattn::parse_program(printed, "printed.ra")) != printed) return "printing is not stable";
    } catch (const rattn::Error& e) {
      return std::string("the printed program does not parse: ") + e.what();
    }
    // What `rattn inspect` does next; only a checked overflow may throw.
    try {
      const rattn::MemoryPlan m = rattn::plan_memory(p, p.model.max_context);
      if (rattn::format_report(p, m).empty()) return "empty report";
      (void)rattn::report_json(p, m);
    } catch (const rattn::Error& e) {
      if (std::string(e.what()).find("overflows 64 bits") == std::string::npos) return std::string("inspect: ") + e.what();
    }
    return {};
  } catch (const rattn::Error& e) {
    const std::string msg = e.what();
    const std::string first = msg.substr(0, msg.find('\n'));
    std::smatch m;
    if (e.status() != rattn::Status::parse_error) return "wrong status: " + msg;
    if (!std::regex_match(first, m, kPrefix)) return "bad message: " + msg;
    const long line = std::stol(m[1]), col = std::stol(m[2]);
    const long lines = long(std::count(text.begin(), text.end(), '\n')) + 1;
    if (line < 1 || col < 1 || line > lines) return "location out of the text: " + first;
    return {};
  } catch (const std::exception& e) {
    return std::string("non-rattn exception: ") + e.what();
  }
}

std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 300)) {
    if (c >= 0x20 && c < 0x7f) out += char(c);
    else { char b[8]; std::snprintf(b, sizeof b, "\\x%02x", c); out += b; }
  }
  return out;
}

const std::string kSource = RATTN_SOURCE_DIR;

TEST(DslReplay, FuzzerRegressions) {
  const auto files = files_in(kSource + "/tests/dsl/regressions", "");
  int replayed = 0;
  for (const auto& f : files) {
    if (f.extension() == ".md") continue;
    ++replayed;
    const std::string problem = check_one(read(f));
    EXPECT_EQ(problem, "") << f;
  }
  EXPECT_GT(replayed, 0) << "tests/dsl/regressions/ holds no inputs";
}

TEST(DslReplay, ModelFilesAndEveryTruncation) {
  const auto files = files_in(kSource + "/models", ".ra");
  ASSERT_FALSE(files.empty());
  long checked = 0;
  for (const auto& f : files) {
    const std::string text = read(f);
    EXPECT_EQ(check_one(text), "") << f;
    EXPECT_NO_THROW(rattn::parse_program(text, f.string())) << f;
    for (size_t n = 0; n < text.size(); ++n) {
      const std::string cut = text.substr(0, n);
      const std::string problem = check_one(cut);
      ASSERT_EQ(problem, "") << f << " cut at " << n << ": " << escaped(cut);
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(DslReplay, RandomByteMutations) {
  std::mt19937 rng(20240917);
  const auto files = files_in(kSource + "/models", ".ra");
  ASSERT_FALSE(files.empty());
  // Bytes that matter to the grammar, plus anything at all.
  const std::string interesting = "{}[]()=;,.#\"\\-*_x0123456789e \n\t\x01\xff";
  for (const auto& f : files) {
    const std::string text = read(f);
    for (int trial = 0; trial < 400; ++trial) {
      std::string s = text;
      const int edits = 1 + int(rng() % 4);
      for (int e = 0; e < edits && !s.empty(); ++e) {
        const size_t pos = rng() % s.size();
        const char c = (rng() % 2) ? interesting[rng() % interesting.size()] : char(rng() % 256);
        switch (rng() % 3) {
          case 0: s[pos] = c; break;                      // flip
          case 1: s.insert(s.begin() + long(pos), c); break;  // insert
          default: s.erase(pos, 1 + rng() % 8); break;     // delete a run
        }
      }
      const std::string problem = check_one(s);
      ASSERT_EQ(problem, "") << f << " trial " << trial << ": " << escaped(s);
    }
  }
}

}  // namespace
