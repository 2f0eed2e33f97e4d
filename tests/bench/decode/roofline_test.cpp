// bench decode's roofline: the bytes each part of the step read, from the
// profile's counts, and full attention's bytes.
#include <gtest/gtest.h>

#include "bench/decode/roofline.h"

namespace rattn::bench {
namespace {

TEST(Roofline, FullAttentionReadsEveryKeyAndValueOnce) {
  // T x 2 (K and V) x d x 2 bytes (fp16) per KV head.
  EXPECT_DOUBLE_EQ(full_attention_bytes(131072, 128, DType::f16), 131072.0 * 2 * 128 * 2);
  EXPECT_DOUBLE_EQ(full_attention_bytes(1000, 64, DType::f32), 1000.0 * 2 * 64 * 4);
}

TEST(Roofline, ScoredKeyIsItsRowOrCodeWithIdAndVisitedMark) {
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(128, DType::f16, false, 0, 0), 256 + 4 + 1);
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(128, DType::f16, true, 0, 0), 128 + 4 + 1);
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(128, DType::f16, true, 80, 32), 48 + 16 + 4 + 1);  // one cache line
  // Code rows are read as stored: padded to whole cache lines.
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(128, DType::f16, true, 40, 0), 64 + 4 + 1);
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(128, DType::f16, true, 96, 32), 128 + 4 + 1);  // 64 fine + 16 coarse
  EXPECT_DOUBLE_EQ(bytes_per_scored_key(96, DType::f16, true, 0, 0), 128 + 4 + 1);
}

TEST(Roofline, PhasesCountPerStepBytesAgainstTriad) {
  RooflineInput in;
  in.head_dim = 128;
  in.kv = DType::f16;
  in.profile.steps = 4;
  in.profile.static_rows = 4 * 640;       // sinks + window per step
  in.profile.keys_scored = 4 * 3000;      // over the group's query heads
  in.profile.retrieved_rows = 4 * 400;    // top-100 of 4 heads
  in.profile.merged_partials = 4 * 4;
  in.profile.insert_keys_scored = -1;     // not counted
  in.profile.static_ms = 4 * 0.02;
  in.profile.search_ms = 4 * 0.5;
  in.profile.retrieved_attention_ms = 4 * 0.04;
  in.profile.merge_ms = 4 * 0.001;
  in.profile.insert_ms = 4 * 0.1;
  in.full_rows = 131072;
  in.full_ms = 4.0;
  const auto phases = decode_roofline(in, 32.0, 40.0);
  ASSERT_EQ(phases.size(), 6u);
  const char* names[] = {"static set", "search", "retrieved attention", "merge", "insertion", "full attention"};
  for (size_t i = 0; i < phases.size(); ++i) EXPECT_EQ(phases[i].name, names[i]);
  EXPECT_DOUBLE_EQ(phases[0].bytes, 640.0 * 2 * 256);
  EXPECT_DOUBLE_EQ(phases[0].ms, 0.02);
  EXPECT_DOUBLE_EQ(phases[1].bytes, 3000.0 * 261);
  EXPECT_DOUBLE_EQ(phases[2].bytes, 400.0 * 2 * 256);
  EXPECT_DOUBLE_EQ(phases[3].bytes, 4.0 * 2 * 129 * 4);
  EXPECT_LT(phases[4].bytes, 0);  // insertion: not counted
  EXPECT_DOUBLE_EQ(phases[5].bytes, 131072.0 * 2 * 128 * 2);
  // GB/s = bytes / s / 1e9; step parts against 1-thread triad, full attention against its threads'.
  EXPECT_NEAR(phases[0].gb_s, 640.0 * 2 * 256 / 0.02e-3 / 1e9, 1e-9);
  EXPECT_NEAR(phases[0].share_of_triad, phases[0].gb_s / 32.0, 1e-12);
  EXPECT_NEAR(phases[5].gb_s, 131072.0 * 512 / 4e-3 / 1e9, 1e-9);
  EXPECT_NEAR(phases[5].share_of_triad, phases[5].gb_s / 40.0, 1e-12);
  in.profile.insert_keys_scored = 4 * 500;
  EXPECT_DOUBLE_EQ(decode_roofline(in, 32.0, 40.0)[4].bytes, 500.0 * 261);
}

}  // namespace
}  // namespace rattn::bench
