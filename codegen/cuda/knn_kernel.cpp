// The training-query kNN kernel's text: every shape constant spelled out,
// so that NVRTC unrolls the inner loops and the host SIMT emulation compiles
// the same text (tests/codegen/cuda).
#include "codegen/cuda/knn_kernel.h"

#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace rattn::cuda {

namespace {

// Shared memory of one block, in 4-byte words: the query tile, the key tile
// (rows padded by one word: the lanes of a warp read 32 rows without bank
// conflicts), the score tile, each row's top-k (scores, ids), limits, counts
// and the block's key bound.
size_t shared_words(int d, int k, int tq) {
  return size_t(tq) * size_t(d) + size_t(kKnnTileKeys) * size_t(d + 1) + size_t(tq) * kKnnTileKeys +
         2 * size_t(tq) * size_t(k) + 2 * size_t(tq) + 1;
}

constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_80 and later opt-in limit

std::string replace_all(std::string text, const std::vector<std::pair<std::string, std::string>>& subs) {
  for (const auto& [from, to] : subs)
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  return text;
}

// @NAME@ and the shape constants are substituted below. Offsets in the
// shared arena are words.
constexpr char kTemplate[] = R"(// Training-query kNN: top-@K@ keys by inner product per query, head_dim @D@.
// Block: @TQ@ queries, @T@ threads; key tiles of 32 rows (one per lane).
extern __shared__ float4 rattn_smem[];

extern "C" __global__ void __launch_bounds__(@T@) @NAME@(
    const float* __restrict__ queries, const float* __restrict__ keys, const int* __restrict__ limits,
    long long nq, long long nk, int* __restrict__ ids, float* __restrict__ scores) {
  float* const qs = reinterpret_cast<float*>(rattn_smem);  // [@TQ@][@D@]
  float* const ks = qs + @QS_WORDS@;                      // [32][@D@ + 1]
  float* const sc = ks + @KS_WORDS@;                      // [@TQ@][32]
  float* const ts = sc + @SC_WORDS@;                      // [@TQ@][@K@], best first
  int* const ti = reinterpret_cast<int*>(ts + @TOP_WORDS@);  // [@TQ@][@K@]
  int* const lim = ti + @TOP_WORDS@;                      // [@TQ@]
  int* const cnt = lim + @TQ@;                            // [@TQ@]
  int* const kmax = cnt + @TQ@;                           // [1]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long q0 = (long long)blockIdx.x * @TQ@;
  const float neg_inf = __uint_as_float(0xff800000u);

  if (tid < @TQ@) {
    const long long row = q0 + tid;
    long long l = row < nq ? (limits ? (long long)limits[row] : nk) : 0;
    l = l < 0 ? 0 : (l > nk ? nk : l);
    lim[tid] = (int)l;
    cnt[tid] = 0;
  }
  for (int i = tid; i < @TQ@ * @D@; i += @T@) {
    const long long row = q0 + i / @D@;
    qs[i] = row < nq ? queries[row * @D@ + i % @D@] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    int m = 0;
    for (int r = 0; r < @TQ@; ++r) m = lim[r] > m ? lim[r] : m;
    kmax[0] = m;
  }
  __syncthreads();
  const long long key_end = kmax[0];

  for (long long k0 = 0; k0 < key_end; k0 += 32) {
    // The key tile.
    for (int i = tid; i < 32 * @D@; i += @T@) {
      const int r = i / @D@, c = i % @D@;
      const long long key = k0 + r;
      ks[r * (@D@ + 1) + c] = key < key_end ? keys[key * @D@ + c] : 0.0f;
    }
    __syncthreads();
    // Scores: a warp computes one query row against the 32 keys, a lane per key.
#pragma unroll
    for (int j = 0; j < @PER_THREAD@; ++j) {
      const int e = tid + j * @T@;
      const int r = e >> 5, c = e & 31;
      const float* qr = qs + r * @D@;
      const float* kr = ks + c * (@D@ + 1);
      float acc = 0.0f;
#pragma unroll 8
      for (int x = 0; x < @D@; ++x) acc = fmaf(qr[x], kr[x], acc);
      sc[e] = acc;
    }
    __syncthreads();
    // Merge: a warp per row inserts the tile's candidates that beat the row's
    // k-th best into its sorted list (warp-uniform control flow throughout).
    for (int r = warp; r < @TQ@; r += @WARPS@) {
      float* const rs = ts + r * @K@;
      int* const ri = ti + r * @K@;
      int n = cnt[r];
      const float cand = sc[r * 32 + lane];
      const int cid = (int)(k0 + lane);
      int want = k0 + lane < (long long)lim[r] ? 1 : 0;
      if (want && n == @K@) want = cand > rs[@K@ - 1] || (cand == rs[@K@ - 1] && cid < ri[@K@ - 1]);
      int any = want;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) any |= __shfl_xor_sync(0xffffffffu, any, o);
      if (!any) continue;
      for (int src = 0; src < 32; ++src) {
        const float v = __shfl_sync(0xffffffffu, cand, src);
        const int vid = __shfl_sync(0xffffffffu, cid, src);
        if (!__shfl_sync(0xffffffffu, want, src)) continue;
        if (n == @K@ && !(v > rs[@K@ - 1] || (v == rs[@K@ - 1] && vid < ri[@K@ - 1]))) continue;
        int p = 0;  // entries better than the candidate
        for (int i = lane; i < n; i += 32) p += (rs[i] > v || (rs[i] == v && ri[i] < vid)) ? 1 : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffffu, p, o);
        const int last = n < @K@ ? n : @K@ - 1;  // entries [p, last) move down one place
        float hold_s[@HOLD@];
        int hold_i[@HOLD@];
#pragma unroll
        for (int j = 0; j < @HOLD@; ++j) {
          const int i = p + lane + 32 * j;
          hold_s[j] = i < last ? rs[i] : 0.0f;
          hold_i[j] = i < last ? ri[i] : 0;
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < @HOLD@; ++j) {
          const int i = p + lane + 32 * j;
          if (i < last) {
            rs[i + 1] = hold_s[j];
            ri[i + 1] = hold_i[j];
          }
        }
        if (lane == 0 && p < @K@) {
          rs[p] = v;
          ri[p] = vid;
        }
        __syncwarp();
        n = n < @K@ ? n + 1 : n;
      }
      if (lane == 0) cnt[r] = n;
    }
    __syncthreads();
  }

  for (int i = tid; i < @TQ@ * @K@; i += @T@) {
    const int r = i / @K@, j = i % @K@;
    const long long row = q0 + r;
    if (row >= nq) continue;
    const bool have = j < cnt[r];
    ids[row * @K@ + j] = have ? ti[r * @K@ + j] : -1;
    scores[row * @K@ + j] = have ? ts[r * @K@ + j] : neg_inf;
  }
}
)";

}  // namespace

GeneratedKnn generate_knn_kernel(const KnnKernelParams& p) {
  auto bad = [](const std::string& what) {
    fail(Status::invalid_argument, "cuda codegen: error: knn kernel: " + what);
  };
  if (p.head_dim < 1 || p.head_dim > 512) bad("head_dim must be in [1, 512], got " + std::to_string(p.head_dim));
  if (p.k < 1 || p.k > 256) bad("k must be in [1, 256], got " + std::to_string(p.k));
  if (p.threads < 64 || p.threads > 1024 || p.threads % 32)
    bad("threads must be a multiple of 32 in [64, 1024], got " + std::to_string(p.threads));
  const int warps = p.threads / 32;
  if (p.tile_queries < warps || p.tile_queries % warps || p.tile_queries > 256)
    bad("tile_queries must be a multiple of threads / 32 = " + std::to_string(warps) + " up to 256, got " +
        std::to_string(p.tile_queries));
  const size_t bytes = 4 * shared_words(p.head_dim, p.k, p.tile_queries);
  if (bytes > kMaxSharedBytes)
    bad("a block needs " + std::to_string(bytes) + " bytes of shared memory, more than " +
        std::to_string(kMaxSharedBytes) + " (fewer tile_queries)");
  GeneratedKnn g;
  g.name = "rattn_knn_d" + std::to_string(p.head_dim) + "_k" + std::to_string(p.k) + "_q" +
           std::to_string(p.tile_queries) + "_t" + std::to_string(p.threads);
  g.shared_bytes = bytes;
  g.threads = p.threads;
  g.tile_queries = p.tile_queries;
  const int tq = p.tile_queries;
  g.source = replace_all(kTemplate, {
      {"@NAME@", g.name},
      {"@QS_WORDS@", std::to_string(size_t(tq) * size_t(p.head_dim))},
      {"@KS_WORDS@", std::to_string(size_t(kKnnTileKeys) * size_t(p.head_dim + 1))},
      {"@SC_WORDS@", std::to_string(tq * kKnnTileKeys)},
      {"@TOP_WORDS@", std::to_string(size_t(tq) * size_t(p.k))},
      {"@PER_THREAD@", std::to_string(tq * kKnnTileKeys / p.threads)},
      {"@HOLD@", std::to_string((p.k + 31) / 32)},
      {"@WARPS@", std::to_string(warps)},
      {"@TQ@", std::to_string(tq)},
      {"@T@", std::to_string(p.threads)},
      {"@D@", std::to_string(p.head_dim)},
      {"@K@", std::to_string(p.k)},
  });
  return g;
}

KnnKernelParams default_knn_params(int head_dim, int k) {
  KnnKernelParams p;
  p.head_dim = head_dim;
  p.k = k;
  p.threads = 256;
  p.tile_queries = 32;
  // Two blocks per SM where the shared memory allows it.
  while (p.tile_queries > 8 && 4 * shared_words(head_dim, k, p.tile_queries) > 110 * 1024) p.tile_queries /= 2;
  return p;
}

}  // namespace rattn::cuda
