// The index build never trusts its data to be finite: NaN or Inf in the keys
// or the training queries (one value, or all of them) is an invalid_argument
// naming the row, never an out-of-bounds write (this test also runs under
// ASan + UBSan). A finite build of the same data still works afterwards.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/projected_graph.h"

namespace rattn {
namespace {

constexpr int kDim = 32;
constexpr int64_t kKeys = 3000;

GraphBuildParams params() {
  GraphBuildParams p;
  p.degree = 8;
  p.query_neighbors = 16;
  p.build_queue = 32;
  return p;
}

std::string build_error(const std::vector<float>& keys, const std::vector<float>& queries) {
  try {
    build_projected_graph(RowsView{keys.data(), DType::f32, kKeys, kDim}, queries.data(),
                          int64_t(queries.size() / kDim), params());
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::invalid_argument) << e.what();
    return e.what();
  }
  return "";
}

TEST(IndexBadData, NonFiniteKeysOrQueriesAreRefusedByRow) {
  SyntheticSpec spec;
  spec.tokens = kKeys;
  spec.head_dim = kDim;
  spec.group = 1;
  spec.seed = 3;
  const SyntheticHead head = make_synthetic(spec);
  const std::vector<float> keys(head.keys.begin(), head.keys.begin() + kKeys * kDim);
  const std::vector<float> queries(head.queries.begin(), head.queries.begin() + kKeys * kDim);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();

  auto k1 = keys;
  k1[size_t(1234) * kDim + 5] = nan;
  EXPECT_NE(build_error(k1, queries).find("key 1234, element 5: value nan"), std::string::npos);
  auto k_all = keys;
  std::fill(k_all.begin(), k_all.end(), nan);
  EXPECT_NE(build_error(k_all, queries).find("key 0, element 0: value nan"), std::string::npos);
  auto q1 = queries;
  q1[size_t(77) * kDim] = -inf;
  EXPECT_NE(build_error(keys, q1).find("training query 77, element 0: value -inf"), std::string::npos);
  auto q_all = queries;
  std::fill(q_all.begin(), q_all.end(), nan);
  EXPECT_NE(build_error(keys, q_all).find("training query 0"), std::string::npos);
  // Finite but so large that scores would overflow fp32.
  auto k_big = keys;
  k_big[3] = 3e38f;
  EXPECT_NE(build_error(k_big, queries).find("exceeds rattn's input range"), std::string::npos);

  const auto g = build_projected_graph(RowsView{keys.data(), DType::f32, kKeys, kDim}, queries.data(), kKeys, params());
  EXPECT_EQ(g->size(), kKeys);
}

}  // namespace
}  // namespace rattn
