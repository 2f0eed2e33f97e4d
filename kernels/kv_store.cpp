#include "kernels/kv_store.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace rattn {

namespace internal {
namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

void* alloc_row_storage(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = ::operator new(rounded, std::align_val_t(align));
#ifdef MADV_HUGEPAGE
  // A refusal (THP off) only costs TLB misses.
  if (align == kHugePage) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void free_row_storage(void* p, size_t bytes) {
  if (bytes == 0) bytes = 1;
  ::operator delete(p, std::align_val_t(bytes >= kHugePage ? kHugePage : 64));
}
}  // namespace internal

void RowStore::append_f32(const float* src, int64_t n) {
  uint8_t* dst = bytes_.extend(bytes_.size() + size_t(n) * row_bytes());
  from_f32(dtype_, src, dst, size_t(n) * size_t(dim_));
  rows_ += n;
}

void RowStore::append_raw(const void* src, int64_t n) {
  uint8_t* dst = bytes_.extend(bytes_.size() + size_t(n) * row_bytes());
  std::memcpy(dst, src, size_t(n) * row_bytes());
  rows_ += n;
}

void RowStore::row_f32(int64_t i, float* out) const { to_f32(dtype_, row(i), out, size_t(dim_)); }

}  // namespace rattn
