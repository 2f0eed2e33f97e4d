// The projected graph's search path: the 8-bit traversal codes (recall within
// 0.005 of the exact walk at the same L, exact scores returned), the expand
// width, and search_many() (interleaved searches equal separate search()
// calls exactly: ids, scores, keys scored), plus bad search parameters.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using testing::expect_many_equals_single;
using testing::oracle_top_k;
using testing::recall;

struct Group {
  SyntheticHead head;  // `group` query heads over one KV head
  int64_t context = 0, m = 0;
  RowStore keys;
  std::vector<std::unique_ptr<KeyIndex>> graphs;  // one per query head
};

GraphBuildParams small_params() {
  GraphBuildParams p;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  return p;
}

Group make_group(int64_t tokens, int64_t m, int heads, DType dtype) {
  SyntheticSpec spec;
  spec.tokens = tokens;
  spec.head_dim = 64;
  spec.group = heads;
  spec.seed = 17;
  Group g{make_synthetic(spec), tokens - m, m, RowStore(dtype, 64), {}};
  g.keys.append_f32(g.head.keys.data(), g.context);
  for (int h = 0; h < heads; ++h)
    g.graphs.push_back(build_projected_graph(g.keys.view(), g.head.query(h, 0), g.context, small_params()));
  return g;
}

class GraphCodesRecallTest : public ::testing::TestWithParam<DType> {};

TEST_P(GraphCodesRecallTest, WithinHalfAPercentOfTheExactWalk) {
  const Group g = make_group(6000, 150, 1, GetParam());
  const KeyIndex& index = *g.graphs[0];
  auto scratch = index.make_scratch();
  for (int L : {48, 96}) {
    double rec[2] = {0, 0};
    for (int codes = 0; codes < 2; ++codes) {
      SearchParams sp;
      sp.k = 32;
      sp.queue_length = L;
      sp.traversal_codes = codes == 1;
      SearchResult r;
      for (int64_t i = 0; i < g.m; ++i) {
        const float* q = g.head.query(0, g.context + i);
        index.search(q, g.keys.view(), sp, *scratch, r);
        rec[codes] += recall(r.ids, oracle_top_k(q, g.keys, g.context, sp.k));
        if (codes == 1) {
          // Exact scores (re-ranked with the keys), best first.
          ASSERT_EQ(r.ids.size(), size_t(sp.k));
          for (size_t j = 0; j < r.ids.size(); ++j) {
            ASSERT_EQ(r.scores[j], internal::dot_row(q, g.keys.view(), r.ids[j]));
            if (j > 0) {
              ASSERT_GE(r.scores[j - 1], r.scores[j]);
            }
          }
        }
      }
    }
    rec[0] /= double(g.m);
    rec[1] /= double(g.m);
    EXPECT_GT(rec[0], 0.8) << "L " << L;
    EXPECT_NEAR(rec[1], rec[0], 0.005) << "L " << L;
    RecordProperty("recall_exact_L" + std::to_string(L), std::to_string(rec[0]));
    RecordProperty("recall_codes_L" + std::to_string(L), std::to_string(rec[1]));
  }
  EXPECT_GT(projected_graph_info(index).code_bytes, size_t(g.context) * 64);  // the codes exist and are counted
}

INSTANTIATE_TEST_SUITE_P(Storage, GraphCodesRecallTest, ::testing::Values(DType::f32, DType::f16));

TEST(GraphSearch, CodesFollowAnIndexThatGrowsTenfoldByInsert) {
  // Codes fitted on the first 300 keys (a search right after the build),
  // then 2700 inserts: the codes refit as the index doubles, so the walk on
  // them stays as good as the exact walk.
  SyntheticSpec spec;
  spec.tokens = 3100;
  spec.head_dim = 64;
  spec.group = 1;
  spec.seed = 23;
  const SyntheticHead head = make_synthetic(spec);
  const int64_t base = 300, context = 3000;
  RowStore keys(DType::f32, 64);
  keys.append_f32(head.keys.data(), base);
  auto index = build_projected_graph(keys.view(), head.queries.data(), base, small_params());
  auto scratch = index->make_scratch();
  SearchParams sp;
  sp.k = 20;
  sp.queue_length = 80;
  sp.traversal_codes = true;
  SearchResult r;
  index->search(head.query(0, context), keys.view(), sp, *scratch, r);  // fits the codes on 300 keys
  for (int64_t t = base; t < context; ++t) {
    keys.append_f32(head.keys.data() + size_t(t) * 64, 1);
    index->insert(int32_t(t), head.query(0, t), keys.view());
  }
  EXPECT_EQ(projected_graph_info(*index).code_bytes >= size_t(context) * 64, true);
  double rec[2] = {0, 0};
  for (int codes = 0; codes < 2; ++codes) {
    sp.traversal_codes = codes == 1;
    for (int64_t i = 0; i < 100; ++i) {
      const float* q = head.query(0, context + i);
      index->search(q, keys.view(), sp, *scratch, r);
      rec[codes] += recall(r.ids, oracle_top_k(q, keys, context, sp.k)) / 100.0;
    }
  }
  EXPECT_GT(rec[0], 0.8);
  EXPECT_NEAR(rec[1], rec[0], 0.01);
}

TEST(GraphSearch, AScratchReusedPastTheVisitedEpochWrapSearchesLikeAFreshOne) {
  // The visited set's epoch byte wraps every 255 searches; 600 searches on
  // one scratch (two wraps) must each equal a search on a fresh scratch.
  // Every search has its own query (the prefill queries serve), so no later
  // search happens to re-mark exactly the nodes an earlier one visited.
  const Group g = make_group(2100, 100, 1, DType::f32);
  const KeyIndex& index = *g.graphs[0];
  auto reused = index.make_scratch();
  SearchParams sp;
  sp.k = 16;
  sp.queue_length = 48;
  sp.traversal_codes = true;
  SearchResult r_reused, r_fresh;
  for (int i = 0; i < 600; ++i) {
    const float* q = g.head.query(0, 3 * i);
    index.search(q, g.keys.view(), sp, *reused, r_reused);
    auto fresh = index.make_scratch();
    index.search(q, g.keys.view(), sp, *fresh, r_fresh);
    ASSERT_EQ(r_reused.ids, r_fresh.ids) << "search " << i;
    ASSERT_EQ(r_reused.scores, r_fresh.scores) << "search " << i;
    ASSERT_EQ(r_reused.keys_scored, r_fresh.keys_scored) << "search " << i;
    ASSERT_GT(r_fresh.keys_scored, sp.queue_length) << "search " << i;  // a real walk, not the entry points alone
  }
}

TEST(GraphSearch, ConcurrentFirstSearchesEncodeTheCodesOnce) {
  // Searches from several threads on a loaded index (no codes yet): one
  // encodes, the others wait; every thread gets the single-thread answers.
  const Group g = make_group(2000, 40, 1, DType::f32);
  std::string image;
  g.graphs[0]->serialize(&image);
  SearchParams sp;
  sp.k = 10;
  sp.queue_length = 60;
  sp.traversal_codes = true;
  std::vector<std::vector<int32_t>> expected(static_cast<size_t>(g.m));
  {
    auto scratch = g.graphs[0]->make_scratch();
    SearchResult r;
    for (int64_t i = 0; i < g.m; ++i) {
      g.graphs[0]->search(g.head.query(0, g.context + i), g.keys.view(), sp, *scratch, r);
      expected[size_t(i)] = r.ids;
    }
  }
  auto loaded = deserialize_index(image);
  EXPECT_EQ(projected_graph_info(*loaded).code_bytes, 0u);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      auto scratch = loaded->make_scratch();
      SearchResult r;
      for (int64_t i = 0; i < g.m; ++i) {
        loaded->search(g.head.query(0, g.context + i), g.keys.view(), sp, *scratch, r);
        mismatches[size_t(t)] += r.ids != expected[size_t(i)];
      }
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[size_t(t)], 0) << "thread " << t;
  EXPECT_GT(projected_graph_info(*loaded).code_bytes, 0u);
}

TEST(GraphSearch, ExpandWidthFindsEveryKeyWhenBudgetCoversAll) {
  const Group g = make_group(1500, 20, 1, DType::f32);
  const KeyIndex& index = *g.graphs[0];
  auto scratch = index.make_scratch();
  for (int width : {2, 5}) {
    for (bool codes : {false, true}) {
      SearchParams sp;
      sp.k = 10;
      sp.queue_length = int(g.context);
      sp.expand_width = width;
      sp.traversal_codes = codes;
      SearchResult r;
      double rec = 0;
      for (int64_t i = 0; i < g.m; ++i) {
        const float* q = g.head.query(0, g.context + i);
        index.search(q, g.keys.view(), sp, *scratch, r);
        EXPECT_EQ(r.keys_scored, g.context);  // each key scored once
        rec += recall(r.ids, oracle_top_k(q, g.keys, g.context, sp.k));
      }
      EXPECT_GE(rec / double(g.m), 0.999) << "width " << width << " codes " << codes;
    }
  }
}

// search_many() against one search() per job, for a GQA group (one graph
// per query head over the same keys) and mixed job lists.
void expect_search_many_equals_single(const std::vector<const KeyIndex*>& indexes, const Group& g,
                                      const SearchParams& sp, int64_t first_query) {
  const int n = int(indexes.size());
  std::vector<std::unique_ptr<SearchScratch>> scratches;
  for (const KeyIndex* ix : indexes) scratches.push_back(ix->make_scratch());
  std::vector<SearchResult> many(static_cast<size_t>(n));
  std::vector<SearchJob> jobs;
  for (int j = 0; j < n; ++j)
    jobs.push_back({indexes[size_t(j)], g.head.query(0, first_query + j), scratches[size_t(j)].get(), &many[size_t(j)]});
  expect_many_equals_single(jobs.data(), n, g.keys.view(), sp);
}

TEST(GraphSearch, SearchManyEqualsSeparateSearches) {
  const Group g = make_group(3000, 40, 4, DType::f16);
  auto brute = make_brute_force_index(g.context);
  for (bool codes : {true, false})
    for (int width : {1, 2})
      for (int L : {40, 120}) {
        SearchParams sp;
        sp.k = 20;
        sp.queue_length = L;
        sp.traversal_codes = codes;
        sp.expand_width = width;
        SCOPED_TRACE(::testing::Message() << "codes " << codes << " width " << width << " L " << L);
        // The GQA group: 4 query heads, 4 graphs; 4 queries a group, several groups.
        for (int64_t q0 = g.context; q0 + 4 <= g.context + 12; q0 += 4)
          expect_search_many_equals_single({g.graphs[0].get(), g.graphs[1].get(), g.graphs[2].get(), g.graphs[3].get()},
                                           g, sp, q0);
        // Two jobs on one graph (own scratches), an odd count, a single job.
        expect_search_many_equals_single({g.graphs[1].get(), g.graphs[1].get(), g.graphs[2].get()}, g, sp, g.context + 5);
        expect_search_many_equals_single({g.graphs[3].get()}, g, sp, g.context + 9);
        // A job list with another kind of index runs them one after another.
        expect_search_many_equals_single({g.graphs[0].get(), brute.get()}, g, sp, g.context + 2);
      }
}

TEST(GraphSearch, SearchManyWithASharedScratchStillEqualsSeparateSearches) {
  const Group g = make_group(1500, 10, 2, DType::f32);
  auto scratch = g.graphs[0]->make_scratch();
  SearchParams sp;
  sp.k = 10;
  sp.queue_length = 40;
  std::vector<SearchResult> many(2), single(2);
  // One scratch for both jobs: they cannot interleave; they run in turn.
  SearchJob jobs[2] = {{g.graphs[0].get(), g.head.query(0, g.context), scratch.get(), &many[0]},
                       {g.graphs[0].get(), g.head.query(0, g.context + 1), scratch.get(), &many[1]}};
  search_many(jobs, 2, g.keys.view(), sp);
  for (int j = 0; j < 2; ++j) {
    g.graphs[0]->search(jobs[j].query, g.keys.view(), sp, *scratch, single[size_t(j)]);
    EXPECT_EQ(many[size_t(j)].ids, single[size_t(j)].ids);
    EXPECT_EQ(many[size_t(j)].keys_scored, single[size_t(j)].keys_scored);
  }
}

TEST(GraphSearch, BadSearchParametersRejected) {
  const Group g = make_group(600, 10, 1, DType::f32);
  auto scratch = g.graphs[0]->make_scratch();
  SearchResult r;
  const float* q = g.head.query(0, g.context);
  for (int variant = 0; variant < 5; ++variant) {
    SearchParams sp;
    if (variant == 4) sp.patience = -1;
    if (variant == 0) sp.expand_width = 0;
    if (variant == 1) sp.expand_width = 65;
    if (variant == 2) sp.rerank = -1;
    if (variant == 3) sp.k = 0;
    EXPECT_THROW(g.graphs[0]->search(q, g.keys.view(), sp, *scratch, r), Error) << "variant " << variant;
    SearchJob job{g.graphs[0].get(), q, scratch.get(), &r};
    SearchJob jobs[2] = {job, job};
    auto other = g.graphs[0]->make_scratch();
    jobs[1].scratch = other.get();
    EXPECT_THROW(search_many(jobs, 2, g.keys.view(), sp), Error) << "variant " << variant;
  }
  SearchJob broken{g.graphs[0].get(), nullptr, scratch.get(), &r};
  EXPECT_THROW(search_many(&broken, 1, g.keys.view(), SearchParams{}), Error);
}

TEST(GraphSearch, PatienceStopsEarlyAndNeverChangesAWalkItDoesNotStop) {
  // A patience no walk can exhaust (> the keys) gives the plain walk's
  // results exactly; a short one scores fewer keys per query, still returns
  // exact scores best first, and keeps recall near the plain walk's.
  const Group g = make_group(6000, 120, 1, DType::f32);
  const KeyIndex& index = *g.graphs[0];
  auto scratch = index.make_scratch();
  for (int codes = 0; codes < 2; ++codes) {
    double rec[3] = {0, 0, 0};
    int64_t scored[3] = {0, 0, 0};
    for (int64_t i = 0; i < g.m; ++i) {
      const float* q = g.head.query(0, g.context + i);
      SearchResult r[3];
      for (int v = 0; v < 3; ++v) {
        SearchParams sp;
        sp.k = 32;
        sp.queue_length = 96;
        sp.traversal_codes = codes == 1;
        sp.patience = v == 0 ? 0 : v == 1 ? int(g.context) + 1 : 8;
        index.search(q, g.keys.view(), sp, *scratch, r[v]);
        rec[v] += recall(r[v].ids, oracle_top_k(q, g.keys, g.context, sp.k)) / double(g.m);
        scored[v] += r[v].keys_scored;
      }
      ASSERT_EQ(r[1].ids, r[0].ids) << "query " << i;
      ASSERT_EQ(r[1].scores, r[0].scores);
      ASSERT_EQ(r[1].keys_scored, r[0].keys_scored);
      ASSERT_LE(r[2].keys_scored, r[0].keys_scored);
      ASSERT_EQ(r[2].ids.size(), size_t(32));
      for (size_t j = 0; j < r[2].ids.size(); ++j) {
        ASSERT_EQ(r[2].scores[j], internal::dot_row(q, g.keys.view(), r[2].ids[j]));
        if (j > 0) {
          ASSERT_GE(r[2].scores[j - 1], r[2].scores[j]);
        }
      }
    }
    EXPECT_LT(scored[2], scored[0]) << "codes " << codes;  // it does stop early
    EXPECT_GT(rec[2], rec[0] - 0.1) << "codes " << codes;
    RecordProperty("recall_plain_codes" + std::to_string(codes), std::to_string(rec[0]));
    RecordProperty("recall_patience8_codes" + std::to_string(codes), std::to_string(rec[2]));
    RecordProperty("scored_ratio_codes" + std::to_string(codes), std::to_string(double(scored[2]) / double(scored[0])));
  }
}

}  // namespace
}  // namespace rattn
