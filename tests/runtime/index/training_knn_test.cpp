// training_knn: the CPU path is exact_knn's lists; knn_device gpu without a
// GPU is a clear error; with a GPU its lists are the exact top-k up to ties
// and fp32 rounding (float64 scores of the returned ids), causal or not; a
// graph built with the GPU's kNN (run beside the key relations) is the same
// from run to run and shares its lists with the CPU's exact build up to those
// ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "core/error.h"
#include "runtime/index/projected_graph.h"

namespace rattn {
namespace {

struct Case {
  int d = 64, nq = 20;
  int64_t n = 3000, q = 500;
  std::vector<float> keys, queries;
  std::vector<int64_t> picked;
  RowsView view() const { return {keys.data(), DType::f32, n, d}; }
};

Case make_case() {
  Case c;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  c.keys.resize(size_t(c.n) * size_t(c.d));
  c.queries.resize(size_t(c.q) * size_t(c.d));
  for (float& x : c.keys) x = nd(rng);
  for (float& x : c.queries) x = nd(rng);
  for (int64_t t = 40; t < c.q; t += 3) c.picked.push_back(t);  // sorted; t >= 40 sees >= nq keys causally
  return c;
}

TEST(TrainingKnn, TheCpuPathIsExactKnn) {
  const Case c = make_case();
  for (bool causal : {false, true}) {
    GraphBuildParams p;
    p.threads = 2;
    p.causal = causal;
    p.causal_key_offset = 20;
    for (auto device : {GraphBuildParams::KnnDevice::cpu, GraphBuildParams::KnnDevice::automatic}) {
      p.knn_device = device;
      const int64_t q = int64_t(c.picked.size());
      if (device == GraphBuildParams::KnnDevice::automatic && internal::training_knn_on_gpu(p, c.n, q, c.d, c.nq))
        continue;  // a GPU takes it: compared below
      const auto got = internal::training_knn(c.view(), c.queries.data(), c.picked, c.nq, p, {});
      const auto want = internal::exact_knn(c.view(), c.queries.data(), c.picked, c.nq, 2, {}, causal ? 20 : -1);
      EXPECT_EQ(got, want) << (causal ? "causal" : "all keys");
    }
  }
  GraphBuildParams small;  // automatic: too small to gain on any GPU
  EXPECT_FALSE(internal::training_knn_on_gpu(small, 1000, 1000, 64, 20));
  small.knn_device = GraphBuildParams::KnnDevice::gpu;
  EXPECT_TRUE(internal::training_knn_on_gpu(small, 1000, 1000, 64, 20));
}

TEST(TrainingKnn, GpuWithoutAGpuIsAnError) {
  std::string why;
  if (gpu_present(&why)) GTEST_SKIP() << "a GPU is present";
  const Case c = make_case();
  GraphBuildParams p;
  p.knn_device = GraphBuildParams::KnnDevice::gpu;
  try {
    internal::training_knn(c.view(), c.queries.data(), c.picked, c.nq, p, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
    EXPECT_NE(std::string(e.what()).find("knn_device gpu, but no GPU"), std::string::npos) << e.what();
  }
}

TEST(TrainingKnn, GpuListsAreTheExactTopKUpToTies) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Case c = make_case();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "all keys");
    GraphBuildParams p;
    p.knn_device = GraphBuildParams::KnnDevice::gpu;
    p.causal = causal;
    p.causal_key_offset = 20;
    const auto got = internal::training_knn(c.view(), c.queries.data(), c.picked, c.nq, p, {});
    ASSERT_EQ(got.size(), c.picked.size() * size_t(c.nq));
    for (size_t i = 0; i < c.picked.size(); ++i) {
      const int64_t t = c.picked[i], visible = causal ? std::min<int64_t>(c.n, t - 20 + 1) : c.n;
      std::vector<double> s(static_cast<size_t>(visible));
      double scale = 0;
      for (int64_t j = 0; j < visible; ++j) {
        double acc = 0, a = 0;
        for (int x = 0; x < c.d; ++x) {
          const double v = double(c.queries[size_t(t * c.d + x)]) * c.keys[size_t(j * c.d + x)];
          acc += v;
          a += std::fabs(v);
        }
        s[size_t(j)] = acc;
        scale = std::max(scale, a);
      }
      std::vector<double> sorted = s;
      std::nth_element(sorted.begin(), sorted.begin() + (c.nq - 1), sorted.end(), std::greater<>());
      const double kth = sorted[size_t(c.nq - 1)], tol = 3e-6 * c.d * scale;
      std::set<int32_t> ids(got.begin() + long(i) * c.nq, got.begin() + long(i + 1) * c.nq);
      EXPECT_EQ(ids.size(), size_t(c.nq));
      for (int32_t id : ids) {
        ASSERT_GE(id, 0);
        ASSERT_LT(id, visible);
        EXPECT_GE(s[size_t(id)], kth - 2 * tol);
      }
    }
  }
}

// The GPU's kNN runs on its own thread beside the key relations: two builds
// must give the same graph, and each node's list must mostly hold the same
// neighbours as the build from the CPU's exact lists (the lists differ only
// where fp32 rounding reorders near-ties at the k-th place).
TEST(TrainingKnn, GpuBuildBesideTheKeyRelationsIsDeterministicAndMatchesTheCpuBuild) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  const Case c = make_case();
  GraphBuildParams p;
  p.threads = 2;
  p.query_neighbors = c.nq;
  p.knn_min_keys = 1 << 30;  // the CPU's kNN exact
  p.knn_device = GraphBuildParams::KnnDevice::cpu;
  const auto cpu = build_projected_graph(c.view(), c.queries.data(), c.q, p);
  p.knn_device = GraphBuildParams::KnnDevice::gpu;
  const auto gpu = build_projected_graph(c.view(), c.queries.data(), c.q, p);
  const auto again = build_projected_graph(c.view(), c.queries.data(), c.q, p);
  const GraphInfo gi = projected_graph_info(*gpu);
  EXPECT_FALSE(projected_graph_info(*cpu).knn_on_gpu);
  ASSERT_TRUE(gi.knn_on_gpu);
  EXPECT_GT(gi.knn_gpu_kernel_seconds, 0.0);
  EXPECT_GT(gi.knn_gpu_upload_seconds, 0.0);
  std::vector<std::string> phases;
  for (const BuildPhase& ph : gi.build_phases) phases.push_back(ph.name);
  const auto at = [&](const char* name) { return std::find(phases.begin(), phases.end(), name) - phases.begin(); };
  EXPECT_LT(at("key_metric"), at("training_knn")) << "the GPU's wait is marked after the key relations";
  EXPECT_LT(at("training_knn"), at("pivots"));
  double shared = 0, total = 0;
  for (int32_t v = 0; v < int32_t(c.n); ++v) {
    const auto g = projected_graph_neighbors(*gpu, v);
    ASSERT_EQ(g, projected_graph_neighbors(*again, v)) << "node " << v;
    auto a = projected_graph_neighbors(*cpu, v), b = g;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::vector<int32_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    shared += double(both.size());
    total += double(std::max(a.size(), b.size()));
  }
  EXPECT_EQ(projected_graph_entries(*gpu), projected_graph_entries(*again));
  EXPECT_GE(shared / total, 0.95) << "neighbours shared with the CPU's exact build";
}

}  // namespace
}  // namespace rattn
