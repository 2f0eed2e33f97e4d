#include <gtest/gtest.h>

#include "core/cpu_info.h"
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/memory.h"
#include "core/npy.h"

namespace fs = std::filesystem;
using namespace rattn;

namespace {
fs::path temp_dir() {
  fs::path p = fs::temp_directory_path() / ("rattn_core_test_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}
}  // namespace

TEST(InputRange, FirstOutOfRangeMatchesAPlainScanForEveryDtypePair) {
  // Every fp16 and bf16 bit pattern, and fp32 values around each limit.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  for (DType src : {DType::f16, DType::bf16})
    for (DType store : types)
      for (uint32_t i = 0; i < 65536; ++i) {
        const float x = src == DType::f16 ? f16_to_f32(all[i]) : bf16_to_f32(all[i]);
        const float stored = store == DType::f16 ? f16_to_f32(f32_to_f16(x)) : x;
        const bool refused = !std::isfinite(x) || std::fabs(x) >= 1099511627776.0f || !std::isfinite(stored);
        ASSERT_EQ(first_out_of_range(src, &all[i], 1, store) == 0, refused)
            << dtype_name(src) << " -> " << dtype_name(store) << " bits " << i << " value " << x;
      }
  const float edges[] = {65504.0f, 65519.99f, 65520.0f, 1e12f, 1099511627776.0f, 1.0995115e12f, 3e38f,
                         std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::denorm_min(), -0.0f};
  for (float e : edges)
    for (float x : {e, -e})
      for (DType store : types) {
        const float stored = store == DType::f16 ? f16_to_f32(f32_to_f16(x))
                             : store == DType::bf16 ? bf16_to_f32(f32_to_bf16(x)) : x;
        const bool refused = !std::isfinite(x) || std::fabs(x) >= 1099511627776.0f || !std::isfinite(stored);
        EXPECT_EQ(first_out_of_range(DType::f32, &x, 1, store) == 0, refused) << x << " -> " << dtype_name(store);
      }
  // The first bad value of a long run, across block boundaries.
  std::vector<float> v(10000, 1.0f);
  EXPECT_EQ(first_out_of_range(v.data(), v.size()), -1);
  v[9000] = std::numeric_limits<float>::infinity();
  v[9999] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(first_out_of_range(v.data(), v.size()), 9000);
  EXPECT_EQ(describe_out_of_range(DType::f32, v.data(), 9000, DType::f32), "value inf");
  v[4095] = 7e4f;
  EXPECT_EQ(first_out_of_range(DType::f32, v.data(), v.size(), DType::f16), 4095);
  EXPECT_EQ(first_out_of_range(DType::f32, v.data(), v.size(), DType::f32), 9000);
}

// from_f32 to bf16 (eight at a time where the CPU has AVX2) gives the bits
// f32_to_bf16 gives one value at a time: rounding ties to even, NaNs quieted
// with their sign, infinities, subnormals, the largest finite values, and
// every length's tail (n not a multiple of 8).
TEST(DType, Bf16ConversionOfAnArrayMatchesTheScalarBits) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu,
                                0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00000u, 0x7fbfffffu, 0x00000001u,
                                0x807fffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x477fe000u, 0x3f800000u};
  std::mt19937 rng(3);
  for (int i = 0; i < 5000; ++i) bits.push_back(uint32_t(rng()));
  std::vector<float> values(bits.size());
  std::memcpy(values.data(), bits.data(), bits.size() * 4);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(17), values.size()}) {
    std::vector<uint16_t> got(n + 1, 0xabcd);
    from_f32(DType::bf16, values.data(), got.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], f32_to_bf16(values[i])) << "bits 0x" << std::hex << bits[i];
    EXPECT_EQ(got[n], 0xabcd) << "wrote past n = " << n;
  }
}

TEST(Memory, ANeedBeyondTheMachineSaysHowMuch) {
  EXPECT_GT(available_memory_bytes(), uint64_t(0));
  EXPECT_NO_THROW(require_memory(1 << 20, "a small need"));
  try {
    require_memory(uint64_t(1) << 60, "a test need");
    FAIL() << "1 EiB was granted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("a test need needs 1.00 EiB (1152921504606846976 bytes)"), std::string::npos)
        << e.what();
  }
}

TEST(DType, F16RoundTripIsExactForRepresentableValues) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = uint16_t(h);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff)) continue;  // NaN payloads
    EXPECT_EQ(f32_to_f16(f16_to_f32(bits)), bits) << std::hex << h;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);          // tie -> even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65520.0f)), INFINITY);
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.9604645e-08f)), 5.9604645e-08f);    // smallest subnormal
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-100, 100);
  for (int i = 0; i < 10000; ++i) {
    float x = u(rng);
    EXPECT_NEAR(f16_to_f32(f32_to_f16(x)), x, std::abs(x) * (1.0 / 2048) + 1e-7);
  }
}

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.0f)), -3.0f);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-100, 100);
  for (int i = 0; i < 10000; ++i) {
    float x = u(rng);
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(x)), x, std::abs(x) * (1.0 / 256) + 1e-7);
  }
}

TEST(Npy, RoundTripKeepsShapeTypeAndData) {
  auto dir = temp_dir();
  std::vector<float> data(2 * 3 * 5);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) * 0.5f - 3;
  const auto path = (dir / "a.npy").string();
  write_npy(path, NpyType::f32, {2, 3, 5}, data.data());
  NpyArray a = read_npy(path);
  EXPECT_EQ(a.type, NpyType::f32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 5}));
  ASSERT_EQ(a.size(), 30);
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(a.as<float>()[i], data[i]);
  std::vector<int32_t> ids = {1, 2, 3};
  write_npy(path, NpyType::i32, {3}, ids.data());
  NpyArray b = read_npy(path);
  EXPECT_EQ(b.type, NpyType::i32);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(b.as<int32_t>()[2], 3);
  fs::remove_all(dir);
}

TEST(Npy, TruncatedFileIsCorruptDataNamingThePath) {
  auto dir = temp_dir();
  std::vector<float> data(100, 1.0f);
  const auto path = (dir / "t.npy").string();
  write_npy(path, NpyType::f32, {10, 10}, data.data());
  fs::resize_file(path, fs::file_size(path) - 7);
  try {
    read_npy(path);
    FAIL() << "truncated file was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::corrupt_data);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  // Every prefix of the header is rejected, never crashes.
  const std::string whole = read_file(path);
  for (size_t n = 0; n < 140 && n < whole.size(); ++n) {
    write_file_atomic(path, whole.substr(0, n));
    EXPECT_THROW(read_npy(path), Error) << n;
  }
  fs::remove_all(dir);
}

// Loaders take regular files only: a FIFO would block the open until a
// writer appears (a loader must never hang), a directory says so.
TEST(Npy, FifoAndDirectoryAreRefusedWithoutBlocking) {
  auto dir = temp_dir();
  const auto fifo = (dir / "keys.npy").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto expect_io_error = [](const std::string& path, const char* needle) {
    try {
      read_npy(path);
      ADD_FAILURE() << path << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::io_error);
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_io_error(fifo, "is a FIFO");
  const auto sub = (dir / "sub.npy").string();
  fs::create_directories(sub);
  expect_io_error(sub, "is a directory");
  expect_io_error((dir / "missing.npy").string(), "No such file");
  EXPECT_THROW(read_file("/dev/null"), Error);  // a character device
  // A regular file behind a symlink is fine.
  std::vector<float> data(6, 2.0f);
  const auto real = (dir / "real.npy").string(), link = (dir / "link.npy").string();
  write_npy(real, NpyType::f32, {2, 3}, data.data());
  fs::create_symlink(real, link);
  EXPECT_EQ(read_npy(link).size(), 6);
  fs::remove_all(dir);
}

// The streamed writer: small pieces (buffered), a block larger than its
// buffer, a header field patched after the fact; the target is untouched
// until commit(), and a writer dropped without commit() leaves the old file
// and no temporary behind.
TEST(AtomicFile, StreamedWriterCommitsWholeOrNothing) {
  auto dir = temp_dir();
  const auto path = (dir / "s.bin").string();
  write_file_atomic(path, "old contents");
  std::string expected;
  {
    AtomicFileWriter f(path);
    uint64_t length = 0;
    f.write(&length, 8);
    expected.append(8, '\0');
    for (int i = 0; i < 1000; ++i) {
      const std::string piece = "piece " + std::to_string(i) + ";";
      f.write(piece.data(), piece.size());
      expected += piece;
    }
    const std::string big(3 << 20, 'x');  // beyond the 1 MiB buffer
    f.write(big.data(), big.size());
    expected += big;
    f.write("tail", 4);
    expected += "tail";
    length = f.size();
    f.write_at(0, &length, 8);
    std::memcpy(expected.data(), &length, 8);
    EXPECT_EQ(read_file(path), "old contents");  // nothing visible before commit
    EXPECT_THROW(f.write_at(f.size() - 2, "abc", 3), Error);  // beyond what was written
    f.commit();
    EXPECT_THROW(f.write("x", 1), Error);
  }
  EXPECT_EQ(read_file(path), expected);
  {
    AtomicFileWriter f(path);
    f.write("half", 4);
  }  // dropped: an exception between the pieces, say
  EXPECT_EQ(read_file(path), expected);
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) { (void)e; ++files; }
  EXPECT_EQ(files, 1);
  EXPECT_THROW(AtomicFileWriter((dir / "missing" / "x").string()), Error);
  fs::remove_all(dir);
}

TEST(AtomicFile, ReplacesWholeFileAndLeavesNoTemporaries) {
  auto dir = temp_dir();
  const auto path = (dir / "f.bin").string();
  write_file_atomic(path, "first");
  write_file_atomic(path, "second version");
  EXPECT_EQ(read_file(path), "second version");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) { (void)e; ++files; }
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_file_atomic((dir / "missing" / "x").string(), "x"), Error);
  EXPECT_THROW(read_file((dir / "nope").string()), Error);
  fs::remove_all(dir);
}

// /proc/cpuinfo fields: the model, a named field read whole, a prefix of a
// longer name not taken for it, and an absent one.
TEST(CpuInfo, ReadsNamedFields) {
  EXPECT_FALSE(rattn::cpu_model().empty());
  const std::string flags = rattn::cpu_info_field("flags");
#if defined(__x86_64__)
  EXPECT_NE((" " + flags + " ").find(" fpu "), std::string::npos) << flags;
#endif
#if defined(__x86_64__)
  // "model" is its own field on x86 (a number), not the start of "model name".
  const std::string model = rattn::cpu_info_field("model");
  EXPECT_FALSE(model.empty());
  EXPECT_EQ(model.find_first_not_of("0123456789"), std::string::npos) << model;
#endif
  EXPECT_EQ(rattn::cpu_info_field("no such field"), "");
}
