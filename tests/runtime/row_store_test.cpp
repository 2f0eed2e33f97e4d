// The CPU store of offloaded rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/kv_store.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::random_normal;

// The CPU store's rows survive its growth from small blocks (64-byte
// aligned) into huge-page-sized ones (2 MiB aligned, madvise'd): every row
// reads back as written, through appends of every size.
TEST(RowStore, RowsSurviveGrowthAcrossTheHugePageThreshold) {
  const int d = 128;
  rattn::RowStore store(rattn::DType::f16, d);
  const int64_t total = 9000;  // 2.3 MB of fp16 rows
  const std::vector<float> src = random_normal(size_t(total) * d, 77);
  int64_t rows = 0;
  for (int64_t n = 1; rows < total; n = n * 3 % 1031 + 1) {
    const int64_t take = std::min(n, total - rows);
    store.append_f32(src.data() + size_t(rows) * d, take);
    rows += take;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(store.row(0)) % 64, 0u);
  }
  ASSERT_EQ(store.rows(), total);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(store.row(0)) % (uintptr_t(2) << 20), 0u);
  EXPECT_GE(store.memory_bytes(), size_t(total) * store.row_bytes());
  std::vector<float> row(d);
  for (int64_t i = 0; i < total; ++i) {
    store.row_f32(i, row.data());
    for (int j = 0; j < d; ++j)
      ASSERT_EQ(row[size_t(j)], rattn::f16_to_f32(rattn::f32_to_f16(src[size_t(i) * d + size_t(j)]))) << i << " " << j;
  }
  // Raw appends of a store's own rows, and a reserve, keep them too.
  rattn::RowStore copy(rattn::DType::f16, d);
  copy.reserve(total);
  copy.append_raw(store.row(0), total);
  EXPECT_EQ(std::memcmp(copy.row(0), store.row(0), size_t(total) * store.row_bytes()), 0);
}

}  // namespace
