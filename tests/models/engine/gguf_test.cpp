// GGUF container parsing: metadata of every type, tensor table, alignment,
// and clear errors on truncated or malformed files.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "models/engine/gemma.h"
#include "models/engine/gguf.h"
#include "tests/models/engine/gguf_builder.h"

namespace rattn::engine {
namespace {

using testing::f32_bytes;
using testing::GgufBuilder;

GgufBuilder sample() {
  GgufBuilder b;
  b.kv_str("general.architecture", "gemma3");
  b.kv_u32("gemma3.block_count", 18);
  b.kv_i32("answer", -42);
  b.kv_f32("gemma3.rope.freq_base", 1e6f);
  b.kv_f64("pi", 3.141592653589793);
  b.kv_bool("flag", true);
  b.kv_u64("big", 1ull << 40);
  b.kv_str_array("tokenizer.ggml.tokens", {"<pad>", "a", "\xE2\x96\x81" "b"});
  b.kv_f32_array("tokenizer.ggml.scores", {0.f, -1.f, -2.5f});
  b.kv_i32_array("tokenizer.ggml.token_type", {3, 1, 1});
  b.tensor("w", {4, 2}, 0, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  b.tensor("n", {3}, 0, f32_bytes({-1, 0, 1}));
  return b;
}

TEST(Gguf, ParsesMetadataOfEveryTypeAndTensorTable) {
  const auto bytes = sample().build();
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "sample");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "gemma3");
  EXPECT_EQ(f->get_int("gemma3.block_count"), 18);
  EXPECT_EQ(f->get_int("answer"), -42);
  EXPECT_FLOAT_EQ(float(f->get_float("gemma3.rope.freq_base")), 1e6f);
  EXPECT_DOUBLE_EQ(f->get_float("pi"), 3.141592653589793);
  EXPECT_TRUE(f->get_bool("flag", false));
  EXPECT_EQ(f->get_int("big"), int64_t(1) << 40);
  EXPECT_EQ(f->get_int("missing", 7), 7);
  const auto& toks = f->get_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.size(), 3u);
  EXPECT_EQ(std::get<std::string>(toks[2].v), "\xE2\x96\x81" "b");
  const auto& sc = f->get_array("tokenizer.ggml.scores");
  EXPECT_DOUBLE_EQ(std::get<double>(sc[2].v), -2.5);
  ASSERT_EQ(f->tensors().size(), 2u);
  const GgufTensor& w = f->tensor("w");
  EXPECT_EQ(w.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(w.rows(), 2);
  EXPECT_EQ(w.bytes, 32u);
  EXPECT_EQ((w.data - bytes.data()) % 32, 0);
  float v[8];
  std::memcpy(v, w.data, 32);
  EXPECT_EQ(v[7], 8.0f);
  const GgufTensor& n = f->tensor("n");
  float nv[3];
  std::memcpy(nv, n.data, 12);
  EXPECT_EQ(nv[0], -1.0f);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  EXPECT_THROW(f->tensor("nope"), Error);
  try {
    f->get_int("general.architecture");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
  }
}

TEST(Gguf, HonoursGeneralAlignment) {
  GgufBuilder b;
  b.kv_u32("general.alignment", 64);
  b.tensor("a", {3}, 0, f32_bytes({1, 2, 3}));
  b.tensor("b", {2}, 0, f32_bytes({9, 10}));
  const auto bytes = b.build(64);
  auto f = GgufFile::parse(bytes.data(), bytes.size(), "aligned");
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ((f->tensor("b").data - bytes.data()) % 64, 0);
  float x;
  std::memcpy(&x, f->tensor("b").data, 4);
  EXPECT_EQ(x, 9.0f);
}

TEST(Gguf, EveryTruncationIsACorruptDataError) {
  const auto bytes = sample().build();
  // Every prefix shorter than the file must fail cleanly with corrupt_data;
  // the last bytes are tensor data, whose absence must also be detected.
  for (size_t n = 0; n < bytes.size(); n += (n < 400 ? 1 : 7)) {
    try {
      GgufFile::parse(bytes.data(), n, "truncated");
      FAIL() << "prefix of " << n << " bytes parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data) << n << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos);
    }
  }
}

TEST(Gguf, MalformedFilesAreRejected) {
  auto expect_corrupt = [](std::vector<uint8_t> bytes, const char* what) {
    try {
      GgufFile::parse(bytes.data(), bytes.size(), what);
      ADD_FAILURE() << what << " parsed";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data) << what << ": " << e.what();
    }
  };
  auto good = sample().build();
  auto bad_magic = good;
  bad_magic[0] = 'X';
  expect_corrupt(bad_magic, "bad magic");
  auto bad_version = good;
  bad_version[4] = 9;
  expect_corrupt(bad_version, "bad version");
  auto huge_count = good;
  huge_count[8 + 7] = 0x7f;  // tensor count
  expect_corrupt(huge_count, "huge tensor count");
  {
    GgufBuilder b;
    b.kv_u32("general.alignment", 48);  // not a power of two
    expect_corrupt(b.build(), "bad alignment");
  }
  {
    GgufBuilder b;
    b.tensor("x", {30}, 8, std::vector<uint8_t>(34));  // Q8_0 row of 30: not a multiple of 32
    expect_corrupt(b.build(), "bad block multiple");
  }
  {
    // Found by fuzzing (tests/fuzz/regressions/gguf): each dimension within
    // bounds, but their product overflowed int64 before the size check.
    GgufBuilder b;
    const int64_t big = int64_t(1) << 34;
    b.tensor("x", {big, big, big, 3}, 0, std::vector<uint8_t>(4));
    expect_corrupt(b.build(), "element count overflow");
  }
}

TEST(Gguf, UnknownTensorTypeIsUnsupported) {
  GgufBuilder b;
  b.tensor("x", {4}, 99, std::vector<uint8_t>(16));
  const auto bytes = b.build();
  try {
    GgufFile::parse(bytes.data(), bytes.size(), "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
  }
}

TEST(Gguf, OpenMapsAFileAndReportsMissingFiles) {
  const auto bytes = sample().build();
  const std::string path = ::testing::TempDir() + "/engine_gguf_test.gguf";
  {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->get_int("gemma3.block_count"), 18);
  {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size() - 5));
  }
  try {
    GgufFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  std::remove(path.c_str());
  try {
    GgufFile::open(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::io_error);
  }
}

// A Gemma-3 file's hyper-parameters are range-checked before use: a zero
// head count divided d_model (SIGFPE) and 2^32 + 2 layers truncated to 2.
TEST(GemmaLoad, ImplausibleHyperParametersAreCorruptData) {
  struct Case {
    const char* key;
    uint64_t value;
  };
  const Case cases[] = {{"gemma3.attention.head_count", 0},
                        {"gemma3.block_count", (uint64_t(1) << 32) + 2},
                        {"gemma3.embedding_length", uint64_t(-1)},
                        {"gemma3.attention.sliding_window_pattern", 0}};
  const std::string path = ::testing::TempDir() + "/engine_gemma_hparams.gguf";
  for (const Case& bad : cases) {
    GgufBuilder b;
    b.kv_str("general.architecture", "gemma3");
    const Case good[] = {{"gemma3.block_count", 2},
                         {"gemma3.embedding_length", 64},
                         {"gemma3.attention.head_count", 4},
                         {"gemma3.feed_forward_length", 96},
                         {"gemma3.attention.sliding_window_pattern", 6}};
    for (const Case& g : good) b.kv_u64(g.key, std::string(g.key) == bad.key ? bad.value : g.value);
    const auto bytes = b.build();
    {
      std::ofstream o(path, std::ios::binary);
      o.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    }
    try {
      (void)GemmaModel::load(path);
      ADD_FAILURE() << bad.key << " = " << bad.value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad.key), std::string::npos) << e.what();
    }
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace rattn::engine
