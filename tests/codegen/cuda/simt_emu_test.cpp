// The SIMT emulation itself: shuffles, barriers, shared memory, deadlocks.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "tests/codegen/cuda/simt_emu.h"

namespace {

// A block-wide reduction written the CUDA way.
__global__ void block_sum(const float* in, float* out, int n) {
  float* partial = reinterpret_cast<float*>(rattn_smem);
  float v = 0.f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += in[i];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

__global__ void shuffles(int* out) {
  const int lane = threadIdx.x & 31;
  out[threadIdx.x * 4 + 0] = __shfl_xor_sync(0xffffffffu, lane, 5);
  out[threadIdx.x * 4 + 1] = __shfl_down_sync(0xffffffffu, lane, 3);
  out[threadIdx.x * 4 + 2] = __shfl_sync(0xffffffffu, lane * 10, 7, 8);
  out[threadIdx.x * 4 + 3] = __shfl_up_sync(0xffffffffu, lane, 1, 16);
}

__global__ void divergent_barrier() {
  if (threadIdx.x < 16) __syncthreads();
}

__global__ void half_types(float* out) {
  out[0] = __half2float(__float2half(1.0f / 3.0f));
  out[1] = __bfloat162float(__float2bfloat16(1.0f / 3.0f));
  out[2] = __int_as_float(0xff800000);
}

TEST(SimtEmu, BlockReductionWithShufflesAndSharedMemory) {
  std::vector<float> in(5000);
  double want = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = float(i % 17) - 8.f;
    want += in[i];
  }
  std::vector<float> out(3, 0.f);
  rattn::emu::launch(block_sum, dim3(3), dim3(128), 64, static_cast<const float*>(in.data()), out.data(),
                     int(in.size()));
  EXPECT_DOUBLE_EQ(double(out[0]) + out[1] + out[2], want);
}

TEST(SimtEmu, ShuffleVariantsFollowCudaSemantics) {
  std::vector<int> out(64 * 4);
  rattn::emu::launch(shuffles, dim3(1), dim3(64), 0, out.data());
  for (int t = 0; t < 64; ++t) {
    const int lane = t & 31;
    EXPECT_EQ(out[size_t(t * 4 + 0)], lane ^ 5);
    EXPECT_EQ(out[size_t(t * 4 + 1)], lane + 3 < 32 ? lane + 3 : lane);
    EXPECT_EQ(out[size_t(t * 4 + 2)], ((lane & ~7) + 7) * 10);
    EXPECT_EQ(out[size_t(t * 4 + 3)], (lane & 15) >= 1 ? lane - 1 : lane);
  }
}

TEST(SimtEmu, BarrierNotReachedByAllThreadsIsReportedAsDeadlock) {
  EXPECT_THROW(rattn::emu::launch(divergent_barrier, dim3(1), dim3(32), 0), std::runtime_error);
}

TEST(SimtEmu, HalfAndBfloat16RoundTrip) {
  float out[3];
  rattn::emu::launch(half_types, dim3(1), dim3(32), 0, out);
  EXPECT_NEAR(out[0], 1.0 / 3.0, 1e-3);
  EXPECT_NEAR(out[1], 1.0 / 3.0, 4e-3);
  EXPECT_TRUE(std::isinf(out[2]) && out[2] < 0);
}

}  // namespace
