// Calibration directory: write/read round trip in f32 and f16, and clear errors
// for missing, truncated and mismatched files.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "tests/temp_dir.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "runtime/data/calib.h"

namespace rattn {
namespace {

namespace fs = std::filesystem;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("rattn_calib_test") {}
};

CalibManifest small_manifest(DType dt) {
  CalibManifest m;
  m.model = "tiny-test";
  m.layers = {0, 3};
  m.num_q_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 8;
  m.tokens = 10;
  m.dtype = dt;
  return m;
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int(i % 97) - 48) / 16.0f;
  return v;
}

class CalibTest : public ::testing::TestWithParam<DType> {};

TEST_P(CalibTest, RoundTrip) {
  TempDir dir;
  const CalibManifest m = small_manifest(GetParam());
  write_calib_manifest(dir.path.string(), m);
  const auto q = ramp(4 * 10 * 8, 1.0f), k = ramp(2 * 10 * 8, 0.5f), v = ramp(2 * 10 * 8, -2.0f);
  write_calib_layer(dir.path.string(), 3, q.data(), k.data(), v.data(), m);
  const CalibManifest r = read_calib_manifest(dir.path.string());
  EXPECT_EQ(r.model, "tiny-test");
  EXPECT_EQ(r.layers, m.layers);
  EXPECT_EQ(r.num_q_heads, 4);
  EXPECT_EQ(r.num_kv_heads, 2);
  EXPECT_EQ(r.group(), 2);
  EXPECT_EQ(r.head_dim, 8);
  EXPECT_EQ(r.tokens, 10);
  EXPECT_EQ(r.dtype, GetParam());
  EXPECT_TRUE(r.rope_applied);
  const CalibLayer l = read_calib_layer(dir.path.string(), r, 3);
  // ramp values are multiples of 1/32 within fp16 range: exact in both dtypes.
  EXPECT_EQ(l.q, q);
  EXPECT_EQ(l.k, k);
  EXPECT_EQ(l.v, v);
  // Layer 0 is in the manifest but was not written.
  try {
    read_calib_layer(dir.path.string(), r, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::not_found);
    EXPECT_NE(std::string(e.what()).find("layer_0.q.npy"), std::string::npos);
  }
  EXPECT_THROW(read_calib_layer(dir.path.string(), r, 7), Error);  // not in manifest
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CalibTest, ::testing::Values(DType::f32, DType::f16));

TEST(Calib, TruncatedNpyRejected) {
  TempDir dir;
  const CalibManifest m = small_manifest(DType::f32);
  write_calib_manifest(dir.path.string(), m);
  const auto q = ramp(4 * 10 * 8, 1.0f), k = ramp(2 * 10 * 8, 1.0f);
  write_calib_layer(dir.path.string(), 0, q.data(), k.data(), k.data(), m);
  const std::string kpath = calib_layer_path(dir.path.string(), 0, 'k');
  const std::string bytes = read_file(kpath);
  write_file_atomic(kpath, bytes.substr(0, bytes.size() - 7));
  try {
    read_calib_layer(dir.path.string(), m, 0);
    ADD_FAILURE() << "truncated file accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
  }
}

TEST_P(CalibTest, NonFiniteValuesAreRefusedNamingTheFileAndIndex) {
  TempDir dir;
  const CalibManifest m = small_manifest(GetParam());
  write_calib_manifest(dir.path.string(), m);
  auto q = ramp(4 * 10 * 8, 1.0f), k = ramp(2 * 10 * 8, 0.5f), v = ramp(2 * 10 * 8, -2.0f);
  k[size_t(1 * 10 + 4) * 8 + 6] = std::numeric_limits<float>::quiet_NaN();  // head 1, token 4, dim 6
  write_calib_layer(dir.path.string(), 3, q.data(), k.data(), v.data(), m);
  try {
    read_calib_layer(dir.path.string(), m, 3);
    FAIL() << "a NaN key loaded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.status(), Status::corrupt_data);
    EXPECT_NE(msg.find(calib_layer_path(dir.path.string(), 3, 'k')), std::string::npos) << msg;
    EXPECT_NE(msg.find("element 118 (head 1, token 4, dim 6): value nan"), std::string::npos) << msg;
  }
  k[size_t(1 * 10 + 4) * 8 + 6] = 0.0f;
  q[0] = -std::numeric_limits<float>::infinity();
  write_calib_layer(dir.path.string(), 3, q.data(), k.data(), v.data(), m);
  EXPECT_THROW(read_calib_layer(dir.path.string(), m, 3), Error);
  q[0] = 0.0f;
  write_calib_layer(dir.path.string(), 3, q.data(), k.data(), v.data(), m);
  EXPECT_NO_THROW(read_calib_layer(dir.path.string(), m, 3));
}

// A calibration layer file that is a FIFO or a directory: an I/O error naming
// the file, never a hang.
TEST(Calib, FifoOrDirectoryLayerFileRejected) {
  TempDir dir;
  const CalibManifest m = small_manifest(DType::f32);
  write_calib_manifest(dir.path.string(), m);
  const auto q = ramp(4 * 10 * 8, 1.0f), k = ramp(2 * 10 * 8, 1.0f);
  write_calib_layer(dir.path.string(), 0, q.data(), k.data(), k.data(), m);
  const std::string kpath = calib_layer_path(dir.path.string(), 0, 'k');
  for (const bool fifo : {true, false}) {
    const char* kind = fifo ? "is a FIFO" : "is a directory";
    fs::remove(kpath);
    if (fifo)
      ASSERT_EQ(::mkfifo(kpath.c_str(), 0600), 0);
    else
      fs::create_directory(kpath);
    try {
      read_calib_layer(dir.path.string(), m, 0);
      ADD_FAILURE() << kind << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::io_error);
      EXPECT_NE(std::string(e.what()).find(kpath), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(kind), std::string::npos) << e.what();
    }
  }
}

TEST(Calib, ShapeMismatchRejected) {
  TempDir dir;
  CalibManifest m = small_manifest(DType::f32);
  write_calib_manifest(dir.path.string(), m);
  const auto q = ramp(4 * 10 * 8, 1.0f), k = ramp(2 * 10 * 8, 1.0f);
  write_calib_layer(dir.path.string(), 0, q.data(), k.data(), k.data(), m);
  m.tokens = 11;
  try {
    read_calib_layer(dir.path.string(), m, 0);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos);
  }
}

TEST(Calib, BadManifestRejected) {
  TempDir dir;
  EXPECT_THROW(read_calib_manifest(dir.path.string()), Error);  // missing
  fs::create_directories(dir.path);
  const std::string mp = (dir.path / "manifest.json").string();
  write_file_atomic(mp, "{\"layers\": [0], \"num_q_heads\": 4");  // truncated JSON
  EXPECT_THROW(read_calib_manifest(dir.path.string()), Error);
  write_file_atomic(mp,
                    "{\"layers\":[0],\"num_q_heads\":6,\"num_kv_heads\":4,\"head_dim\":8,\"tokens\":3,"
                    "\"dtype\":\"f32\",\"rope_applied\":true}");
  EXPECT_THROW(read_calib_manifest(dir.path.string()), Error);  // 6 % 4 != 0
  write_file_atomic(mp,
                    "{\"layers\":[0],\"num_q_heads\":4,\"num_kv_heads\":4,\"head_dim\":8,\"tokens\":3,"
                    "\"dtype\":\"f32\",\"rope_applied\":false}");
  EXPECT_THROW(read_calib_manifest(dir.path.string()), Error);
  CalibManifest bad = small_manifest(DType::bf16);
  EXPECT_THROW(write_calib_manifest(dir.path.string(), bad), Error);
  // Counts beyond int were truncated into plausible ones (2^32 + 4 read as 4).
  write_file_atomic(mp,
                    "{\"layers\":[0],\"num_q_heads\":4294967300,\"num_kv_heads\":4,\"head_dim\":8,\"tokens\":3,"
                    "\"dtype\":\"f32\",\"rope_applied\":true}");
  try {
    (void)read_calib_manifest(dir.path.string());
    ADD_FAILURE() << "num_q_heads 2^32 + 4 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
    EXPECT_NE(std::string(e.what()).find("num_q_heads"), std::string::npos) << e.what();
  }
  write_file_atomic(mp,
                    "{\"layers\":[4294967301],\"num_q_heads\":4,\"num_kv_heads\":4,\"head_dim\":8,\"tokens\":3,"
                    "\"dtype\":\"f32\",\"rope_applied\":true}");
  EXPECT_THROW(read_calib_manifest(dir.path.string()), Error);  // layer id 2^32 + 5 read as 5
}

}  // namespace
}  // namespace rattn
