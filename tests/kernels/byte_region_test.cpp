// ByteRegion (the row stores' bytes): growth in place, moves past the
// reservation, copies, zero fill, and RowStore rows across its growth.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/byte_region.h"
#include "kernels/kv_store.h"

namespace {

using rattn::internal::ByteRegion;

constexpr size_t kMiB = size_t(1) << 20;

// Byte i of a pattern that differs between neighbouring bytes and pages.
uint8_t pattern(size_t i) { return uint8_t((i * 2654435761u) >> 13); }

template <class Bytes>  // a ByteRegion or a RegionArray<uint8_t>
void fill(Bytes& r, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i) r.data()[i] = pattern(i);
}

template <class Bytes>
bool holds_pattern(const Bytes& r, size_t to) {
  for (size_t i = 0; i < to; ++i)
    if (r.data()[i] != pattern(i)) return false;
  return true;
}

TEST(ByteRegion, LargeRegionsGrowInPlaceUpToFourTimesTheirFirstSize) {
  ByteRegion r;
  r.reserve(8 * kMiB);
  const uint8_t* first = r.data();
  EXPECT_EQ(r.capacity(), 8 * kMiB);
  r.reserve(5 * kMiB + 3);
  EXPECT_EQ(r.capacity(), 8 * kMiB) << "never shrinks";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % (2 * kMiB), 0u) << "huge-page aligned";
  size_t used = 0;
  while (used + 300 <= 32 * kMiB) {  // row-sized appends, as a store takes them
    const size_t next = used + 300;
    uint8_t* at = r.extend(next);
    EXPECT_EQ(at, r.data() + used);
    fill(r, used, next);
    used = next;
  }
  EXPECT_EQ(r.data(), first) << "moved within its reservation";
  EXPECT_EQ(r.capacity(), used) << "counts what was asked for, not the 2 MiB steps committed";
  EXPECT_TRUE(holds_pattern(r, used));
  // Past the reservation: one move, the bytes kept.
  r.extend(32 * kMiB + 1);
  EXPECT_NE(r.data(), first);
  EXPECT_EQ(r.size(), 32 * kMiB + 1);
  EXPECT_TRUE(holds_pattern(r, used));
}

TEST(ByteRegion, SmallRegionsCopiesMovesAndZeroFill) {
  rattn::internal::RegionArray<uint8_t> z;
  z.resize(1000);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(z[i], 0) << i;
  fill(z, 0, 1000);
  z.resize(500);
  z.resize(3 * kMiB);  // from the heap into a reservation
  EXPECT_TRUE(holds_pattern(z, 500));
  for (size_t i = 500; i < 3 * kMiB; i += 4093) ASSERT_EQ(z[i], 0) << i;
  ByteRegion r;
  r.extend(1000);
  fill(r, 0, 1000);
  r.extend(3 * kMiB);  // from the heap into a reservation: the first bytes kept
  EXPECT_TRUE(holds_pattern(r, 1000));
  fill(r, 0, r.size());
  ByteRegion copy(r);
  EXPECT_NE(copy.data(), r.data());
  EXPECT_EQ(copy.size(), r.size());
  EXPECT_TRUE(holds_pattern(copy, copy.size()));
  ByteRegion moved(std::move(copy));
  EXPECT_EQ(copy.data(), nullptr);
  EXPECT_EQ(copy.size(), 0u);
  EXPECT_TRUE(holds_pattern(moved, moved.size()));
  ByteRegion assigned;
  assigned.extend(10);
  assigned = moved;
  EXPECT_TRUE(holds_pattern(assigned, assigned.size()));
  assigned = ByteRegion();
  EXPECT_EQ(assigned.size(), 0u);
  EXPECT_EQ(assigned.capacity(), 0u);
}

TEST(ByteRegion, RowStoreRowsSurviveGrowthAndCopies) {
  const int d = 64;
  rattn::RowStore store(rattn::DType::f16, d);
  store.reserve(20000);  // 2.4 MiB: a reservation
  const void* first = store.row(0);
  std::vector<float> row(d), back(d);
  for (int64_t r = 0; r < 90000; ++r) {  // past four times the reserve: one move
    for (int j = 0; j < d; ++j) row[size_t(j)] = float((r * 7 + j) % 1000) * 0.25f;
    store.append_f32(row.data(), 1);
    if (r == 70000) {
      EXPECT_EQ(store.row(0), first) << "in place while within the reservation";
    }
  }
  const rattn::RowStore copy = store;
  for (int64_t r = 0; r < 90000; r += 997) {
    copy.row_f32(r, back.data());
    for (int j = 0; j < d; ++j) ASSERT_EQ(back[size_t(j)], float((r * 7 + j) % 1000) * 0.25f) << r << " " << j;
  }
  EXPECT_EQ(copy.rows(), 90000);
  EXPECT_GE(store.memory_bytes(), size_t(90000) * d * 2);
}

}  // namespace
