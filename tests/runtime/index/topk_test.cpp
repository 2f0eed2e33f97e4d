// TopK against the plain answer: sort the whole stream by `better`, keep k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/index/topk.h"

namespace rattn::internal {
namespace {

std::vector<ScoredId> plain_top(std::vector<ScoredId> all, int k) {
  std::sort(all.begin(), all.end(), Better{});
  if (all.size() > size_t(k)) all.resize(size_t(k));
  return all;
}

void expect_same(const std::vector<ScoredId>& got, const std::vector<ScoredId>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].id) << "rank " << i;
    EXPECT_EQ(got[i].score, want[i].score) << "rank " << i;
  }
}

TEST(TopK, KeepsTheBestUnderBetterWithHeavyTies) {
  std::mt19937 rng(7);
  for (const int k : {1, 3, 16, 125}) {
    for (const int levels : {2, 5, 40, 1 << 20}) {  // few levels: most pushes tie
      std::uniform_int_distribution<int> level(0, levels - 1);
      std::vector<ScoredId> all;
      TopK top(k);
      const int n = 20 * k + 37;
      for (int i = 0; i < n; ++i) {
        // Ids out of order, so that ties must be broken by id, not arrival.
        const ScoredId e{float(level(rng)) * 0.25f, int32_t((i * 7919) % 100003)};
        all.push_back(e);
        top.push(e.score, e.id);
      }
      // unordered(): the same k, before sorted() orders them.
      std::vector<ScoredId> as_set = top.unordered();
      std::sort(as_set.begin(), as_set.end(), Better{});
      expect_same(as_set, plain_top(all, k));
      expect_same(top.sorted(), plain_top(all, k));
      // The threshold is the k-th best score.
      EXPECT_EQ(top.threshold(), plain_top(all, k).back().score);
    }
  }
}

TEST(TopK, ResetAndShortStreams) {
  TopK top(10);
  for (int i = 0; i < 4; ++i) top.push(float(i), i);
  std::vector<ScoredId> want{{3, 3}, {2, 2}, {1, 1}, {0, 0}};
  expect_same(top.sorted(), want);
  top.reset();
  EXPECT_EQ(top.threshold(), -std::numeric_limits<float>::infinity());
  top.push(-std::numeric_limits<float>::infinity(), 5);
  top.push(1.5f, 6);
  expect_same(top.sorted(), {{1.5f, 6}, {-std::numeric_limits<float>::infinity(), 5}});
}

TEST(TopK, ANaNNeverOutranksANumber) {
  TopK top(2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < 9; ++i) top.push(i % 3 == 0 ? nan : float(i), i);
  const auto& best = top.sorted();
  ASSERT_GE(best.size(), 2u);
  EXPECT_EQ(best[0].id, 8);
  EXPECT_EQ(best[1].id, 7);
}

// best_then_group: v[0] the best, v[1, end) the next end - 1 as a set, then
// the rest, against a full sort; with ties and lists shorter than `end`.
TEST(TopK, BestThenGroupSplitsLikeASort) {
  std::mt19937 rng(11);
  for (const size_t n : {size_t(1), size_t(5), size_t(8), size_t(9), size_t(128)}) {
    for (const int levels : {3, 1 << 20}) {
      std::uniform_int_distribution<int> level(0, levels - 1);
      std::vector<ScoredId> v;
      for (size_t i = 0; i < n; ++i) v.push_back({float(level(rng)), int32_t((i * 7919) % 100003)});
      std::vector<ScoredId> sorted = v;
      std::sort(sorted.begin(), sorted.end(), Better{});
      best_then_group(v, 8);
      const size_t end = std::min<size_t>(8, n);
      EXPECT_EQ(v[0].id, sorted[0].id);
      for (const auto& [lo, hi] : {std::pair<size_t, size_t>{1, end}, {end, n}}) {
        std::vector<ScoredId> got(v.begin() + std::ptrdiff_t(lo), v.begin() + std::ptrdiff_t(hi));
        std::sort(got.begin(), got.end(), Better{});
        expect_same(got, std::vector<ScoredId>(sorted.begin() + std::ptrdiff_t(lo), sorted.begin() + std::ptrdiff_t(hi)));
      }
    }
  }
}

}  // namespace
// select_best (the AVX-512 quickselect on this CPU when it has one, else
// nth_element) against a sort of the whole buffer: the same k pairs, the
// best k first, for buffers around its scalar cut-off (64) and far above it,
// scores drawn from few values (ties ordered by id), all equal, and with
// -inf. Breaking the partition's tie rule (id_lt) fails it.
TEST(TopK, SelectBestKeepsTheSetASortKeeps) {
  std::mt19937 rng(17);
  for (size_t n : {size_t(1), size_t(7), size_t(63), size_t(64), size_t(65), size_t(200), size_t(250), size_t(2049)})
    for (int values : {1, 3, 50, 1 << 20}) {
      std::vector<ScoredId> v(n);
      std::vector<int32_t> ids(n);
      for (size_t i = 0; i < n; ++i) ids[i] = int32_t(i * 7 + 3);
      std::shuffle(ids.begin(), ids.end(), rng);
      for (size_t i = 0; i < n; ++i) {
        const int draw = int(rng() % uint32_t(values));
        v[i] = {draw == 0 && values > 1 ? -std::numeric_limits<float>::infinity() : float(draw) * 0.25f, ids[i]};
      }
      std::vector<ScoredId> sorted = v;
      std::sort(sorted.begin(), sorted.end(), Better{});
      for (size_t k : {size_t(1), n / 3, n / 2, n - 1, n}) {
        if (k == 0) continue;
        SCOPED_TRACE("n " + std::to_string(n) + ", " + std::to_string(values) + " values, k " + std::to_string(k));
        std::vector<ScoredId> got = v;
        select_best(got, k);
        ASSERT_EQ(got.size(), n);
        std::sort(got.begin(), got.begin() + std::ptrdiff_t(k), Better{});
        for (size_t i = 0; i < k; ++i) {
          ASSERT_EQ(got[i].id, sorted[i].id) << "rank " << i;
          ASSERT_EQ(got[i].score, sorted[i].score) << "rank " << i;
        }
        std::vector<int32_t> all;
        for (const ScoredId& e : got) all.push_back(e.id);
        std::sort(all.begin(), all.end());
        std::vector<int32_t> want = ids;
        std::sort(want.begin(), want.end());
        EXPECT_EQ(all, want) << "the buffer lost or repeated a pair";
      }
    }
}

// sort_best is a sort under `better`: the same order as std::sort with it,
// over ties, negative scores, both zeros, infinities and negative ids.
TEST(TopK, SortBestIsTheSortUnderBetter) {
  std::mt19937 rng(23);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), -1.5f};
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(96), size_t(125), size_t(1000)})
    for (int values : {2, 9, 1 << 20}) {
      std::vector<ScoredId> v(n);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t draw = rng();
        const float score = draw % 5 == 0 ? specials[draw / 5 % 8] : (float(int(draw % uint32_t(values))) - values / 2) * 0.37f;
        v[i] = {score, int32_t(rng() % 4000) - 1000};
      }
      for (size_t i = 0; i < n; ++i) v[i].id += int32_t(i) * 4000;  // distinct ids, some negative
      std::vector<ScoredId> want = v, got = v;
      std::sort(want.begin(), want.end(), Better{});
      sort_best(got);
      ASSERT_EQ(got.size(), n);
      for (size_t i = 0; i < n; ++i) {
        SCOPED_TRACE("n " + std::to_string(n) + ", rank " + std::to_string(i));
        ASSERT_EQ(got[i].id, want[i].id);
        ASSERT_EQ(got[i].score, want[i].score);  // -0 comes back as +0, which compares equal
      }
    }
}

}  // namespace rattn::internal
