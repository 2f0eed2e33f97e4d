#pragma once
// Row-major K or V storage for one KV head: rows of `dim` elements in `dtype`.
// Shared by the query heads of a GQA group (one copy of keys/values per KV head).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/byte_region.h"

namespace rattn {

// Non-owning view of rows; what kernels and the index read.
struct RowsView {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int dim = 0;
  const void* row(int64_t i) const {
    return static_cast<const uint8_t*>(data) + size_t(i) * size_t(dim) * dtype_size(dtype);
  }
};

namespace internal {
// A vector's allocator for row storage that does not grow (alloc_row_storage).
template <class T>
struct RowStorageAllocator {
  using value_type = T;
  RowStorageAllocator() = default;
  template <class U>
  RowStorageAllocator(const RowStorageAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(alloc_row_storage(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { free_row_storage(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const RowStorageAllocator<U>&) const { return true; }
};
}  // namespace internal

class RowStore {
 public:
  RowStore() = default;
  RowStore(DType dtype, int dim) : dtype_(dtype), dim_(dim) {}
  DType dtype() const { return dtype_; }
  int dim() const { return dim_; }
  int64_t rows() const { return rows_; }
  // Appends n rows given as fp32 (converted to the storage dtype).
  void append_f32(const float* src, int64_t n);
  // Appends n rows already in the storage dtype.
  void append_raw(const void* src, int64_t n);
  void reserve(int64_t n) { bytes_.reserve(size_t(n) * row_bytes()); }
  size_t row_bytes() const { return size_t(dim_) * dtype_size(dtype_); }
  size_t memory_bytes() const { return bytes_.capacity(); }
  const void* row(int64_t i) const { return bytes_.data() + size_t(i) * row_bytes(); }
  RowsView view() const { return {bytes_.data(), dtype_, rows_, dim_}; }
  // Row i as fp32.
  void row_f32(int64_t i, float* out) const;

 private:
  DType dtype_ = DType::f32;
  int dim_ = 0;
  int64_t rows_ = 0;
  // Grows in place: a decode step's append never copies the store.
  internal::ByteRegion bytes_;
};

}  // namespace rattn
