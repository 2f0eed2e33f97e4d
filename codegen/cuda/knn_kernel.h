#pragma once
// The index build's training-query kNN as a generated CUDA kernel: for each
// query row, its top-k key rows by inner product (a tiled GEMM in shared
// memory, each thread scoring a small tile of queries x keys in registers,
// plus a per-row top-k kept sorted by one warp per row). Scores are fp32 fma
// chains over the dimensions in order, as a plain loop computes them. Compiled
// with NVRTC like the attention kernels; graph assembly stays on the CPU.
//
// Kernel signature (extern "C", one launch of ceil(nq / tile_queries) blocks
// of `threads` threads with `shared_bytes` of dynamic shared memory):
//   NAME(const float* queries,  // [nq, head_dim]
//        const float* keys,     // [nk, head_dim]
//        const int* limits,     // [nq]: query i ranks key rows < limits[i] (<= nk); null: all nk
//        long long nq, long long nk,
//        int* ids,              // [nq, k]: best first; ties by the lower row; -1 past the visible keys
//        float* scores)         // [nq, k]: fp32 inner products; -inf past the visible keys
#include <cstddef>
#include <string>

namespace rattn::cuda {

struct KnnKernelParams {
  int head_dim = 128;      // 1..512
  int k = 100;             // 1..256 neighbours per query
  int tile_queries = 64;   // queries per block, a multiple of threads / 32
  int tile_keys = 64;      // keys per tile, a multiple of 32 up to 256
  int threads = 256;       // 64..1024, a multiple of 32; tile_queries x tile_keys /
                           // threads = 1, 2, 4, 8 or 16 scores per thread
  std::string arch = "sm_90";
};

struct GeneratedKnn {
  std::string name;    // spells every parameter: rattn_knn_d<D>_k<K>_q<TQ>_n<KT>_t<T>
  std::string source;  // CUDA C++ (NVRTC), every constant spelled out
  size_t shared_bytes = 0;
  int threads = 0;
  int tile_queries = 0;
};

// Throws Error(invalid_argument) naming the parameter out of range.
GeneratedKnn generate_knn_kernel(const KnnKernelParams& params);

// The parameters the index build uses for head_dim and k: 64 queries x 64
// keys per block of 256 threads, with fewer keys per tile where a thread
// would stage more than 64 key values, and fewer queries where the shared
// memory would not hold them.
KnnKernelParams default_knn_params(int head_dim, int k);

}  // namespace rattn::cuda
