// The training-query kNN kernel (codegen/cuda/knn_kernel.h): its exact
// emitted text, compiled for the host against simt_emu.h, against a float64
// reference; and the same text through NVRTC.
// Tolerance: a returned score is within tol(q) = 3e-6 * D * max_j sum_x
// |q_x k_jx| of the float64 inner product of the id it names (fp32 fma over D
// terms). Ids are the exact top-k up to ties: every returned id scores at
// least the reference's k-th best - 2 tol(q), and every key scoring more than
// the k-th best + 2 tol(q) is returned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codegen/cuda/knn_kernel.h"
#include "codegen/cuda/nvrtc_compiler.h"
#include "core/error.h"
#include "core/atomic_file.h"
#include "tests/codegen/cuda/emu_registry.h"
#include "tests/codegen/cuda/simt_emu_launch.h"

namespace rattn {
namespace {

using emu_test::EmuKnnModule;

// Keys around a few topic directions (inner products far apart and close
// ones), with rows 5, 6 and 7 exact copies of row 4 (equal scores: the tie
// rule must put the lower row first).
struct KnnData {
  int d = 0;
  int64_t nq = 0, nk = 0;
  std::vector<float> q, k;
};

KnnData make_data(int d, int64_t nq, int64_t nk, uint32_t seed) {
  KnnData x{d, nq, nk, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> topics(size_t(4) * size_t(d));
  for (float& t : topics) t = normal(rng);
  auto row = [&](std::vector<float>& out) {
    const int t = int(rng() % 4);
    for (int i = 0; i < d; ++i) out.push_back(0.7f * topics[size_t(t) * size_t(d) + size_t(i)] + normal(rng));
  };
  for (int64_t i = 0; i < nq; ++i) row(x.q);
  for (int64_t j = 0; j < nk; ++j) row(x.k);
  for (int64_t j = 5; j <= 7 && j < nk; ++j)
    std::copy(x.k.begin() + 4 * d, x.k.begin() + 5 * d, x.k.begin() + j * d);
  return x;
}

struct KnnOut {
  std::vector<int> ids;
  std::vector<float> scores;
};

KnnOut run(const EmuKnnModule& m, const KnnData& x, const std::vector<int>* limits) {
  const int k = m.params.k;
  KnnOut out{std::vector<int>(size_t(x.nq) * size_t(k), -7), std::vector<float>(size_t(x.nq) * size_t(k), 7.f)};
  const cuda::GeneratedKnn g = cuda::generate_knn_kernel(m.params);
  const unsigned blocks = unsigned((x.nq + g.tile_queries - 1) / g.tile_queries);
  emu::launch(m.kernel, dim3(blocks), dim3(unsigned(g.threads)), g.shared_bytes, x.q.data(), x.k.data(),
              limits ? limits->data() : static_cast<const int*>(nullptr), (long long)x.nq, (long long)x.nk,
              out.ids.data(), out.scores.data());
  return out;
}

// Checks query row i of `out` against float64 scores over keys [0, visible).
void check_row(const KnnData& x, const KnnOut& out, int k, int64_t i, int64_t visible) {
  SCOPED_TRACE("query " + std::to_string(i) + ", " + std::to_string(visible) + " visible keys");
  const int d = x.d;
  std::vector<double> ref(static_cast<size_t>(visible));
  double scale = 0;
  for (int64_t j = 0; j < visible; ++j) {
    double s = 0, a = 0;
    for (int c = 0; c < d; ++c) {
      const double p = double(x.q[size_t(i * d + c)]) * double(x.k[size_t(j * d + c)]);
      s += p;
      a += std::fabs(p);
    }
    ref[size_t(j)] = s;
    scale = std::max(scale, a);
  }
  const double tol = 3e-6 * d * scale;
  const int have = int(std::min<int64_t>(k, visible));
  std::vector<double> sorted = ref;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const double kth = have > 0 ? sorted[size_t(have - 1)] : 0;
  std::set<int> seen;
  for (int r = 0; r < k; ++r) {
    const int id = out.ids[size_t(i * k + r)];
    const float s = out.scores[size_t(i * k + r)];
    if (r >= have) {  // past the visible keys
      EXPECT_EQ(id, -1) << "rank " << r;
      EXPECT_TRUE(std::isinf(s) && s < 0) << "rank " << r << ": " << s;
      continue;
    }
    ASSERT_GE(id, 0) << "rank " << r;
    ASSERT_LT(id, visible) << "rank " << r;
    EXPECT_TRUE(seen.insert(id).second) << "id " << id << " twice";
    EXPECT_NEAR(double(s), ref[size_t(id)], tol) << "rank " << r << ", id " << id;
    EXPECT_GE(ref[size_t(id)], kth - 2 * tol) << "rank " << r << ", id " << id;
    if (r > 0) {
      const float prev = out.scores[size_t(i * k + r - 1)];
      EXPECT_GE(prev, s) << "rank " << r << ": not best first";
      if (prev == s) {
        EXPECT_LT(out.ids[size_t(i * k + r - 1)], id) << "rank " << r << ": a tie not by the lower row";
      }
    }
  }
  for (int64_t j = 0; j < visible; ++j)
    if (ref[size_t(j)] > kth + 2 * tol) {
      EXPECT_TRUE(seen.count(int(j))) << "key " << j << " missing";
    }
}

TEST(KnnEmu, EveryCoveredKernelIsRegisteredWithTheTextTheGeneratorEmitsNow) {
  const auto covered = emu_test::covered_knn_kernels();
  ASSERT_EQ(emu_test::knn_modules().size(), covered.size());
  for (const EmuKnnModule& m : emu_test::knn_modules()) {
    const cuda::GeneratedKnn g = cuda::generate_knn_kernel(m.params);
    EXPECT_EQ(m.name, g.name);
    EXPECT_EQ(m.text_hash, fnv1a64(g.source.data(), g.source.size())) << m.name << ": rebuild the emulation shards";
  }
}

// All keys visible: query counts that leave a block part-filled, key counts
// that leave the last tile part-filled (three full tiles before it: the next
// tile is staged while one is scored), fewer keys than k.
TEST(KnnEmu, TopKMatchesTheFloat64Reference) {
  for (const EmuKnnModule& m : emu_test::knn_modules()) {
    SCOPED_TRACE(m.name);
    const int k = m.params.k, tq = m.params.tile_queries;
    for (int64_t nk : {int64_t(3 * m.params.tile_keys + 7), int64_t(k) / 2 + 1}) {
      SCOPED_TRACE("nk " + std::to_string(nk));
      const KnnData x = make_data(m.params.head_dim, 2 * tq + 3, nk, uint32_t(11 + nk));
      const KnnOut out = run(m, x, nullptr);
      for (int64_t i = 0; i < x.nq; ++i) check_row(x, out, k, i, nk);
    }
  }
}

// Per-query limits (the causal build: query t sees rows <= t - offset): none
// visible, fewer than k, exactly k, all; limits beyond nk or below 0 clamp.
TEST(KnnEmu, LimitsRestrictEachQueryToItsVisibleKeys) {
  for (const EmuKnnModule& m : emu_test::knn_modules()) {
    SCOPED_TRACE(m.name);
    const int k = m.params.k;
    const int64_t nk = 150;
    const KnnData x = make_data(m.params.head_dim, m.params.tile_queries + 5, nk, 23);
    std::vector<int> limits(size_t(x.nq));
    for (int64_t i = 0; i < x.nq; ++i) limits[size_t(i)] = int((i * 37) % (nk + 1));
    limits[0] = 0;
    limits[1] = k;
    limits[2] = int(nk) + 40;
    limits[3] = -5;
    const KnnOut out = run(m, x, &limits);
    for (int64_t i = 0; i < x.nq; ++i)
      check_row(x, out, k, i, std::clamp<int64_t>(limits[size_t(i)], 0, nk));
  }
}

TEST(KnnKernel, CompilesWithNvrtcForTheBuildsShapes) {
  for (int d : {64, 128, 256})
    for (const char* arch : {"sm_80", "sm_90"}) {
      cuda::KnnKernelParams p = cuda::default_knn_params(d, 100);
      p.arch = arch;
      const cuda::GeneratedKnn g = cuda::generate_knn_kernel(p);
      cuda::CompileOptions o;
      o.arch = arch;
      const cuda::CompiledModule c = cuda::nvrtc_compile(g.name, g.source, o);
      EXPECT_NE(c.ptx.find(".entry " + g.name), std::string::npos) << g.name << " " << arch;
      EXPECT_FALSE(c.cubin.empty());
      EXPECT_LE(g.shared_bytes, size_t(227 * 1024)) << g.name;
    }
}

TEST(KnnKernel, BadParametersAreErrorsNamingThem) {
  auto message = [](cuda::KnnKernelParams p) {
    try {
      cuda::generate_knn_kernel(p);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::invalid_argument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  cuda::KnnKernelParams p;
  p.k = 0;
  EXPECT_NE(message(p).find("k must be in [1, 256], got 0"), std::string::npos);
  p = {};
  p.head_dim = 600;
  EXPECT_NE(message(p).find("head_dim must be in [1, 512]"), std::string::npos);
  p = {};
  p.threads = 96 + 1;
  EXPECT_NE(message(p).find("threads must be a multiple of 32"), std::string::npos);
  p = {};
  p.tile_queries = 12;  // 8 warps
  EXPECT_NE(message(p).find("tile_queries must be a multiple of threads / 32 = 8"), std::string::npos);
  p = {};
  p.tile_keys = 48;
  EXPECT_NE(message(p).find("tile_keys must be a multiple of 32 in [32, 256], got 48"), std::string::npos);
  p = {};
  p.tile_queries = 24;
  p.tile_keys = 32;  // 3 scores per thread
  EXPECT_NE(message(p).find("1, 2, 4, 8 or 16 scores per thread, got 24 x 32 / 256"), std::string::npos);
  p = {};
  p.tile_queries = 64;
  p.tile_keys = 128;  // 32 scores per thread
  EXPECT_NE(message(p).find("scores per thread"), std::string::npos);
  p = {};
  p.head_dim = 512;
  p.tile_queries = 8;
  p.tile_keys = 64;  // 128 key values per thread
  EXPECT_NE(message(p).find("128 key values staged per thread, more than 64"), std::string::npos);
  p = {};
  p.head_dim = 512;
  p.k = 256;
  p.tile_queries = 64;
  p.tile_keys = 32;
  EXPECT_NE(message(p).find("bytes of shared memory"), std::string::npos);
}

}  // namespace
}  // namespace rattn
