// The fuzz checks (loaders.h) on the seeds, on every truncation of each seed,
// on single-byte corruptions of each seed and on the inputs kept under
// tests/fuzz/regressions/<format>/ (what the fuzzers once broke). Under the
// sanitizer build (RATTN_SANITIZE) an out-of-bounds access fails it too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>

#include "core/error.h"
#include "core/npy.h"
#include "models/engine/gguf.h"
#include "models/engine/tokenizer.h"
#include "runtime/index/key_index.h"
#include "tests/fuzz/loaders.h"

namespace rattn::fuzz {
namespace {

using Check = std::string (*)(const uint8_t*, size_t);

// The two-argument overload (the fuzz targets' signature).
constexpr Check check_sequence = static_cast<Check>(check_sequence_file);

std::string run(Check check, const std::vector<uint8_t>& bytes) { return check(bytes.data(), bytes.size()); }

// Every prefix, then up to ~1500 positions each set to 0x00, 0xff and flipped in its top bit.
void mutate_all(Check check, const Seed& seed) {
  const std::vector<uint8_t>& b = seed.bytes;
  for (size_t n = 0; n < b.size(); ++n) {
    const std::string finding = check(b.data(), n);
    ASSERT_EQ(finding, "") << seed.name << " truncated to " << n << " bytes";
  }
  const size_t stride = b.size() / 1500 + 1;
  std::vector<uint8_t> m = b;
  for (size_t i = 0; i < b.size(); i += stride) {
    for (const uint8_t v : {uint8_t(0), uint8_t(0xff), uint8_t(b[i] ^ 0x80)}) {
      m[i] = v;
      const std::string finding = run(check, m);
      ASSERT_EQ(finding, "") << seed.name << " with byte " << i << " set to " << int(v);
    }
    m[i] = b[i];
  }
}

// For inputs whose every run is a sequence of API calls: `samples` evenly
// spaced truncations, then `samples` positions each set to 0x00 and 0xff.
void mutate_sampled(Check check, const Seed& seed, size_t samples) {
  const std::vector<uint8_t>& b = seed.bytes;
  const size_t stride = b.size() / samples + 1;
  for (size_t n = 0; n < b.size(); n += stride) ASSERT_EQ(check(b.data(), n), "") << seed.name << " truncated to " << n;
  std::vector<uint8_t> m = b;
  for (size_t i = 0; i < b.size(); i += stride) {
    for (const uint8_t v : {uint8_t(0), uint8_t(0xff)}) {
      m[i] = v;
      ASSERT_EQ(run(check, m), "") << seed.name << " with byte " << i << " set to " << int(v);
    }
    m[i] = b[i];
  }
}

void replay_regressions(Check check, const char* format) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(RATTN_SOURCE_DIR) / "tests" / "fuzz" / "regressions" / format;
  if (!fs::exists(dir)) return;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    EXPECT_EQ(run(check, bytes), "") << entry.path();
  }
}

TEST(FuzzReplay, IndexSeedsLoadAndPass) {
  const std::vector<Seed> seeds = index_seeds();
  ASSERT_EQ(seeds.size(), 5u);
  for (const Seed& s : seeds) {
    EXPECT_EQ(run(check_index_image, s.bytes), "") << s.name;
    // Each loads, whole images and wrapped payloads alike.
    EXPECT_NO_THROW(deserialize_index(index_image_of(s.bytes.data(), s.bytes.size()))) << s.name;
  }
}

TEST(FuzzReplay, IndexImagesTruncatedOrCorrupted) {
  for (const Seed& s : index_seeds()) mutate_all(check_index_image, s);
  replay_regressions(check_index_image, "index");
}

TEST(FuzzReplay, NpySeedsLoadAndPass) {
  const std::vector<Seed> seeds = npy_seeds();
  ASSERT_EQ(seeds.size(), 7u);
  for (const Seed& s : seeds) {
    EXPECT_EQ(run(check_npy, s.bytes), "") << s.name;
    EXPECT_NO_THROW(parse_npy(std::string_view(reinterpret_cast<const char*>(s.bytes.data()), s.bytes.size()), s.name))
        << s.name;
  }
}

TEST(FuzzReplay, NpyTruncatedOrCorrupted) {
  for (const Seed& s : npy_seeds()) mutate_all(check_npy, s);
  replay_regressions(check_npy, "npy");
}

TEST(FuzzReplay, GgufSeedLoadsWithItsTokenizer) {
  const std::vector<Seed> seeds = gguf_seeds();
  ASSERT_EQ(seeds.size(), 1u);
  EXPECT_EQ(run(check_gguf, seeds[0].bytes), "");
  const auto f = engine::GgufFile::parse(seeds[0].bytes.data(), seeds[0].bytes.size(), "seed.gguf");
  EXPECT_EQ(f->tensors().size(), 6u);
  EXPECT_GT(engine::Tokenizer::from_gguf(*f).encode("Hello world", true).size(), 1u);
}

TEST(FuzzReplay, GgufTruncatedOrCorrupted) {
  for (const Seed& s : gguf_seeds()) mutate_all(check_gguf, s);
  replay_regressions(check_gguf, "gguf");
}

TEST(FuzzReplay, SequenceSeedsLoadAndPass) {
  const std::vector<Seed> seeds = sequence_seeds();
  ASSERT_EQ(seeds.size(), 4u);
  for (const Seed& s : seeds) {
    bool loaded = false;
    EXPECT_EQ(check_sequence_file(s.bytes.data(), s.bytes.size(), &loaded), "") << s.name;
    EXPECT_TRUE(loaded) << s.name;
  }
}

TEST(FuzzReplay, SequenceFilesTruncatedOrCorrupted) {
  for (const Seed& s : sequence_seeds()) mutate_all(check_sequence, s);
  replay_regressions(check_sequence, "sequence");
}

TEST(FuzzReplay, CApiSeedsPass) {
  const std::vector<Seed> seeds = c_api_seeds();
  ASSERT_EQ(seeds.size(), 12u);
  for (const Seed& s : seeds) EXPECT_EQ(run(check_c_api, s.bytes), "") << s.name;
}

TEST(FuzzReplay, CApiCallsCorrupted) {
  for (const Seed& s : c_api_seeds()) mutate_sampled(check_c_api, s, 150);
  replay_regressions(check_c_api, "c_api");
}

}  // namespace
}  // namespace rattn::fuzz
