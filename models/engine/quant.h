#pragma once
// Dequantisation of ggml block formats to fp32. Layouts (ggml's public
// format): values are grouped in blocks; each block stores its scale(s) and
// packed integer codes.
//   Q8_0: 32 values; f16 d; int8 q[32];                      x = d * q
//   Q4_0: 32 values; f16 d; 16 bytes of nibbles;              x = d * (q - 8)
//   Q5_0: 32 values; f16 d; u32 high bits; 16 bytes nibbles;  x = d * (q - 16)
//   Q4_K: 256 values; f16 d, f16 dmin, 12 bytes of packed 6-bit (scale, min)
//         for 8 sub-blocks of 32; 128 bytes of nibbles;       x = d*sc*q - dmin*m
//   Q6_K: 256 values; 128 bytes low nibbles, 64 bytes of 2-bit high parts,
//         int8 scales[16] (one per 16 values), f16 d;        x = d * sc * (q - 32)
#include <cstddef>
#include <cstdint>

namespace rattn::engine {

// Dequantises n values (a multiple of the type's block size) of ggml type
// `type` from `src` into `dst`. Throws Error(unsupported) for other types.
void dequantize(uint32_t type, const void* src, float* dst, int64_t n);

}  // namespace rattn::engine
