// Seeded searches (SearchParams::seeds, SearchJob::seeds: the decode step's
// warm start from the previous step's results): seeds holding the exact top-k
// give the exact top-k even at the smallest queue, and are counted as scored;
// ids outside the index are skipped; search_many() with per-job seeds equals
// separate seeded searches; bad seed lists are rejected.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

struct Set : testing::SyntheticSet {
  std::vector<std::unique_ptr<KeyIndex>> graphs;
};

Set make_set(int heads) {
  Set s{testing::make_synthetic_set(4000, 60, heads, 23), {}};
  GraphBuildParams p;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  for (int h = 0; h < heads; ++h)
    s.graphs.push_back(build_projected_graph(s.keys.view(), s.head.query(h, 0), s.context, p));
  return s;
}

TEST(SeededSearch, SeedsHoldingTheTopKGiveTheTopKAtTheSmallestQueue) {
  const Set s = make_set(1);
  const KeyIndex& index = *s.graphs[0];
  auto scratch = index.make_scratch();
  constexpr int k = 20;
  SearchParams sp;
  sp.k = k;
  sp.queue_length = k;
  SearchResult plain, seeded;
  double plain_recall = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    const float* q = s.head.query(0, s.context + i);
    const std::vector<int32_t> truth = testing::oracle_top_k(q, s.keys, s.context, k);
    sp.seeds = nullptr;
    sp.num_seeds = 0;
    index.search(q, s.keys.view(), sp, *scratch, plain);
    plain_recall += testing::recall(plain.ids, truth);
    sp.seeds = truth.data();
    sp.num_seeds = k;
    index.search(q, s.keys.view(), sp, *scratch, seeded);
    EXPECT_EQ(testing::recall(seeded.ids, truth), 1.0) << "query " << i;
    // The seeds are scored like the entry points (only the entry points they
    // duplicate are not scored twice).
    EXPECT_GE(seeded.keys_scored, k);
  }
  EXPECT_LT(plain_recall / double(s.m), 1.0);  // the unseeded walk misses some at this queue
}

TEST(SeededSearch, IdsOutsideTheIndexAreSkipped) {
  const Set s = make_set(1);
  const KeyIndex& index = *s.graphs[0];
  auto scratch = index.make_scratch();
  SearchParams sp;
  sp.k = 10;
  sp.queue_length = 32;
  SearchResult plain, seeded;
  const int32_t outside[3] = {-7, int32_t(s.context), int32_t(s.context) + 1000};
  for (int64_t i = 0; i < 10; ++i) {
    const float* q = s.head.query(0, s.context + i);
    sp.seeds = nullptr;
    sp.num_seeds = 0;
    index.search(q, s.keys.view(), sp, *scratch, plain);
    sp.seeds = outside;
    sp.num_seeds = 3;
    index.search(q, s.keys.view(), sp, *scratch, seeded);
    EXPECT_EQ(seeded.ids, plain.ids);
    EXPECT_EQ(seeded.keys_scored, plain.keys_scored);
  }
}

TEST(SeededSearch, SearchManyWithPerJobSeedsEqualsSeparateSearches) {
  const Set s = make_set(4);
  SearchParams sp;
  sp.k = 16;
  sp.queue_length = 24;
  const int64_t t = s.context + 5;
  std::vector<std::vector<int32_t>> seeds(4);
  std::vector<std::unique_ptr<SearchScratch>> scratches;
  std::vector<SearchResult> many(4), one(4);
  std::vector<SearchJob> jobs;
  for (int h = 0; h < 4; ++h) {
    // Seeds: the previous query's results, as the decode step passes them.
    auto scratch = s.graphs[size_t(h)]->make_scratch();
    SearchResult prev;
    s.graphs[size_t(h)]->search(s.head.query(h, t - 1), s.keys.view(), sp, *scratch, prev);
    seeds[size_t(h)] = prev.ids;
    SearchParams own = sp;
    own.seeds = seeds[size_t(h)].data();
    own.num_seeds = int(seeds[size_t(h)].size()) - h;  // a different count per head
    s.graphs[size_t(h)]->search(s.head.query(h, t), s.keys.view(), own, *scratch, one[size_t(h)]);
    scratches.push_back(s.graphs[size_t(h)]->make_scratch());
    jobs.push_back(SearchJob{s.graphs[size_t(h)].get(), s.head.query(h, t), scratches.back().get(), &many[size_t(h)],
                             seeds[size_t(h)].data(), own.num_seeds});
  }
  search_many(jobs.data(), 4, s.keys.view(), sp);
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(many[size_t(h)].ids, one[size_t(h)].ids) << "head " << h;
    EXPECT_EQ(many[size_t(h)].scores, one[size_t(h)].scores) << "head " << h;
    EXPECT_EQ(many[size_t(h)].keys_scored, one[size_t(h)].keys_scored) << "head " << h;
  }
}

TEST(SeededSearch, BadSeedListsAreRejected) {
  const Set s = make_set(1);
  auto scratch = s.graphs[0]->make_scratch();
  SearchParams sp;
  sp.k = 10;
  sp.queue_length = 16;
  sp.num_seeds = 3;  // without seeds
  SearchResult r;
  EXPECT_THROW(s.graphs[0]->search(s.head.query(0, s.context), s.keys.view(), sp, *scratch, r), Error);
  sp.num_seeds = 0;
  SearchJob job{s.graphs[0].get(), s.head.query(0, s.context), scratch.get(), &r, nullptr, 2};
  EXPECT_THROW(search_many(&job, 1, s.keys.view(), sp), Error);
  job.num_seeds = -1;
  EXPECT_THROW(search_many(&job, 1, s.keys.view(), sp), Error);
}

}  // namespace
}  // namespace rattn
