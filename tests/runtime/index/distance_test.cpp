// The index's inner-product paths (vectorised and portable loops, random rows
// and scans, prefetched batches, dot_row, the CpuKernels adapter) against a
// float64 reference, for fp32 and fp16 keys and several head dims (odd ones
// exercise the tails).
//
// Tolerance: any order of fp32 multiply-adds of d terms satisfies
// |computed - exact| <= gamma_d * sum_j |q_j k_j|, gamma_d = d u / (1 - d u),
// u = 2^-24 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
// The fp16 keys are converted exactly, so the same bound holds against the
// float64 product of the stored (rounded) values.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "runtime/index/distance.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using internal::Distance;

struct Case {
  DType dtype;
  int dim;
};

void PrintTo(const Case& c, std::ostream* os) { *os << dtype_name(c.dtype) << " d=" << c.dim; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.dtype)) + "_d" + std::to_string(info.param.dim);
}

class DistanceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case c = GetParam();
    store_ = RowStore(c.dtype, c.dim);
    // Mean 0.5: scores far from zero, so the bound is not trivially loose.
    const auto rows = testing::random_rows(kRows, c.dim, 11, 0.5f);
    store_.append_f32(rows.data(), kRows);
    query_ = testing::random_rows(1, c.dim, 12, 0.25f);
    exact_.resize(kRows);
    bound_.resize(kRows);
    std::vector<float> row(size_t(c.dim));
    const double u = std::ldexp(1.0, -24), gamma = c.dim * u / (1 - c.dim * u);
    for (int64_t i = 0; i < kRows; ++i) {
      store_.row_f32(i, row.data());
      double s = 0, a = 0;
      for (int j = 0; j < c.dim; ++j) {
        const double p = double(query_[size_t(j)]) * double(row[size_t(j)]);
        s += p;
        a += std::abs(p);
      }
      exact_[size_t(i)] = s;
      bound_[size_t(i)] = gamma * a;
    }
  }

  // Scores ids through `dist` and checks each; `prefetched`: the caller
  // requests the whole batch first, as the graph search does.
  void check(const Distance& dist, const std::vector<int32_t>& ids, bool prefetched, const std::string& what) {
    std::vector<float> got(ids.size(), std::nanf(""));
    const RowsView keys = store_.view();
    if (prefetched)
      for (int32_t id : ids) internal::prefetch_row(keys, id);
    dist.dots(query_.data(), keys, ids.data(), int(ids.size()), got.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t r = size_t(ids[i]);
      ASSERT_LE(std::abs(double(got[i]) - exact_[r]), bound_[r])
          << what << " (" << dist.name() << "): row " << r << " of " << ids.size() << ", got " << got[i]
          << ", float64 " << exact_[r];
    }
  }

  // Every path of `dist` over the id patterns the callers produce.
  void check_all(const Distance& dist) {
    std::vector<int32_t> scan(kRows);  // the flat scan: one consecutive run
    for (int i = 0; i < kRows; ++i) scan[size_t(i)] = i;
    check(dist, scan, false, "scan from 0");
    check(dist, std::vector<int32_t>(scan.begin() + 17, scan.begin() + 17 + 100), false, "scan from 17");
    // Graph batches: random order, duplicates, and near-runs that must not be
    // taken for a scan (first and last ids n - 1 apart, middle shuffled).
    std::vector<int32_t> walk;
    for (int i = 0; i < 97; ++i) walk.push_back(int32_t((i * 7919 + 13) % kRows));
    walk.push_back(walk.front());
    check(dist, walk, false, "random rows");
    check(dist, walk, true, "random rows, prefetched");
    check(dist, {40, 42, 41, 43}, false, "near-run");
    check(dist, {40, 41, 42, 44}, false, "broken run");
    check(dist, {5}, false, "one row");
    check(dist, {}, false, "no rows");
  }

  static constexpr int kRows = 300;
  RowStore store_;
  std::vector<float> query_;
  std::vector<double> exact_, bound_;
};

TEST_P(DistanceTest, BuiltinMatchesFloat64) { check_all(*internal::make_distance(nullptr)); }

TEST_P(DistanceTest, PortableMatchesFloat64) { check_all(*internal::make_portable_distance()); }

TEST_P(DistanceTest, DotRowMatchesFloat64) {
  const RowsView keys = store_.view();
  for (int64_t r = 0; r < kRows; ++r) {
    const double got = internal::dot_row(query_.data(), keys, r);
    ASSERT_LE(std::abs(got - exact_[size_t(r)]), bound_[size_t(r)]) << "row " << r;
  }
}

TEST_P(DistanceTest, KernelsAdapterMatchesFloat64) {
  KernelSpec spec;
  spec.head_dim = GetParam().dim;
  spec.kv_dtype = GetParam().dtype;
  check_all(*internal::make_distance(make_reference_kernels(spec)));
}

INSTANTIATE_TEST_SUITE_P(Dims, DistanceTest,
                         ::testing::Values(Case{DType::f32, 64}, Case{DType::f32, 128}, Case{DType::f32, 256},
                                           Case{DType::f32, 1}, Case{DType::f32, 37}, Case{DType::f32, 129},
                                           Case{DType::f16, 64}, Case{DType::f16, 128}, Case{DType::f16, 256},
                                           Case{DType::f16, 7}, Case{DType::f16, 37}, Case{DType::f16, 129},
                                           Case{DType::bf16, 64}, Case{DType::bf16, 256}, Case{DType::bf16, 7},
                                           Case{DType::bf16, 37}, Case{DType::bf16, 129}),
                         case_name);

}  // namespace
}  // namespace rattn
