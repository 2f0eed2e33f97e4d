// Lockstep walks: search_many() jobs that share one graph (plan shared_graph:
// a GQA group's query heads on their KV head's graph) score each round's
// union of rows once (Distance::dots_multi) and must return exactly what
// separate search() calls return: ids, scores and keys scored. Also
// dots_multi against dots() bit for bit, and against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/kv_store.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using internal::Distance;

// One KV head's graph built from its group's pooled queries.
struct SharedGroup {
  SyntheticHead head;
  int64_t context = 0;
  RowStore keys;
  std::unique_ptr<KeyIndex> graph;
};

SharedGroup make_shared_group(int64_t tokens, int64_t m, int group, int dim, DType dtype) {
  SyntheticSpec spec;
  spec.tokens = tokens;
  spec.head_dim = dim;
  spec.group = group;
  spec.seed = 29;
  SharedGroup g{make_synthetic(spec), tokens - m, RowStore(dtype, dim), nullptr};
  g.keys.append_f32(g.head.keys.data(), g.context);
  std::vector<float> pooled;
  for (int h = 0; h < group; ++h)
    pooled.insert(pooled.end(), g.head.query(h, 0), g.head.query(h, 0) + size_t(g.context) * size_t(dim));
  GraphBuildParams p;
  p.degree = 16;
  p.query_neighbors = 32;
  p.build_queue = 64;
  p.sample_fraction = 0.5;
  g.graph = build_projected_graph(g.keys.view(), pooled.data(), int64_t(group) * g.context, p);
  return g;
}

// The group's queries at token t, each job with its own scratch and seeds
// (the head's previous results), against one search() per job.
void expect_lockstep_equals_single(const SharedGroup& g, int group, int64_t t, const SearchParams& sp,
                                   int n_seeds) {
  std::vector<std::unique_ptr<SearchScratch>> scratches;
  std::vector<SearchResult> prev(static_cast<size_t>(group)), many(prev.size());
  auto s = g.graph->make_scratch();
  for (int h = 0; h < group; ++h) {
    scratches.push_back(g.graph->make_scratch());
    g.graph->search(g.head.query(h, t - 1), g.keys.view(), sp, *s, prev[size_t(h)]);
  }
  std::vector<SearchJob> jobs;
  for (int h = 0; h < group; ++h) {
    const int seeds = std::min<int>(n_seeds, int(prev[size_t(h)].ids.size()));
    jobs.push_back({g.graph.get(), g.head.query(h, t), scratches[size_t(h)].get(), &many[size_t(h)],
                    prev[size_t(h)].ids.data(), seeds});
  }
  testing::expect_many_equals_single(jobs.data(), group, g.keys.view(), sp);  // job h: head h
}

struct LockstepCase {
  DType dtype;
  int dim;
};

class LockstepTest : public ::testing::TestWithParam<LockstepCase> {};

TEST_P(LockstepTest, EqualsSeparateSearchesPerHead) {
  const int group = 4;
  const SharedGroup g = make_shared_group(3000, 40, group, GetParam().dim, GetParam().dtype);
  for (int width : {1, 2})
    for (int L : {40, 120})
      for (int patience : {0, 8})
        for (int seeds : {0, 20}) {
          SearchParams sp;
          sp.k = 20;
          sp.queue_length = L;
          sp.expand_width = width;
          sp.patience = patience;
          if (L == 120) {  // partial expansion too
            sp.expand_first = 6;
            sp.full_expand_rank = 30;
          }
          SCOPED_TRACE(::testing::Message() << "width " << width << " L " << L << " patience " << patience
                                            << " seeds " << seeds);
          for (int64_t t = g.context; t < g.context + 12; t += 4) expect_lockstep_equals_single(g, group, t, sp, seeds);
        }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LockstepTest,
                         ::testing::Values(LockstepCase{DType::f32, 64}, LockstepCase{DType::f16, 64},
                                           LockstepCase{DType::f16, 36}, LockstepCase{DType::bf16, 64}),
                         [](const ::testing::TestParamInfo<LockstepCase>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_d" + std::to_string(info.param.dim);
                         });

TEST(Lockstep, TwoHeadsAndOddGroupsToo) {
  const SharedGroup g = make_shared_group(2000, 20, 3, 64, DType::f16);
  SearchParams sp;
  sp.k = 10;
  sp.queue_length = 48;
  expect_lockstep_equals_single(g, 3, g.context + 3, sp, 10);
  expect_lockstep_equals_single(g, 2, g.context + 7, sp, 10);
}

// dots_multi: each masked entry equals dots() for that query bit for bit
// (the lockstep walk's exactness rests on it), matches a float64 reference
// within the fp32 bound, and leaves unmasked entries untouched.
TEST(Lockstep, DotsMultiEqualsDotsPerQuery) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (int dim : {8, 36, 64, 128})
      for (bool portable : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d " << dim << " portable " << portable);
        const int rows = 50, nq = 4, n = 30;
        std::vector<float> data(size_t(rows) * size_t(dim)), qs(size_t(nq) * size_t(dim));
        uint64_t x = 88172645463325252ull;
        auto next = [&] {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          return float(double(x >> 11) / double(1ull << 53) * 2.0 - 1.0);
        };
        for (float& v : data) v = next();
        for (float& v : qs) v = next();
        RowStore keys(dt, dim);
        keys.append_f32(data.data(), rows);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        std::vector<uint32_t> masks(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          ids[size_t(i)] = int32_t((i * 7 + 3) % rows);
          masks[size_t(i)] = uint32_t(i % 15 + 1);  // every non-empty subset of the 4 queries
        }
        const float* queries[nq];
        for (int q = 0; q < nq; ++q) queries[q] = qs.data() + size_t(q) * size_t(dim);
        const std::unique_ptr<Distance> dist = portable ? internal::make_portable_distance() : internal::make_distance(nullptr);
        const float kUntouched = -12345.f;
        std::vector<float> multi(size_t(nq) * size_t(n), kUntouched), one(static_cast<size_t>(n));
        dist->dots_multi(queries, nq, keys.view(), ids.data(), masks.data(), n, multi.data());
        for (int q = 0; q < nq; ++q) {
          dist->dots(queries[q], keys.view(), ids.data(), n, one.data());
          for (int i = 0; i < n; ++i) {
            const float got = multi[size_t(q) * size_t(n) + size_t(i)];
            if (!(masks[size_t(i)] >> q & 1u)) {
              EXPECT_EQ(got, kUntouched);
              continue;
            }
            EXPECT_EQ(got, one[size_t(i)]) << "query " << q << " row " << i;
            double exact = 0, mag = 0;
            std::vector<float> row(static_cast<size_t>(dim));
            to_f32(dt, keys.view().row(ids[size_t(i)]), row.data(), size_t(dim));
            for (int j = 0; j < dim; ++j) {
              exact += double(queries[q][j]) * double(row[size_t(j)]);
              mag += std::fabs(double(queries[q][j]) * double(row[size_t(j)]));
            }
            const double u = std::ldexp(1.0, -24), gamma = dim * u / (1 - dim * u);
            EXPECT_LE(std::fabs(double(got) - exact), gamma * mag + 1e-30);
          }
        }
      }
}

}  // namespace
}  // namespace rattn
