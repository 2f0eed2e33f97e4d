#pragma once
// Range checks of the float data handed to rattn. A value is accepted when it
// is finite, |x| < 2^40 (so no score q.k over up to 2^10 dimensions can
// overflow fp32: 2^40 * 2^40 * 2^10 < 2^127; real activations are far
// smaller), and it stays finite when rounded to the storage dtype (fp16 tops
// out at 65504).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace rattn {

// Largest magnitude rattn accepts in q, k or v: 2^40 (about 1.1e12).
constexpr double kMaxInputMagnitude = 1099511627776.0;

// Index of the first of src[0, n) (stored as `src_t`) that is refused for
// storage in `store_t`, or -1 when every value is accepted. One branch-free
// max-reduction over the bits per block (vectorised), a second pass over a
// block only when it holds a refused value.
int64_t first_out_of_range(DType src_t, const void* src, size_t n, DType store_t);

// Values kept in fp32 (queries, calibration data): store_t = f32.
inline int64_t first_out_of_range(const float* src, size_t n) {
  return first_out_of_range(DType::f32, src, n, DType::f32);
}

// The value at src[i] as fp32, for messages.
float value_at(DType src_t, const void* src, size_t i);

// Why src[i] was refused: "value nan", "value inf", "value 1e+30 overflows the
// f16 storage (largest finite 65504)" or "value 2e+15 exceeds rattn's input
// range (|x| < 2^40)".
std::string describe_out_of_range(DType src_t, const void* src, size_t i, DType store_t);

}  // namespace rattn
