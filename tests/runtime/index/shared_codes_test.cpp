// Traversal codes shared by the indexes over one key store (a GQA group's
// query heads, KeyIndex::attach_traversal_codes): searches walking the shared
// set return exactly what the same indexes return with codes of their own
// (ids, scores, keys scored; search() and search_many()), before and after
// inserts and across a refit; a search that finds the shared codes behind its
// index fails instead of racing; detaching goes back to the index's own codes.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph.h"

namespace rattn {
namespace {

using internal::SharedTraversalCodes;

constexpr int kDim = 64;
constexpr int kHeads = 4;

// A group of 4 query heads over one key store, its graphs built on the first
// `context` keys; each graph twice (from one image): `own` keeps its own
// codes, `shared` walks one set attached to all four.
struct TwinGroup {
  SyntheticHead head;
  RowStore keys{DType::f16, kDim};
  std::vector<std::unique_ptr<KeyIndex>> own, shared;
  std::shared_ptr<SharedTraversalCodes> codes = std::make_shared<SharedTraversalCodes>();
};

TwinGroup make_twins(int64_t context, int64_t total) {
  SyntheticSpec spec;
  spec.tokens = total;
  spec.head_dim = kDim;
  spec.group = kHeads;
  spec.seed = 31;
  TwinGroup g{make_synthetic(spec), RowStore(DType::f16, kDim), {}, {}, std::make_shared<SharedTraversalCodes>()};
  g.keys.append_f32(g.head.keys.data(), context);
  GraphBuildParams p;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  for (int h = 0; h < kHeads; ++h) {
    auto built = build_projected_graph(g.keys.view(), g.head.query(h, 0), context, p);
    std::string image;
    built->serialize(&image);
    g.own.push_back(std::move(built));
    g.shared.push_back(deserialize_index(image));
    EXPECT_TRUE(g.shared.back()->attach_traversal_codes(g.codes));
  }
  g.codes->update(g.keys.view(), context);
  return g;
}

SearchParams code_params(int k, int L) {
  SearchParams sp;
  sp.k = k;
  sp.queue_length = L;
  sp.traversal_codes = true;
  return sp;
}

void expect_same(const SearchResult& a, const SearchResult& b, const std::string& what) {
  EXPECT_EQ(a.ids, b.ids) << what;
  EXPECT_EQ(a.scores, b.scores) << what;
  EXPECT_EQ(a.keys_scored, b.keys_scored) << what;
  EXPECT_FALSE(a.ids.empty()) << what;
}

// Every head's search of queries [first, first + n) on both twins, one by
// one and (shared twins) through search_many().
void expect_twins_agree(const TwinGroup& g, const SearchParams& sp, int64_t first, int n) {
  for (int h = 0; h < kHeads; ++h) {
    auto s_own = g.own[size_t(h)]->make_scratch(), s_shared = g.shared[size_t(h)]->make_scratch();
    for (int64_t t = first; t < first + n; ++t) {
      SearchResult a, b;
      g.own[size_t(h)]->search(g.head.query(h, t), g.keys.view(), sp, *s_own, a);
      g.shared[size_t(h)]->search(g.head.query(h, t), g.keys.view(), sp, *s_shared, b);
      expect_same(a, b, "head " + std::to_string(h) + " query " + std::to_string(t));
    }
  }
  std::vector<std::unique_ptr<SearchScratch>> scratches;
  std::vector<SearchResult> many(kHeads), single(kHeads);
  std::vector<SearchJob> jobs;
  for (int h = 0; h < kHeads; ++h) scratches.push_back(g.shared[size_t(h)]->make_scratch());
  for (int h = 0; h < kHeads; ++h)
    jobs.push_back({g.shared[size_t(h)].get(), g.head.query(h, first), scratches[size_t(h)].get(), &many[size_t(h)]});
  search_many(jobs.data(), kHeads, g.keys.view(), sp);
  for (int h = 0; h < kHeads; ++h) {
    auto s = g.own[size_t(h)]->make_scratch();
    g.own[size_t(h)]->search(g.head.query(h, first), g.keys.view(), sp, *s, single[size_t(h)]);
    expect_same(many[size_t(h)], single[size_t(h)], "search_many head " + std::to_string(h));
  }
}

// Appends key t to the store and inserts it into every index of both twins
// (its own query as training query); the shared codes' owner then encodes it.
void insert_everywhere(TwinGroup& g, int64_t t) {
  g.keys.append_f32(g.head.keys.data() + size_t(t) * kDim, 1);
  for (int h = 0; h < kHeads; ++h) {
    g.own[size_t(h)]->insert(int32_t(t), g.head.query(h, t), g.keys.view());
    g.shared[size_t(h)]->insert(int32_t(t), g.head.query(h, t), g.keys.view());
  }
  g.codes->update(g.keys.view(), g.keys.rows());
}

TEST(SharedCodes, SearchesEqualOwnCodesBeforeAndAfterInserts) {
  const int64_t context = 2500;
  TwinGroup g = make_twins(context, context + 400);
  ASSERT_EQ(g.codes->rows(), context);
  for (int L : {40, 100}) expect_twins_agree(g, code_params(20, L), context + 300, 12);
  for (int64_t t = context; t < context + 250; ++t) insert_everywhere(g, t);
  EXPECT_EQ(g.codes->rows(), context + 250);
  for (int L : {40, 100}) expect_twins_agree(g, code_params(20, L), context + 300, 12);
  // The memory is the owner's: a shared index counts none of it, and holds
  // no codes of its own, while each own-codes index holds a full set.
  for (int h = 0; h < kHeads; ++h) {
    EXPECT_GE(g.own[size_t(h)]->memory_bytes(), g.shared[size_t(h)]->memory_bytes() + g.codes->memory_bytes());
    EXPECT_EQ(projected_graph_info(*g.shared[size_t(h)]).code_bytes, g.codes->memory_bytes());
  }
  EXPECT_GE(g.codes->memory_bytes(), size_t(context + 250) * kDim);
}

TEST(SharedCodes, RefitAsTheIndexDoublesMatchesOwnCodes) {
  // Codes fitted on 600 keys, then inserts past 1200: both refit at the same
  // row count (the owner updates after every insert, as the runtime does).
  const int64_t context = 600, grown = 1400;
  TwinGroup g = make_twins(context, grown + 100);
  // The own-codes twins fit theirs on a first search, on the same 600 keys.
  expect_twins_agree(g, code_params(10, 40), grown, 4);
  for (int64_t t = context; t < grown; ++t) insert_everywhere(g, t);
  ASSERT_EQ(g.codes->codes().fitted_rows(), 1200);
  for (int L : {40, 80}) expect_twins_agree(g, code_params(10, L), grown, 20);
}

TEST(SharedCodes, SearchFindingTheCodesBehindFails) {
  const int64_t context = 2200;
  TwinGroup g = make_twins(context, context + 10);
  g.keys.append_f32(g.head.keys.data() + size_t(context) * kDim, 1);
  g.shared[0]->insert(int32_t(context), g.head.query(0, context), g.keys.view());  // the codes not updated
  auto scratch = g.shared[0]->make_scratch();
  SearchResult r;
  try {
    g.shared[0]->search(g.head.query(0, context + 5), g.keys.view(), code_params(10, 40), *scratch, r);
    ADD_FAILURE() << "a search on codes behind its index must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::internal);
    EXPECT_NE(std::string(e.what()).find("shared traversal codes"), std::string::npos) << e.what();
  }
  // The exact walk does not read the codes; the other heads' indexes are
  // still covered.
  SearchParams exact = code_params(10, 40);
  exact.traversal_codes = false;
  g.shared[0]->search(g.head.query(0, context + 5), g.keys.view(), exact, *scratch, r);
  EXPECT_EQ(r.ids.size(), 10u);
  auto s1 = g.shared[1]->make_scratch();
  g.shared[1]->search(g.head.query(1, context + 5), g.keys.view(), code_params(10, 40), *s1, r);
  EXPECT_EQ(r.ids.size(), 10u);
  // Once the owner updates them, the search runs.
  g.codes->update(g.keys.view(), g.keys.rows());
  g.shared[0]->search(g.head.query(0, context + 5), g.keys.view(), code_params(10, 40), *scratch, r);
  EXPECT_EQ(r.ids.size(), 10u);
}

TEST(SharedCodes, DetachingGoesBackToOwnCodes) {
  const int64_t context = 2200;
  TwinGroup g = make_twins(context, context + 40);
  for (auto& ix : g.shared) EXPECT_TRUE(ix->attach_traversal_codes(nullptr));
  EXPECT_EQ(projected_graph_info(*g.shared[0]).code_bytes, 0u);  // none until a search wants them
  expect_twins_agree(g, code_params(10, 40), context, 8);
  EXPECT_GT(projected_graph_info(*g.shared[0]).code_bytes, 0u);
}

TEST(SharedCodes, ExactIndexTakesNone) {
  auto brute = make_brute_force_index(100);
  EXPECT_FALSE(brute->attach_traversal_codes(std::make_shared<SharedTraversalCodes>()));
}

}  // namespace
}  // namespace rattn
