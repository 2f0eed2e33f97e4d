// Partial expansion (SearchParams::expand_first / full_expand_rank) and the
// build's co-occurrence order of the neighbour lists: the search equals a
// plain reference walk of the same rule on the index's own lists and scores
// (ids and keys scored, whole lists included), scores fewer keys than
// whole-list walks at the same queue while keeping recall, and each list is
// ordered by how many training lists hold the node and the neighbour.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using Set = testing::SyntheticSet;

// Group 4: the generator's default, which these tests were written on.
Set make_set(int64_t tokens, int64_t m) { return testing::make_synthetic_set(tokens, m, 4, 29); }

GraphBuildParams params(bool cooccurrence_order) {
  GraphBuildParams p;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  p.cooccurrence_order = cooccurrence_order;
  return p;
}

// The walk SearchParams documents, written plainly: the pool best first (a
// new key lands after the keys scoring at least as much, a batch in
// descending score order, ties in batch order); the best unexpanded entry is
// expanded: its first `first` neighbours when it ranks at or below
// full_rank (0-based position >= full_rank), else its whole list.
struct Reference {
  std::vector<int32_t> ids;
  int64_t scored = 0;
};

Reference reference_walk(const KeyIndex& index, const float* q, const RowsView& keys, int k, int L, int first,
                         int full_rank, const std::vector<int32_t>& seeds) {
  struct Entry {
    float score;
    int32_t id;
    bool expanded;
  };
  std::vector<Entry> pool;
  std::set<int32_t> visited;
  Reference out;
  const auto offer = [&](const std::vector<int32_t>& batch) {
    std::vector<Entry> scored;
    for (int32_t id : batch) scored.push_back({internal::dot_row(q, keys, id), id, false});
    out.scored += int64_t(batch.size());
    std::stable_sort(scored.begin(), scored.end(), [](const Entry& a, const Entry& b) { return a.score > b.score; });
    for (const Entry& e : scored) {
      auto at = std::find_if(pool.begin(), pool.end(), [&](const Entry& p) { return p.score < e.score; });
      pool.insert(at, e);
    }
    if (int(pool.size()) > L) pool.resize(size_t(L));
  };
  std::vector<int32_t> batch;
  for (int32_t e : projected_graph_entries(index))
    if (visited.insert(e).second) batch.push_back(e);
  for (int32_t e : seeds)
    if (visited.insert(e).second) batch.push_back(e);
  offer(batch);
  for (;;) {
    int j = 0;
    while (j < int(pool.size()) && pool[size_t(j)].expanded) ++j;
    if (j == int(pool.size())) break;
    pool[size_t(j)].expanded = true;
    const std::vector<int32_t> nbr = projected_graph_neighbors(index, pool[size_t(j)].id);
    const int cnt = int(nbr.size()), hi = first > 0 && j >= full_rank ? std::min(first, cnt) : cnt;
    batch.clear();
    for (int i = 0; i < hi; ++i)
      if (visited.insert(nbr[size_t(i)]).second) batch.push_back(nbr[size_t(i)]);
    offer(batch);
  }
  for (int i = 0; i < std::min<int>(k, int(pool.size())); ++i) out.ids.push_back(pool[size_t(i)].id);
  return out;
}

TEST(PartialExpansion, SearchEqualsAPlainReferenceWalk) {
  const Set s = make_set(3000, 12);
  const auto index = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(true));
  auto scratch = index->make_scratch();
  constexpr int k = 20;
  struct Case {
    int L, first, full_rank;
  };
  // Whole lists (0 and >= the degree), partial below rank 8 or 20, partial everywhere but the best.
  const Case cases[] = {{40, 0, 0}, {40, 4, 0}, {40, 4, 8}, {80, 6, 20}, {40, 100, 5}, {60, 3, 1}};
  for (const Case& c : cases) {
    std::vector<int32_t> seeds;
    for (int64_t i = 0; i < s.m; ++i) {
      const float* q = s.head.query(0, s.context + i);
      SearchParams sp;
      sp.k = k;
      sp.queue_length = c.L;
      sp.expand_first = c.first;
      sp.full_expand_rank = c.full_rank;
      sp.seeds = seeds.data();
      sp.num_seeds = int(seeds.size());
      SearchResult got;
      index->search(q, s.keys.view(), sp, *scratch, got);
      const int full_rank = c.full_rank > 0 ? std::min(c.full_rank, c.L) : c.L;
      const Reference want = reference_walk(*index, q, s.keys.view(), k, c.L, c.first, full_rank, seeds);
      ASSERT_EQ(got.ids, want.ids) << "L " << c.L << " first " << c.first << " full_rank " << c.full_rank << " query " << i;
      ASSERT_EQ(got.keys_scored, want.scored) << "L " << c.L << " first " << c.first << " query " << i;
      seeds = got.ids;  // the next query starts from this one's results, as a decode step does
    }
  }
}

TEST(PartialExpansion, ScoresFewerKeysAtTheSameQueueAndKeepsRecall) {
  const Set s = make_set(8000, 100);
  const auto index = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(true));
  auto scratch = index->make_scratch();
  constexpr int k = 32, L = 96;
  double recall[2] = {0, 0}, scored[2] = {0, 0};
  for (int partial = 0; partial < 2; ++partial) {
    SearchParams sp;
    sp.k = k;
    sp.queue_length = L;
    sp.expand_first = partial ? 6 : 0;
    sp.full_expand_rank = partial ? 24 : 0;
    SearchResult r;
    for (int64_t i = 0; i < s.m; ++i) {
      const float* q = s.head.query(0, s.context + i);
      index->search(q, s.keys.view(), sp, *scratch, r);
      recall[partial] += testing::recall(r.ids, testing::oracle_top_k(q, s.keys, s.context, k)) / double(s.m);
      scored[partial] += double(r.keys_scored) / double(s.m);
    }
  }
  EXPECT_LT(scored[1], 0.8 * scored[0]) << "partial " << scored[1] << " whole lists " << scored[0];
  EXPECT_GT(recall[1], recall[0] - 0.05) << "partial " << recall[1] << " whole lists " << recall[0];
  EXPECT_GT(recall[1], 0.8);
}

TEST(PartialExpansion, ListsAreOrderedByTrainingCooccurrence) {
  const Set s = make_set(2500, 0);
  const GraphBuildParams p = params(true);
  const auto ordered = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, p);
  const auto plain = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(false));
  // How often each pair of keys shares a training list (the float64 oracle's
  // lists; the build's own match them, Graph.ExactTrainingListsMatchFloat64Oracle).
  std::vector<std::vector<int32_t>> lists_of(size_t(s.context));
  for (int64_t t = 0; t < s.context; ++t)
    for (int32_t id : testing::oracle_top_k(s.head.query(0, t), s.keys, s.context, p.query_neighbors))
      lists_of[size_t(id)].push_back(int32_t(t));
  const auto together = [&](int32_t a, int32_t b) {
    std::vector<int32_t> both;
    std::set_intersection(lists_of[size_t(a)].begin(), lists_of[size_t(a)].end(), lists_of[size_t(b)].begin(),
                          lists_of[size_t(b)].end(), std::back_inserter(both));
    return int(both.size());
  };
  int64_t reordered = 0, descents = 0;
  for (int32_t v = 0; v < int32_t(s.context); ++v) {
    const std::vector<int32_t> a = projected_graph_neighbors(*ordered, v), b = projected_graph_neighbors(*plain, v);
    // The same edges (the order is the build's last step), ...
    std::vector<int32_t> sa(a), sb(b);
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    ASSERT_EQ(sa, sb) << "node " << v;
    reordered += a != b;
    // ... the counts never rise along a list, and ties keep the build's order.
    for (size_t i = 1; i < a.size(); ++i) {
      const int before = together(v, a[i - 1]), here = together(v, a[i]);
      ASSERT_GE(before, here) << "node " << v << " slot " << i;
      if (before == here) {
        const auto pos = [&](int32_t id) { return std::find(b.begin(), b.end(), id) - b.begin(); };
        ASSERT_LT(pos(a[i - 1]), pos(a[i])) << "node " << v << " slot " << i;
      }
      descents += before > here;
    }
  }
  EXPECT_GT(reordered, s.context / 4);  // the order is not the build's key-relation order
  EXPECT_GT(descents, 0);
}

// Why a build whose searches read whole lists skips the list order: a
// whole-list walk finds the same keys, scoring the same number, on either
// graph; a partial walk reads the order, so there the two differ.
TEST(PartialExpansion, WholeListSearchesDoNotDependOnTheListOrder) {
  const Set s = make_set(2500, 24);
  const auto ordered = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(true));
  const auto plain = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(false));
  auto scratch = ordered->make_scratch();
  int partial_differ = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    const float* q = s.head.query(0, s.context + i);
    SearchParams sp;
    sp.k = 20;
    sp.queue_length = 40;
    SearchResult a, b;
    ordered->search(q, s.keys.view(), sp, *scratch, a);
    plain->search(q, s.keys.view(), sp, *scratch, b);
    ASSERT_EQ(a.ids, b.ids) << "query " << i;
    ASSERT_EQ(a.keys_scored, b.keys_scored) << "query " << i;
    sp.expand_first = 4;
    sp.full_expand_rank = 4;
    ordered->search(q, s.keys.view(), sp, *scratch, a);
    plain->search(q, s.keys.view(), sp, *scratch, b);
    partial_differ += a.ids != b.ids || a.keys_scored != b.keys_scored;
  }
  EXPECT_GT(partial_differ, 0);
}

TEST(PartialExpansion, BadParametersAreRejected) {
  const Set s = make_set(600, 1);
  const auto index = build_projected_graph(s.keys.view(), s.head.query(0, 0), s.context, params(true));
  auto scratch = index->make_scratch();
  SearchResult r;
  for (int bad = 0; bad < 2; ++bad) {
    SearchParams sp;
    sp.k = 10;
    (bad == 0 ? sp.expand_first : sp.full_expand_rank) = -1;
    EXPECT_THROW(index->search(s.head.query(0, s.context), s.keys.view(), sp, *scratch, r), Error);
  }
}

}  // namespace
}  // namespace rattn
