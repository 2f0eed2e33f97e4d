// The 8-bit traversal codes of the graph search (internal::ScalarCodes), with
// and without trailing 4-bit (coarse) dimensions, against a float64
// reference: every approximate inner product lies within the stated bound
// error_bound(q) (+ fp32 rounding of the final sums), the vectorised and
// portable paths agree bit for bit (integer sums), the row layout is the
// documented one, rows appended later are encoded with the fitted ranges, and
// bad use is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/index/distance.h"
#include "tests/runtime/index/test_util.h"

namespace rattn {
namespace {

using internal::ScalarCodes;

struct CodesCase {
  DType dtype;
  int dim;
  int coarse = 0;  // trailing 4-bit dimensions
};

// Bytes per row: fine codes padded to 16, 16 bytes per 32 coarse dims, then
// to whole cache lines.
int expected_stride(int d, int coarse) {
  const int bytes = coarse == 0 ? d : (d - coarse + 15) / 16 * 16 + 16 * ((coarse + 31) / 32);
  return (bytes + 63) / 64 * 64;
}

class DistanceCodesTest : public ::testing::TestWithParam<CodesCase> {};

// Keys with per-dimension spread from 0.05 to 5 and a shifted mean, so the
// per-dimension scales differ by two orders of magnitude.
std::vector<float> spread_rows(int64_t n, int d, uint64_t seed) {
  std::vector<float> v = testing::random_rows(n, d, seed);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) {
      float& x = v[size_t(i) * size_t(d) + size_t(j)];
      x = x * (0.05f + 5.0f * float(j % 7) / 6.0f) + 0.3f * float(j % 3);
    }
  return v;
}

TEST_P(DistanceCodesTest, ApproximateDotsWithinStatedBoundOfFloat64) {
  const auto [dtype, d, coarse] = GetParam();
  const int64_t n = 700;
  RowStore keys(dtype, d);
  keys.append_f32(spread_rows(n, d, 11).data(), n);
  ScalarCodes codes;
  codes.fit(keys.view(), n, coarse);
  ASSERT_EQ(codes.rows(), n);
  ASSERT_EQ(codes.coarse_dims(), coarse);
  ASSERT_EQ(codes.stride(), expected_stride(d, coarse));
  ScalarCodes portable = codes;
  portable.set_portable(true);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 37) % n);  // random-ish order
  const std::vector<float> queries = testing::random_rows(12, d, 99, 0.2f);
  std::vector<float> approx(static_cast<size_t>(n)), approx_portable(static_cast<size_t>(n)), row(static_cast<size_t>(d));
  double worst_ratio = 0;
  for (int qi = 0; qi < 12; ++qi) {
    const float* q = queries.data() + size_t(qi) * size_t(d);
    ScalarCodes::Query prepared;
    codes.prepare_query(q, &prepared);
    codes.dots(prepared, ids.data(), int(n), approx.data());
    portable.dots(prepared, ids.data(), int(n), approx_portable.data());
    const double bound = codes.error_bound(q, prepared);
    // fp32 rounding of bias, of float(acc), of the product and of the sum:
    // a few units in the last place of the magnitudes involved.
    double magnitude = 0;
    for (int j = 0; j < d; ++j)
      magnitude += std::fabs(double(q[j])) *
                   (std::fabs(double(codes.offset(j))) + (j < d - coarse ? 255.0 : 15.0) * double(codes.scale(j)));
    const double slack = 8.0 * std::ldexp(1.0, -24) * magnitude;
    for (int64_t i = 0; i < n; ++i) {
      keys.row_f32(ids[size_t(i)], row.data());  // the stored (fp16-rounded) key
      double exact = 0;
      for (int j = 0; j < d; ++j) exact += double(q[j]) * double(row[size_t(j)]);
      const double err = std::fabs(double(approx[size_t(i)]) - exact);
      ASSERT_LE(err, bound + slack) << "query " << qi << " key " << ids[size_t(i)];
      ASSERT_EQ(approx[size_t(i)], approx_portable[size_t(i)]) << "vectorised and portable paths differ";
      worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  // The bound is a worst case; the errors are real (not zero) and below it.
  EXPECT_GT(worst_ratio, 0.01);
  EXPECT_LE(worst_ratio, 1.0 + 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Dims, DistanceCodesTest,
                         ::testing::Values(CodesCase{DType::f32, 128}, CodesCase{DType::f16, 128},
                                           CodesCase{DType::f32, 64}, CodesCase{DType::f32, 100},
                                           CodesCase{DType::f16, 200}, CodesCase{DType::f32, 7},
                                           // coarse: 48 + 32 (one line, the fixed kernel), other shapes
                                           CodesCase{DType::f32, 80, 32}, CodesCase{DType::f16, 80, 32},
                                           CodesCase{DType::f32, 128, 32}, CodesCase{DType::f32, 100, 37},
                                           CodesCase{DType::f32, 7, 7}, CodesCase{DType::f16, 256, 64},
                                           CodesCase{DType::f32, 300}),  // int64 sums
                         [](const ::testing::TestParamInfo<CodesCase>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_d" + std::to_string(info.param.dim) +
                                  (info.param.coarse > 0 ? "_coarse" + std::to_string(info.param.coarse) : "");
                         });

TEST(DistanceCodes, CoarseDimsPackTwoPerByteAfterTheFineCodes) {
  // d = 40 with 32 coarse: 8 fine codes padded to 16 bytes, then one block of
  // 16 bytes holding coarse dims b (low nibble) and 16 + b (high nibble).
  const int d = 40, coarse = 32, fine = d - coarse;
  std::vector<float> rows(size_t(3) * d, 0.0f);
  for (int j = 0; j < d; ++j) {
    rows[size_t(j)] = 0.0f;                  // row 0: every dimension at its minimum
    rows[size_t(d + j)] = 1.0f;              // row 1: at its maximum
    rows[size_t(2 * d + j)] = j % 2 ? 1.0f : 0.0f;  // row 2: alternating
  }
  RowStore keys(DType::f32, d);
  keys.append_f32(rows.data(), 3);
  ScalarCodes codes;
  codes.fit(keys.view(), 3, coarse);
  ASSERT_EQ(codes.stride(), 64);
  for (int j = 0; j < fine; ++j) {
    EXPECT_EQ(codes.row(0)[j], 0);
    EXPECT_EQ(codes.row(1)[j], 255);
    EXPECT_FLOAT_EQ(codes.scale(j), 1.0f / 255.0f);
  }
  for (int j = fine; j < 16; ++j) EXPECT_EQ(codes.row(1)[j], 0) << "padding";
  for (int b = 0; b < 16; ++b) {
    EXPECT_EQ(codes.row(0)[16 + b], 0x00);
    EXPECT_EQ(codes.row(1)[16 + b], 0xFF);
    // coarse dim k is dimension fine + k: odd dimensions are 1 (code 15), even 0.
    const int lo = (fine + b) % 2 ? 15 : 0, hi = (fine + 16 + b) % 2 ? 15 : 0;
    EXPECT_EQ(codes.row(2)[16 + b], uint8_t(lo | hi << 4)) << "byte " << b;
  }
  for (int j = fine; j < d; ++j) EXPECT_FLOAT_EQ(codes.scale(j), 1.0f / 15.0f);
  for (int j = 32; j < 64; ++j) EXPECT_EQ(codes.row(1)[j], 0) << "padding";
  // A later row far outside the range saturates at 255 / 15.
  std::vector<float> far(static_cast<size_t>(d), 1e6f);
  keys.append_f32(far.data(), 1);
  codes.append(keys.view(), keys.rows());
  EXPECT_EQ(codes.row(3)[0], 255);
  EXPECT_EQ(codes.row(3)[16], 0xFF);
  // The inner product of row 1 (all ones) is exact: sum of the query.
  const std::vector<float> q = testing::random_rows(1, d, 5);
  ScalarCodes::Query prepared;
  codes.prepare_query(q.data(), &prepared);
  const int32_t id = 1;
  float s = 0;
  codes.dots(prepared, &id, 1, &s);
  double sum = 0;
  for (float x : q) sum += x;
  EXPECT_NEAR(s, sum, codes.error_bound(q.data(), prepared) + 1e-5);
}

TEST(DistanceCodes, AppendedRowsUseTheFittedRanges) {
  const int d = 48;
  const std::vector<float> rows = spread_rows(300, d, 3);
  RowStore keys(DType::f32, d);
  keys.append_f32(rows.data(), 300);
  ScalarCodes codes;
  codes.fit(keys.view(), 200);
  EXPECT_EQ(codes.rows(), 200);
  // Rows 200..299 come later (inserted keys); row 300 repeats row 5 and row
  // 301 lies far outside the fitted range (clamped, still finite).
  keys.append_f32(rows.data() + 5 * d, 1);
  std::vector<float> far(static_cast<size_t>(d), 1e6f);
  keys.append_f32(far.data(), 1);
  codes.append(keys.view(), keys.rows());
  ASSERT_EQ(codes.rows(), 302);
  for (int j = 0; j < d; ++j) EXPECT_EQ(codes.row(300)[j], codes.row(5)[j]);
  for (int j = 0; j < d; ++j) EXPECT_EQ(codes.row(301)[j], 255);
  ScalarCodes::Query prepared;
  const std::vector<float> q = testing::random_rows(1, d, 8);
  codes.prepare_query(q.data(), &prepared);
  const int32_t id = 301;
  float s = 0;
  codes.dots(prepared, &id, 1, &s);
  EXPECT_TRUE(std::isfinite(s));
}

TEST(DistanceCodes, ConstantDimensionsAndZeroQueryAreExactish) {
  // A dimension with one value has scale 0 (its offset carries it exactly);
  // an all-zero query gives 0.
  const int d = 64;
  std::vector<float> rows = testing::random_rows(50, d, 4);
  for (int64_t i = 0; i < 50; ++i) rows[size_t(i) * d + 3] = 2.5f;
  RowStore keys(DType::f32, d);
  keys.append_f32(rows.data(), 50);
  ScalarCodes codes;
  codes.fit(keys.view(), 50);
  EXPECT_EQ(codes.scale(3), 0.0f);
  EXPECT_EQ(codes.offset(3), 2.5f);
  std::vector<float> q(static_cast<size_t>(d), 0.0f);
  ScalarCodes::Query prepared;
  codes.prepare_query(q.data(), &prepared);
  const int32_t id = 7;
  float s = 1;
  codes.dots(prepared, &id, 1, &s);
  EXPECT_EQ(s, 0.0f);
  q[3] = 1.0f;  // only the constant dimension
  codes.prepare_query(q.data(), &prepared);
  codes.dots(prepared, &id, 1, &s);
  EXPECT_FLOAT_EQ(s, 2.5f);
}

TEST(DistanceCodes, WideRowsSumWithoutOverflow) {
  // 300 dimensions at the top code with a query at the top qi everywhere:
  // 32767 * 255 * 300 exceeds int32 (such rows take int64 sums).
  for (const int d : {257, 300}) {
    std::vector<float> rows(size_t(2) * size_t(d), 0.0f);
    std::fill(rows.begin() + d, rows.end(), 1.0f);  // row 0 all 0, row 1 all 1
    RowStore keys(DType::f32, d);
    keys.append_f32(rows.data(), 2);
    ScalarCodes codes;
    codes.fit(keys.view(), 2);
    const std::vector<float> q(static_cast<size_t>(d), 1.0f);
    ScalarCodes::Query prepared;
    codes.prepare_query(q.data(), &prepared);
    const int32_t id = 1;
    float s = 0;
    codes.dots(prepared, &id, 1, &s);
    EXPECT_NEAR(s, double(d), 1e-3 * d) << d;
    ScalarCodes portable = codes;
    portable.set_portable(true);
    float sp = 0;
    portable.dots(prepared, &id, 1, &sp);
    EXPECT_EQ(s, sp) << d;
  }
}

TEST(DistanceCodes, BadUseRejected) {
  RowStore keys(DType::f32, 16);
  const std::vector<float> rows = testing::random_rows(10, 16, 1);
  keys.append_f32(rows.data(), 10);
  ScalarCodes codes;
  EXPECT_THROW(codes.append(keys.view(), 10), Error);  // not fitted
  EXPECT_THROW(codes.fit(keys.view(), 11), Error);     // more rows than the store
  codes.fit(keys.view(), 5);
  EXPECT_THROW(codes.append(keys.view(), 11), Error);
  RowStore other(DType::f32, 8);
  other.append_f32(rows.data(), 10);
  EXPECT_THROW(codes.append(other.view(), 10), Error);  // other dimension
  EXPECT_THROW(codes.fit(keys.view(), 5, -1), Error);  // coarse dims outside [0, dim]
  EXPECT_THROW(codes.fit(keys.view(), 5, 17), Error);
  RowStore wide(DType::f32, 300);  // int32 sums would overflow: 299 fine dims
  wide.append_f32(testing::random_rows(2, 300, 1).data(), 2);
  EXPECT_THROW(codes.fit(wide.view(), 2, 1), Error);
  codes.fit(wide.view(), 2, 64);  // 236 fine dims: fine
  EXPECT_EQ(codes.coarse_dims(), 64);
}

}  // namespace
}  // namespace rattn
