#include "core/finite.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace rattn {
namespace {

// Smallest |bits| (sign cleared) of a `src_t` value that is refused for
// `store_t`: 2^40, or the first finite source value that rounds to Inf in the
// storage dtype, whichever is lower. Inf and NaN patterns lie above both.
uint32_t refused_from(DType src_t, DType store_t) {
  switch (src_t) {
    case DType::f32:
      if (store_t == DType::f16) return 0x477ff000u;  // 65520 rounds to fp16 Inf
      return 0x53800000u;                             // 2^40
    case DType::f16:
      return 0x7c00u;  // every finite fp16 is below 2^40 and fits fp32 and bf16
    case DType::bf16:
      if (store_t == DType::f16) return 0x4780u;  // 65536; 0x477f is 65280
      return 0x5380u;                             // 2^40
  }
  return 0;
}

template <typename Bits>
int64_t first_at_or_above(const Bits* x, size_t n, Bits mask, Bits limit) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t e = std::min(n, b + kBlock);
    Bits worst = 0;
    for (size_t i = b; i < e; ++i) worst = std::max<Bits>(worst, Bits(x[i] & mask));
    if (worst < limit) continue;
    for (size_t i = b; i < e; ++i)
      if (Bits(x[i] & mask) >= limit) return int64_t(i);
  }
  return -1;
}

}  // namespace

int64_t first_out_of_range(DType src_t, const void* src, size_t n, DType store_t) {
  const uint32_t limit = refused_from(src_t, store_t);
  if (src_t == DType::f32)
    return first_at_or_above(static_cast<const uint32_t*>(src), n, uint32_t(0x7fffffffu), limit);
  return first_at_or_above(static_cast<const uint16_t*>(src), n, uint16_t(0x7fffu), uint16_t(limit));
}

float value_at(DType src_t, const void* src, size_t i) {
  float x = 0;
  to_f32(src_t, static_cast<const uint8_t*>(src) + i * dtype_size(src_t), &x, 1);
  return x;
}

std::string describe_out_of_range(DType src_t, const void* src, size_t i, DType store_t) {
  const float x = value_at(src_t, src, i);
  if (std::isnan(x)) return "value nan";
  if (std::isinf(x)) return x > 0 ? "value inf" : "value -inf";
  char buf[160];
  if (store_t == DType::f16 && std::fabs(x) >= 65520.0f)
    std::snprintf(buf, sizeof buf, "value %g overflows the f16 storage (largest finite 65504)", double(x));
  else
    std::snprintf(buf, sizeof buf, "value %g exceeds rattn's input range (|x| < 2^40)", double(x));
  return buf;
}

}  // namespace rattn
