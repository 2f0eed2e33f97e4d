// The projected traversal codes (internal::ProjectedCodes, SearchParams::
// code_dims): the eigen-solver against its definition, the projection against
// float64 inner products (exact at dims = d; off by only a per-query constant
// when the keys span `dims` directions), and the graph walk on them: brute
// force at full budget, recall close to the exact walk, save/load and insert.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_codes.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using internal::ProjectedCodes;
using testing::oracle_top_k;
using testing::recall;

// A random positive definite [d, d] matrix with eigenvalues over 3 decades.
std::vector<float> anisotropic_moment(int d, uint64_t seed) {
  const std::vector<float> g = testing::random_rows(d, d, seed);
  std::vector<float> m(size_t(d) * size_t(d), 0.0f);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double acc = 0;
      for (int k = 0; k < d; ++k)
        acc += double(g[size_t(i) * size_t(d) + size_t(k)]) * double(g[size_t(j) * size_t(d) + size_t(k)]) *
               std::pow(10.0, -3.0 * k / d);
      m[size_t(i) * size_t(d) + size_t(j)] = float(acc);
    }
  return m;
}

TEST(SymmetricEigen, ReconstructsTheMatrixWithOrthonormalVectorsInDescendingOrder) {
  for (int n : {1, 7, 40}) {
    const std::vector<float> f = anisotropic_moment(n, 3 + uint64_t(n));
    std::vector<double> a(f.begin(), f.end());
    for (int i = 0; i < n; ++i) a[size_t(i) * size_t(n) + size_t(i)] -= 0.5;  // some negative eigenvalues too
    std::vector<double> values, vectors;
    internal::symmetric_eigen(a, n, &values, &vectors);
    ASSERT_EQ(values.size(), size_t(n));
    double scale = 0;
    for (double x : a) scale = std::max(scale, std::fabs(x));
    for (int i = 0; i < n; ++i) {
      if (i > 0) {
        EXPECT_GE(values[size_t(i - 1)], values[size_t(i)]);
      }
      for (int j = 0; j < n; ++j) {
        double vv = 0, rec = 0;
        for (int k = 0; k < n; ++k) {
          vv += vectors[size_t(i) * size_t(n) + size_t(k)] * vectors[size_t(j) * size_t(n) + size_t(k)];
          rec += values[size_t(k)] * vectors[size_t(k) * size_t(n) + size_t(i)] * vectors[size_t(k) * size_t(n) + size_t(j)];
        }
        EXPECT_NEAR(vv, i == j ? 1.0 : 0.0, 1e-9) << n << " " << i << " " << j;
        EXPECT_NEAR(rec, a[size_t(i) * size_t(n) + size_t(j)], 1e-9 * scale) << n << " " << i << " " << j;
      }
    }
  }
}

double dot64(const float* a, const float* b, int n) {
  double acc = 0;
  for (int j = 0; j < n; ++j) acc += double(a[j]) * double(b[j]);
  return acc;
}

TEST(ProjectedCodes, FullDimensionProjectionKeepsEveryInnerProduct) {
  const int d = 32;
  const int64_t n = 500;
  RowStore keys(DType::f16, d);  // the fp16 path of the fit and encode
  keys.append_f32(testing::random_rows(n, d, 5, 0.3f).data(), n);
  ProjectedCodes pc;
  pc.fit(keys.view(), n, anisotropic_moment(d, 8), d);
  ASSERT_EQ(pc.rows(), n);
  ASSERT_EQ(pc.codes().dim(), d);
  const std::vector<float> queries = testing::random_rows(10, d, 9, -0.2f);
  std::vector<float> pq(static_cast<size_t>(d)), pk(static_cast<size_t>(d)), row(static_cast<size_t>(d));
  for (int qi = 0; qi < 10; ++qi) {
    const float* q = queries.data() + size_t(qi) * size_t(d);
    pc.project_query(q, pq.data());
    for (int64_t i = 0; i < n; ++i) {
      keys.row_f32(i, row.data());
      const float* k = row.data();
      pc.project_key(k, pk.data());
      const double truth = dot64(q, k, d);
      EXPECT_NEAR(dot64(pq.data(), pk.data(), d), truth, 1e-3 * (1.0 + std::fabs(truth)));
    }
  }
}

TEST(ProjectedCodes, KeysSpanningDimsDirectionsLoseOnlyAPerQueryConstant) {
  // Keys = mean + a combination of r fixed directions: projected onto r
  // directions, every key's score moves by the same amount for a query, so
  // the ranking is exact.
  const int d = 48, r = 6;
  const int64_t n = 400;
  const std::vector<float> basis = testing::random_rows(r, d, 21);
  const std::vector<float> coef = testing::random_rows(n, r, 22);
  const std::vector<float> mean = testing::random_rows(1, d, 23, 1.0f);
  std::vector<float> rows(size_t(n) * size_t(d));
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      double v = mean[size_t(j)];
      for (int c = 0; c < r; ++c) v += double(coef[size_t(i) * size_t(r) + size_t(c)]) * basis[size_t(c) * size_t(d) + size_t(j)];
      rows[size_t(i) * size_t(d) + size_t(j)] = float(v);
    }
  RowStore keys(DType::f32, d);  // (fp16 rounding would add key noise outside the r directions)
  keys.append_f32(rows.data(), n);
  ProjectedCodes pc;
  pc.fit(keys.view(), n, anisotropic_moment(d, 24), r);
  ASSERT_EQ(pc.codes().stride(), 64);
  const std::vector<float> queries = testing::random_rows(8, d, 25);
  std::vector<float> pq(static_cast<size_t>(r)), pk(static_cast<size_t>(r)), k(static_cast<size_t>(d));
  for (int qi = 0; qi < 8; ++qi) {
    const float* q = queries.data() + size_t(qi) * size_t(d);
    pc.project_query(q, pq.data());
    double first = 0;
    for (int64_t i = 0; i < n; ++i) {
      keys.row_f32(i, k.data());
      pc.project_key(k.data(), pk.data());
      const double gap = dot64(q, k.data(), d) - dot64(pq.data(), pk.data(), r);
      if (i == 0) first = gap;
      EXPECT_NEAR(gap, first, 2e-3 * (1.0 + std::fabs(first))) << "query " << qi << " key " << i;
    }
  }
}

TEST(ProjectedCodes, BadUseIsAnError) {
  RowStore keys(DType::f32, 16);
  keys.append_f32(testing::random_rows(50, 16, 1).data(), 50);
  ProjectedCodes pc;
  EXPECT_THROW(pc.fit(keys.view(), 50, {}, 0), Error);
  EXPECT_THROW(pc.fit(keys.view(), 50, {}, 17), Error);
  EXPECT_THROW(pc.fit(keys.view(), 51, {}, 8), Error);
  EXPECT_THROW(pc.fit(keys.view(), 50, std::vector<float>(15 * 15, 1.0f), 8), Error);
  EXPECT_THROW(pc.append(keys.view(), 50), Error);  // before fit
  pc.fit(keys.view(), 40, {}, 8);                   // identity moment: a PCA of the keys
  pc.append(keys.view(), 50);
  EXPECT_EQ(pc.rows(), 50);
  EXPECT_EQ(pc.fitted_rows(), 40);
}

struct Head {
  SyntheticHead head;
  int64_t context = 0, m = 0;
  RowStore keys;
  std::unique_ptr<KeyIndex> graph;
};

Head make_head(int64_t tokens, int64_t m, int64_t indexed, bool keep_query_moment = true) {
  SyntheticSpec spec;
  spec.tokens = tokens;
  spec.head_dim = 64;
  spec.group = 1;
  spec.seed = 31;
  GraphBuildParams p;
  p.keep_query_moment = keep_query_moment;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  Head h{make_synthetic(spec), tokens - m, m, RowStore(DType::f32, 64), nullptr};
  h.keys.append_f32(h.head.keys.data(), indexed);
  h.graph = build_projected_graph(h.keys.view(), h.head.query(0, 0), indexed, p);
  return h;
}

SearchParams projected_params(int k, int L, int dims) {
  SearchParams sp;
  sp.k = k;
  sp.queue_length = L;
  sp.traversal_codes = true;
  sp.code_dims = dims;
  return sp;
}

TEST(GraphProjectedCodes, FullBudgetWithFullRerankIsBruteForce) {
  const Head h = make_head(1500, 30, 1470);
  auto scratch = h.graph->make_scratch();
  // 8-bit codes of 32 directions; 32 + 16 coarse; all 64 with 32 coarse.
  for (const auto& [dims, coarse] : {std::pair{32, 0}, std::pair{48, 16}, std::pair{64, 32}}) {
    SearchParams sp = projected_params(20, int(h.context), dims);
    sp.code_coarse_dims = coarse;
    sp.rerank = int(h.context);  // every candidate re-ranked with the exact keys
    SearchResult r;
    for (int64_t i = 0; i < h.m; ++i) {
      const float* q = h.head.query(0, h.context + i);
      h.graph->search(q, h.keys.view(), sp, *scratch, r);
      EXPECT_EQ(r.ids, oracle_top_k(q, h.keys, h.context, sp.k)) << "query " << i << " dims " << dims;
      for (size_t j = 0; j < r.ids.size(); ++j) EXPECT_EQ(r.scores[j], internal::dot_row(q, h.keys.view(), r.ids[j]));
    }
  }
}

TEST(GraphProjectedCodes, HalfTheDimensionsWalkNearlyAsWellAsTheExactKeys) {
  const Head h = make_head(6000, 150, 5850);
  auto scratch = h.graph->make_scratch();
  // exact walk, 8-bit codes, projected codes (d / 2), 24 8-bit + 24 4-bit projected
  double rec[4] = {0, 0, 0, 0};
  int64_t scored[4] = {0, 0, 0, 0};
  SearchResult r;
  for (int v = 0; v < 4; ++v) {
    SearchParams sp = projected_params(32, 96, v == 2 ? 32 : v == 3 ? 48 : 0);
    sp.code_coarse_dims = v == 3 ? 24 : 0;
    sp.traversal_codes = v > 0;
    for (int64_t i = 0; i < h.m; ++i) {
      const float* q = h.head.query(0, h.context + i);
      h.graph->search(q, h.keys.view(), sp, *scratch, r);
      rec[v] += recall(r.ids, oracle_top_k(q, h.keys, h.context, sp.k)) / double(h.m);
      scored[v] += r.keys_scored;
    }
  }
  RecordProperty("recall_exact", std::to_string(rec[0]));
  RecordProperty("recall_codes", std::to_string(rec[1]));
  RecordProperty("recall_projected32", std::to_string(rec[2]));
  RecordProperty("recall_projected24_coarse24", std::to_string(rec[3]));
  EXPECT_GT(rec[0], 0.8);
  EXPECT_GT(rec[2], rec[0] - 0.03);
  EXPECT_GT(rec[3], rec[0] - 0.03);
  // One cache line per key: 64 B of codes (+ the projection) per node.
  const GraphInfo gi = projected_graph_info(*h.graph);
  EXPECT_GE(gi.code_bytes, size_t(h.context) * (64 + 64));  // both code sets exist and are counted
}

// The query moment is opt-in (GraphBuildParams::keep_query_moment): without
// it the image holds d x d floats less and projected codes still work (a plain
// PCA of the keys), returning exact, sorted scores.
TEST(GraphProjectedCodes, QueryMomentIsKeptOnlyWhenAsked) {
  const Head with = make_head(2500, 40, 2460, true), without = make_head(2500, 40, 2460, false);
  std::string a, b;
  with.graph->serialize(&a);
  without.graph->serialize(&b);
  EXPECT_EQ(a.size(), b.size() + size_t(64) * 64 * sizeof(float));
  EXPECT_GE(with.graph->memory_bytes(), without.graph->memory_bytes() + size_t(64) * 64 * sizeof(float));
  auto scratch = without.graph->make_scratch();
  SearchResult r;
  const float* q = without.head.query(0, without.context);
  without.graph->search(q, without.keys.view(), projected_params(16, 64, 24), *scratch, r);
  ASSERT_EQ(r.ids.size(), 16u);
  for (size_t i = 0; i < r.ids.size(); ++i) {
    EXPECT_NEAR(r.scores[i], dot64(q, static_cast<const float*>(without.keys.view().row(r.ids[i])), 64), 1e-4);
    if (i > 0) {
      EXPECT_GE(r.scores[i - 1], r.scores[i]);
    }
  }
}

TEST(GraphProjectedCodes, SaveLoadKeepsTheProjectionsQueryModel) {
  const Head h = make_head(2500, 40, 2460);
  std::string image;
  h.graph->serialize(&image);
  const auto loaded = deserialize_index(image);
  auto s1 = h.graph->make_scratch();
  auto s2 = loaded->make_scratch();
  const SearchParams sp = projected_params(16, 64, 24);
  SearchResult a, b;
  for (int64_t i = 0; i < h.m; ++i) {
    const float* q = h.head.query(0, h.context + i);
    h.graph->search(q, h.keys.view(), sp, *s1, a);
    loaded->search(q, h.keys.view(), sp, *s2, b);
    ASSERT_EQ(a.ids, b.ids) << "query " << i;
    ASSERT_EQ(a.scores, b.scores);
    ASSERT_EQ(a.keys_scored, b.keys_scored);
  }
  // A flipped byte of the (current) image is still rejected.
  std::string bad = image;
  bad[bad.size() / 2] = char(bad[bad.size() / 2] ^ 0x10);
  EXPECT_THROW(deserialize_index(bad), Error);
}

TEST(GraphProjectedCodes, CodesFollowInsertsAndBadDimsAreRejected) {
  SyntheticSpec spec;
  spec.tokens = 2100;
  spec.head_dim = 64;
  spec.group = 1;
  spec.seed = 41;
  const SyntheticHead head = make_synthetic(spec);
  const int64_t base = 400, context = 2000;
  RowStore keys(DType::f32, 64);
  keys.append_f32(head.keys.data(), base);
  GraphBuildParams p;
  p.keep_query_moment = true;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  auto index = build_projected_graph(keys.view(), head.queries.data(), base, p);
  auto scratch = index->make_scratch();
  SearchParams sp = projected_params(10, 60, 32);
  SearchResult r;
  index->search(head.query(0, context), keys.view(), sp, *scratch, r);  // fits on 400 keys
  for (int64_t t = base; t < context; ++t) {
    keys.append_f32(head.keys.data() + size_t(t) * 64, 1);
    index->insert(int32_t(t), head.query(0, t), keys.view());
  }
  sp.queue_length = int(context);
  sp.rerank = int(context);
  for (int64_t i = 0; i < 20; ++i) {
    const float* q = head.query(0, context + i);
    index->search(q, keys.view(), sp, *scratch, r);
    EXPECT_EQ(r.ids, oracle_top_k(q, keys, context, sp.k)) << "query " << i;
  }
  for (int bad : {-1, 65}) {
    sp.code_dims = bad;
    EXPECT_THROW(index->search(head.query(0, context), keys.view(), sp, *scratch, r), Error) << bad;
  }
  sp.code_dims = 32;
  for (int bad : {-1, 33}) {  // coarse dims outside [0, code_dims]
    sp.code_coarse_dims = bad;
    EXPECT_THROW(index->search(head.query(0, context), keys.view(), sp, *scratch, r), Error) << bad;
  }
}

}  // namespace
}  // namespace rattn
