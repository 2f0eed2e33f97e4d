#pragma once
// Bytes that grow in place. From 2 MiB up they live in a virtual reservation
// four times the size asked for (address space only: no memory is charged
// until a part is committed, and no page is resident until written); growing
// commits more of it, so nothing is copied. A std::vector copies its whole
// buffer when it grows, and every page of the copy faults: a decode step that
// appended a row to a 32 MiB K and V store paid 122-130 ms for it on a VM.
// Past the reservation the bytes move once, into one four times as large.
// Large regions are in transparent huge pages where the kernel allows;
// smaller ones are on the heap (64-byte aligned).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace rattn::internal {

// Row storage from 2 MiB up lives in transparent huge pages where the kernel
// allows it (madvise before the first touch): index searches, insertions and
// the top-k attention read random rows, and with 4 KiB pages nearly every one
// of them also misses the TLB. Smaller blocks: plain 64-byte aligned memory.
void* alloc_row_storage(size_t bytes);
void free_row_storage(void* p, size_t bytes);

class ByteRegion {
 public:
  ByteRegion() = default;
  ByteRegion(const ByteRegion& other);  // copies the used bytes
  ByteRegion& operator=(const ByteRegion& other);
  ByteRegion(ByteRegion&& other) noexcept;
  ByteRegion& operator=(ByteRegion&& other) noexcept;
  ~ByteRegion();

  uint8_t* data() { return base_; }
  const uint8_t* data() const { return base_; }
  size_t size() const { return size_; }
  // Bytes asked for (reserve, or extend's growth): what a memory report
  // counts, as a std::vector's capacity. The rest of the last 2 MiB step
  // committed is never written, so never resident.
  size_t capacity() const { return capacity_; }
  // Room for `bytes` without moving the data again (on the heap exactly, as
  // std::vector::reserve; a reservation commits in 2 MiB steps).
  void reserve(size_t bytes);
  // Grows (new bytes uninitialised; on the heap at least doubling the room)
  // or shrinks to `bytes`; returns the first new byte.
  uint8_t* extend(size_t bytes);
  void swap(ByteRegion& other) noexcept;

 private:
  void release() noexcept;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  size_t committed_ = 0;  // readable and writable from base_ (>= capacity_)
  size_t reserved_ = 0;   // address space from base_ (mapped regions only)
};

// An array of trivially copyable elements in a ByteRegion (a vector's
// subset): a graph's adjacency arena grows a node at a time without copying.
template <class T>
class RegionArray {
  static_assert(std::is_trivially_copyable_v<T>, "RegionArray copies its elements as bytes");

 public:
  T* data() { return reinterpret_cast<T*>(bytes_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(bytes_.data()); }
  size_t size() const { return bytes_.size() / sizeof(T); }
  bool empty() const { return bytes_.size() == 0; }
  size_t capacity() const { return bytes_.capacity() / sizeof(T); }
  void reserve(size_t n) { bytes_.reserve(n * sizeof(T)); }
  void resize(size_t n, const T& value = T()) {
    const size_t old = size();
    bytes_.extend(n * sizeof(T));
    if (n > old) std::fill(data() + old, data() + n, value);
  }
  // Resizes with the new elements uninitialised, for a caller that writes
  // them all next (a loaded image).
  void resize_for_overwrite(size_t n) { bytes_.extend(n * sizeof(T)); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

 private:
  ByteRegion bytes_;
};

}  // namespace rattn::internal
