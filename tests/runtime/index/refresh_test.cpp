// refresh_projected_graph(): the query-guided repair of a grown graph with the
// queries of the tokens inserted since the build. It lifts the recall of
// decode-position queries over an insert-only graph (synthetic set; oracle:
// the exact top-100 by brute force), is deterministic, gives rows the
// index does not hold no edges, and rejects bad arguments.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

constexpr int64_t kTokens = 16384, kTest = 256, kContext = kTokens - kTest, kBase = kContext * 9 / 10;

struct Grown {
  SyntheticHead head = [] {
    SyntheticSpec spec;  // rope base 500000, d 128, queries targeting distant keys
    spec.tokens = kTokens;
    spec.group = 1;
    spec.seed = 3;
    return make_synthetic(spec);
  }();
  RowStore keys{DType::f32, 128};
  GraphBuildParams params;
  std::unique_ptr<KeyIndex> index;

  // Built on the first 90% of the context, the rest inserted with own queries.
  Grown() {
    params.key_metric = 2;
    params.sample_fraction = 0.2;
    params.repair_fraction = 1.0;
    params.shift_queries = 1024;
    params.shift_span = 512;
    params.rope_base = SyntheticSpec{}.rope_base;
    keys.append_f32(head.keys.data(), kBase);
    index = build_projected_graph(keys.view(), head.query(0, 0), kBase, params);
    for (int64_t t = kBase; t < kContext; ++t) {
      keys.append_f32(head.keys.data() + size_t(t) * 128, 1);
      index->insert(int32_t(t), head.query(0, t), keys.view());
    }
  }
  // The inserted tokens' queries, every second one.
  std::vector<float> inserted_queries() const {
    std::vector<float> q;
    for (int64_t t = kBase; t < kContext; t += 2) q.insert(q.end(), head.query(0, t), head.query(0, t) + 128);
    return q;
  }
  double recall(const KeyIndex& ix, int L) const {
    return testing::mean_recall(ix, keys, kContext, kTest, 100, L, [&](int64_t i) { return head.query(0, kContext + i); });
  }
};

const Grown& grown() {
  static const Grown g;
  return g;
}

std::unique_ptr<KeyIndex> copy_of(const KeyIndex& ix) {
  std::string image;
  ix.serialize(&image);
  return deserialize_index(image);
}

// Measured on this set: recall@100 at L = 100 0.948 (insert only) -> 0.965.
TEST(Refresh, LiftsRecallOfDecodeQueriesAfterInserts) {
  const Grown& g = grown();
  auto refreshed = copy_of(*g.index);
  const std::vector<float> q = g.inserted_queries();
  const int64_t n = int64_t(q.size()) / 128;
  refresh_projected_graph(*refreshed, g.keys.view(), q.data(), n, g.params);
  const GraphInfo info = projected_graph_info(*refreshed);
  EXPECT_EQ(info.refresh_queries, 5 * n);  // each query and its 4 RoPE-shifted copies
  EXPECT_GT(info.refresh_edges_offered, 0);
  EXPECT_EQ(info.unreachable, 0);
  const double before = g.recall(*g.index, 100), after = g.recall(*refreshed, 100);
  EXPECT_GT(after, before + 0.005) << "insert only " << before << ", refreshed " << after;
}

TEST(Refresh, IsDeterministicAndANoOpWithoutQueries) {
  const Grown& g = grown();
  std::string original, image_a, image_b, image_none;
  g.index->serialize(&original);
  auto a = copy_of(*g.index), b = copy_of(*g.index), none = copy_of(*g.index);
  const std::vector<float> q = g.inserted_queries();
  GraphBuildParams one_thread = g.params;
  one_thread.threads = 1;
  refresh_projected_graph(*a, g.keys.view(), q.data(), int64_t(q.size()) / 128, g.params);
  refresh_projected_graph(*b, g.keys.view(), q.data(), int64_t(q.size()) / 128, one_thread);
  refresh_projected_graph(*none, g.keys.view(), nullptr, 0, g.params);
  a->serialize(&image_a);
  b->serialize(&image_b);
  none->serialize(&image_none);
  EXPECT_EQ(image_a, image_b);  // whatever the thread count
  EXPECT_NE(image_a, original);
  EXPECT_EQ(image_none, original);
}

// Rows of the key store that the index skipped (a gap before an inserted
// key) take no edges even when a refresh query wants them most.
TEST(Refresh, RowsOutsideTheIndexTakeNoEdges) {
  const int d = 16, n = 400, gap = 20;
  const std::vector<float> rows = testing::random_rows(n + gap + 1, d, 7);
  RowStore keys(DType::f32, d);
  keys.append_f32(rows.data(), n + gap + 1);
  const std::vector<float> train = testing::random_rows(n, d, 8);
  GraphBuildParams p;
  p.degree = 8;
  p.query_neighbors = 20;
  p.build_queue = 32;
  const RowsView base{keys.view().data, DType::f32, n, d};
  auto index = build_projected_graph(base, train.data(), n, p);
  index->insert(n + gap, rows.data() + size_t(n + gap) * size_t(d), keys.view());
  // Queries equal to the skipped rows: each ranks its own row first.
  refresh_projected_graph(*index, keys.view(), rows.data() + size_t(n) * size_t(d), gap, p);
  auto scratch = index->make_scratch();
  SearchParams sp;
  sp.k = 50;
  sp.queue_length = 64;
  SearchResult r;
  for (int i = 0; i < gap; ++i) {
    index->search(rows.data() + size_t(n + i) * size_t(d), keys.view(), sp, *scratch, r);
    for (int32_t id : r.ids) EXPECT_TRUE(id < n || id == n + gap) << "returned row " << id << " is not indexed";
  }
}

TEST(Refresh, BadArgumentsAreRejected) {
  const Grown& g = grown();
  auto ix = copy_of(*g.index);
  const std::vector<float> q = g.inserted_queries();
  auto expect_invalid = [](const auto& call) {
    try {
      call();
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    }
  };
  expect_invalid([&] { refresh_projected_graph(*ix, g.keys.view(), nullptr, 3, g.params); });
  expect_invalid([&] { refresh_projected_graph(*ix, g.keys.view(), q.data(), -1, g.params); });
  RowsView short_store = g.keys.view();
  short_store.rows = kBase;
  expect_invalid([&] { refresh_projected_graph(*ix, short_store, q.data(), 1, g.params); });
  const std::vector<float> narrow(size_t(kContext) * 64, 0.0f);
  expect_invalid([&] {
    refresh_projected_graph(*ix, RowsView{narrow.data(), DType::f32, kContext, 64}, q.data(), 1, g.params);
  });
  GraphBuildParams bad_base = g.params;  // the shifted copies need a RoPE base > 1
  bad_base.rope_base = 0.5;
  expect_invalid([&] { refresh_projected_graph(*ix, g.keys.view(), q.data(), 1, bad_base); });
  auto flat = make_brute_force_index(kContext);
  expect_invalid([&] { refresh_projected_graph(*flat, g.keys.view(), q.data(), 1, g.params); });
}

}  // namespace
}  // namespace rattn
