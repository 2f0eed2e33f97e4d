#include "kernels/kv_store.h"

#include <cstring>

namespace rattn {

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
