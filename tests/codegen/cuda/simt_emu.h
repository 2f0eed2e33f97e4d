#pragma once
// Host SIMT emulation: enough of CUDA for the generator's exact emitted text to
// compile with a host C++ compiler and run on the CPU, so kernels are checked
// numerically without a GPU.
//  - a block's threads are fibers (Boost.Context) run by a round-robin scheduler
//    on one OS thread; __syncthreads / __syncwarp are barriers that yield;
//  - warp shuffles exchange values through a per-warp double-buffered slot
//    array with one warp barrier per shuffle (so every lane of the warp must
//    take part, as the __*_sync intrinsics require with a full mask);
//  - a grid launch is a loop over blocks; dynamic shared memory is one static
//    arena (filled with 0xff bytes = NaN before each block so reads of
//    unwritten shared memory show up);
//  - __ballot_sync built from the same exchanges;
//  - __half / __nv_bfloat16, the bit-cast and math intrinsics the kernels use.
// Emulation-only branches are selected by the absence of __CUDA_ARCH__ (the
// cp.async path compiles only on the device). Deadlocks (a barrier some thread
// never reaches) throw std::runtime_error instead of hanging.
#include <math.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

#include "core/dtype.h"

#define RATTN_SIMT_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __restrict__ __restrict
#define __launch_bounds__(...)

struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

#include "tests/codegen/cuda/simt_emu_launch.h"

namespace rattn::emu {

template <typename T>
T shuffle_from(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, src);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace rattn::emu

#define threadIdx (::rattn::emu::thread_idx())
#define blockIdx (::rattn::emu::block_idx())
#define blockDim (::rattn::emu::block_dim())
#define gridDim (::rattn::emu::grid_dim())
#define warpSize 32

inline void __syncthreads() { ::rattn::emu::sync_threads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::rattn::emu::sync_warp(); }

template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = ::rattn::emu::lane_id();
  return ::rattn::emu::shuffle_from(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = ::rattn::emu::lane_id();
  const int src = lane ^ mask;
  return ::rattn::emu::shuffle_from(v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = ::rattn::emu::lane_id();
  const int src = lane + int(delta);
  return ::rattn::emu::shuffle_from(v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = ::rattn::emu::lane_id();
  const int src = lane - int(delta);
  return ::rattn::emu::shuffle_from(v, src >= (lane & ~(width - 1)) ? src : lane);
}

// Every lane's predicate as one word (bit i from lane i), through five OR
// exchanges; each lane of the warp must take part, as with a full mask.
inline unsigned __ballot_sync(unsigned, int predicate) {
  const int lane = ::rattn::emu::lane_id();
  unsigned bits = predicate ? 1u << (lane & 31) : 0u;
  for (int o = 16; o > 0; o >>= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, o);
  return bits;
}
inline int __ffs(int x) { return x ? __builtin_ctz(unsigned(x)) + 1 : 0; }
inline int __ffs(unsigned x) { return x ? __builtin_ctz(x) + 1 : 0; }

inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline int __float_as_int(float f) {
  int x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline unsigned __float_as_uint(float f) {
  unsigned x;
  std::memcpy(&x, &f, 4);
  return x;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

// Storage types with the device conversions (round to nearest even).
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) { return ::rattn::f16_to_f32(h.bits); }
inline __half __float2half(float f) { return {::rattn::f32_to_f16(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return ::rattn::bf16_to_f32(h.bits); }
inline __nv_bfloat16 __float2bfloat16(float f) { return {::rattn::f32_to_bf16(f)}; }

// The dynamic shared memory the emitted text declares as
// `extern __shared__ float4 rattn_smem[];` (defined in simt_emu.cpp).
extern float4 rattn_smem[];
