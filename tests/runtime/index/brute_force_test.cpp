// Brute-force index: agrees with a float64 oracle (fp32 and fp16 storage),
// insert appends, images round-trip and damaged images are rejected.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kernels/cpu_kernels.h"
#include "runtime/index/brute_force.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using testing::oracle_top_k;
using testing::random_rows;
using testing::recall;

class BruteForceTest : public ::testing::TestWithParam<DType> {};

TEST_P(BruteForceTest, MatchesFloat64Oracle) {
  const int d = 64;
  const int64_t n = 3000;
  RowStore keys(GetParam(), d);
  const auto rows = random_rows(n, d, 7);
  keys.append_f32(rows.data(), n);
  auto index = make_brute_force_index(n);
  auto scratch = index->make_scratch();
  const auto queries = random_rows(20, d, 8, 0.5f);
  SearchParams p;
  p.k = 50;
  SearchResult r;
  for (int qi = 0; qi < 20; ++qi) {
    const float* q = queries.data() + qi * d;
    index->search(q, keys.view(), p, *scratch, r);
    ASSERT_EQ(r.ids.size(), 50u);
    EXPECT_EQ(r.keys_scored, n);
    // fp32 sums may swap near-ties with the float64 order: allow one swap at the boundary.
    EXPECT_GE(recall(r.ids, oracle_top_k(q, keys, n, 50)), 0.98);
    for (size_t i = 1; i < r.scores.size(); ++i) EXPECT_GE(r.scores[i - 1], r.scores[i]);
    // Scores are the inner products (fp32 accumulation; tolerance relative to |q||k|).
    std::vector<float> row(d);
    keys.row_f32(r.ids[0], row.data());
    double exact = 0;
    for (int j = 0; j < d; ++j) exact += double(q[j]) * row[j];
    EXPECT_NEAR(r.scores[0], exact, 1e-4 * (1 + std::abs(exact)));
  }
}

TEST_P(BruteForceTest, ReferenceKernelsGiveSameIds) {
  const int d = 32;
  const int64_t n = 500;
  RowStore keys(GetParam(), d);
  const auto rows = random_rows(n, d, 9);
  keys.append_f32(rows.data(), n);
  KernelSpec spec;
  spec.head_dim = d;
  spec.kv_dtype = GetParam();
  auto fast = make_brute_force_index(n);
  auto ref = make_brute_force_index(n, make_reference_kernels(spec));
  auto s1 = fast->make_scratch(), s2 = ref->make_scratch();
  const auto q = random_rows(1, d, 10);
  SearchParams p;
  p.k = 20;
  SearchResult a, b;
  fast->search(q.data(), keys.view(), p, *s1, a);
  ref->search(q.data(), keys.view(), p, *s2, b);
  EXPECT_GE(recall(a.ids, b.ids), 0.95);
}

INSTANTIATE_TEST_SUITE_P(Storage, BruteForceTest, ::testing::Values(DType::f32, DType::f16));

TEST(BruteForce, InsertAppendsOnlyInOrder) {
  const int d = 16;
  RowStore keys(DType::f32, d);
  const auto rows = random_rows(101, d, 11);
  keys.append_f32(rows.data(), 100);
  auto index = make_brute_force_index(100);
  EXPECT_THROW(index->insert(100, rows.data(), keys.view()), Error);  // row not in the store yet
  keys.append_f32(rows.data() + 100 * d, 1);
  EXPECT_THROW(index->insert(105, rows.data(), keys.view()), Error);
  index->insert(100, rows.data(), keys.view());
  EXPECT_EQ(index->size(), 101);
  // Query = the new row itself scaled up: it must come first.
  std::vector<float> q(rows.begin() + 100 * d, rows.begin() + 101 * d);
  for (auto& x : q) x *= 10;
  auto s = index->make_scratch();
  SearchResult r;
  SearchParams p;
  p.k = 5;
  index->search(q.data(), keys.view(), p, *s, r);
  EXPECT_EQ(r.ids[0], 100);
}

TEST(BruteForce, SerializeRoundTripAndCorruption) {
  auto index = make_brute_force_index(1234);
  std::string img;
  index->serialize(&img);
  auto back = deserialize_index(img);
  EXPECT_EQ(back->size(), 1234);
  for (size_t cut = 0; cut < img.size(); ++cut) {
    try {
      deserialize_index(std::string_view(img).substr(0, cut));
      ADD_FAILURE() << "truncation to " << cut << " bytes accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data);
    }
  }
  for (size_t i = 0; i < img.size(); ++i) {
    std::string bad = img;
    bad[i] = char(bad[i] ^ 0x5a);
    try {
      deserialize_index(bad);
      ADD_FAILURE() << "flipped byte " << i << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::corrupt_data);
    }
  }
}

}  // namespace
}  // namespace rattn

namespace rattn {
namespace {

// recall_at counts the first k of the truth among the first k found, in any order.
TEST(RecallAt, CountsTheTruthsFirstKAmongTheFirstKFound) {
  const std::vector<int32_t> truth = {4, 9, 1, 7};
  EXPECT_EQ(recall_at({7, 1, 9, 4}, truth, 4), 1.0);
  EXPECT_EQ(recall_at({7, 2, 9, 3}, truth, 4), 0.5);
  EXPECT_EQ(recall_at({2, 3, 4, 9}, truth, 2), 0.0);   // 4 and 9 lie past the first 2 found
  EXPECT_EQ(recall_at({9, 4, 2, 3}, truth, 2), 1.0);
  EXPECT_EQ(recall_at({4}, truth, 4), 0.25);          // fewer found than k
  EXPECT_EQ(recall_at({}, truth, 4), 0.0);
  EXPECT_EQ(recall_at({1, 2}, {}, 4), 1.0);
}

}  // namespace
}  // namespace rattn
