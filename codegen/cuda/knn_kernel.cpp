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

// The micro tile: each thread scores RQ queries x RK keys of the block's
// tile_queries x tile_keys tile (RK = min(4, scores per thread)).
struct MicroTile {
  int rq = 1, rk = 1;
};

MicroTile micro_tile(int tq, int kt, int threads) {
  const int per_thread = tq * kt / threads;
  MicroTile m;
  m.rk = per_thread < 4 ? per_thread : 4;
  m.rq = per_thread / m.rk;
  return m;
}

size_t round4(size_t words) { return (words + 3) / 4 * 4; }

// Shared memory of one block, in 4-byte words: the query tile and the key
// tile (dimension-major, so a thread reads its RQ queries and RK keys of one
// dimension as contiguous words), the score tile, each row's top-k (scores,
// ids), limits, counts and the block's key bound. Each region starts on a
// float4 boundary.
size_t shared_words(int d, int k, int tq, int kt) {
  return round4(size_t(tq) * size_t(d)) + round4(size_t(kt) * size_t(d)) + round4(size_t(tq) * size_t(kt)) +
         2 * size_t(tq) * size_t(k) + 2 * size_t(tq) + 1;
}

// Key values each thread holds in registers while the previous tile is scored.
int staged_values(int d, int kt, int threads) { return (kt * d + threads - 1) / threads; }

constexpr size_t kMaxSharedBytes = 227 * 1024;  // sm_80 and later opt-in limit
constexpr int kMaxStagedValues = 64;

std::string replace_all(std::string text, const std::vector<std::pair<std::string, std::string>>& subs) {
  for (const auto& [from, to] : subs)
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  return text;
}

// @NAME@, the shape constants and the load/store fragments are substituted
// below. Offsets in the shared arena are words.
constexpr char kTemplate[] = R"(// Training-query kNN: top-@K@ keys by inner product per query, head_dim @D@.
// Block: @TQ@ queries, @T@ threads; key tiles of @KT@ rows, each thread scoring @RQ@ x @RK@.
// The next key tile is read into registers while this one is scored.
extern __shared__ float4 rattn_smem[];

extern "C" __global__ void __launch_bounds__(@T@) @NAME@(
    const float* __restrict__ queries, const float* __restrict__ keys, const int* __restrict__ limits,
    long long nq, long long nk, int* __restrict__ ids, float* __restrict__ scores) {
  float* const qs = reinterpret_cast<float*>(rattn_smem);  // [@D@][@TQ@]
  float* const ks = qs + @QS_WORDS@;                      // [@D@][@KT@]
  float* const sc = ks + @KS_WORDS@;                      // [@TQ@][@KT@]
  float* const ts = sc + @SC_WORDS@;                      // [@TQ@][@K@], best first
  int* const ti = reinterpret_cast<int*>(ts + @TOP_WORDS@);  // [@TQ@][@K@]
  int* const lim = ti + @TOP_WORDS@;                      // [@TQ@]
  int* const cnt = lim + @TQ@;                            // [@TQ@]
  int* const kmax = cnt + @TQ@;                           // [1]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tx = tid % @KX@, ty = tid / @KX@;  // this thread's keys tx*@RK@.., queries ty*@RQ@..
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
    const int r = i % @TQ@, c = i / @TQ@;
    const long long row = q0 + r;
    qs[c * @TQ@ + r] = row < nq ? queries[row * @D@ + c] : 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    int m = 0;
    for (int r = 0; r < @TQ@; ++r) m = lim[r] > m ? lim[r] : m;
    kmax[0] = m;
  }
  __syncthreads();
  const long long key_end = kmax[0];

  // Key tile k0 into registers (a warp reads 32 rows; rows past key_end are 0),
  // then from registers into ks, dimension-major.
@STAGE@
  if (key_end > 0) {
    fetch(0);
    commit();
  }
  __syncthreads();

  for (long long k0 = 0; k0 < key_end; k0 += @KT@) {
    const bool more = k0 + @KT@ < key_end;
    if (more) fetch(k0 + @KT@);
    float acc[@RQ@][@RK@];
#pragma unroll
    for (int i = 0; i < @RQ@; ++i)
#pragma unroll
      for (int j = 0; j < @RK@; ++j) acc[i][j] = 0.0f;
#pragma unroll 4
    for (int x = 0; x < @D@; ++x) {
      float a[@RQ@], b[@RK@];
@LOAD_A@
@LOAD_B@
#pragma unroll
      for (int i = 0; i < @RQ@; ++i)
#pragma unroll
        for (int j = 0; j < @RK@; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < @RQ@; ++i) {
      float* const out = sc + (ty * @RQ@ + i) * @KT@ + tx * @RK@;
@STORE_SC@
    }
    __syncthreads();
    if (more) commit();
    // Merge: a warp per row inserts the tile's candidates that beat the row's
    // k-th best into its sorted list, 32 at a time (warp-uniform control flow).
    for (int r = warp; r < @TQ@; r += @WARPS@) {
      float* const rs = ts + r * @K@;
      int* const ri = ti + r * @K@;
      int n = cnt[r];
      const long long visible = lim[r];
      for (int s0 = 0; s0 < @KT@ && k0 + s0 < visible; s0 += 32) {
        const float cand = sc[r * @KT@ + s0 + lane];
        const int cid = (int)(k0 + s0 + lane);
        int want = k0 + s0 + lane < visible ? 1 : 0;
        if (want && n == @K@) want = cand > rs[@K@ - 1] || (cand == rs[@K@ - 1] && cid < ri[@K@ - 1]);
        unsigned pending = __ballot_sync(0xffffffffu, want);
        while (pending) {
          const int src = __ffs(pending) - 1;
          pending &= pending - 1;
          const float v = __shfl_sync(0xffffffffu, cand, src);
          const int vid = __shfl_sync(0xffffffffu, cid, src);
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

// Key rows travel in pieces of @W@ floats: float4 where head_dim allows (a
// 16-byte aligned row stride), else one float at a time.
constexpr char kStage[] = R"(  @PIECE@ stage[@LD@];
  auto fetch = [&](long long k0) {
#pragma unroll
    for (int s = 0; s < @LD@; ++s) {
      const int i = tid + s * @T@;
      const long long key = k0 + i % @KT@;
      const @PIECE@ zero = @ZERO@;
      stage[s] = i < @KT@ * @DW@ && key < key_end
                     ? reinterpret_cast<const @PIECE@*>(keys)[key * @DW@ + i / @KT@] : zero;
    }
  };
  auto commit = [&]() {
#pragma unroll
    for (int s = 0; s < @LD@; ++s) {
      const int i = tid + s * @T@;
      if (i >= @KT@ * @DW@) break;
      float* const dst = ks + (i / @KT@) * @W@ * @KT@ + i % @KT@;
@STORE_STAGE@
    }
  };)";

// `count` contiguous shared floats at `from` into `to[]`: one float4 read for 4.
std::string load_fragment(const std::string& to, const std::string& from, int count) {
  if (count == 4)
    return "      { const float4 v = *reinterpret_cast<const float4*>(" + from + "); " + to + "[0] = v.x; " + to +
           "[1] = v.y; " + to + "[2] = v.z; " + to + "[3] = v.w; }";
  return "#pragma unroll\n      for (int e = 0; e < " + std::to_string(count) + "; ++e) " + to + "[e] = (" + from +
         ")[e];";
}

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
  if (p.tile_keys < 32 || p.tile_keys > 256 || p.tile_keys % 32)
    bad("tile_keys must be a multiple of 32 in [32, 256], got " + std::to_string(p.tile_keys));
  const int tq = p.tile_queries, kt = p.tile_keys;
  const int per_thread = tq * kt / p.threads;
  if (tq * kt % p.threads || (per_thread != 1 && per_thread != 2 && per_thread != 4 && per_thread != 8 &&
                              per_thread != 16))
    bad("tile_queries x tile_keys / threads must be 1, 2, 4, 8 or 16 scores per thread, got " +
        std::to_string(tq) + " x " + std::to_string(kt) + " / " + std::to_string(p.threads));
  const MicroTile m = micro_tile(tq, kt, p.threads);
  if (tq % m.rq) bad("tile_queries must be a multiple of " + std::to_string(m.rq) + ", got " + std::to_string(tq));
  const int staged = staged_values(p.head_dim, kt, p.threads);
  if (staged > kMaxStagedValues)
    bad("tile_keys x head_dim / threads = " + std::to_string(staged) + " key values staged per thread, more than " +
        std::to_string(kMaxStagedValues) + " (fewer tile_keys)");
  const size_t bytes = 4 * shared_words(p.head_dim, p.k, tq, kt);
  if (bytes > kMaxSharedBytes)
    bad("a block needs " + std::to_string(bytes) + " bytes of shared memory, more than " +
        std::to_string(kMaxSharedBytes) + " (fewer tile_queries)");
  GeneratedKnn g;
  g.name = "rattn_knn_d" + std::to_string(p.head_dim) + "_k" + std::to_string(p.k) + "_q" + std::to_string(tq) +
           "_n" + std::to_string(kt) + "_t" + std::to_string(p.threads);
  g.shared_bytes = bytes;
  g.threads = p.threads;
  g.tile_queries = tq;
  const int piece = p.head_dim % 4 == 0 ? 4 : 1;  // floats per staged value
  const int dw = p.head_dim / piece;                // pieces per key row
  const int ld = (kt * dw + p.threads - 1) / p.threads;
  std::string store_sc;
  if (m.rk == 4)
    store_sc = "      { float4 v; v.x = acc[i][0]; v.y = acc[i][1]; v.z = acc[i][2]; v.w = acc[i][3]; "
               "*reinterpret_cast<float4*>(out) = v; }";
  else
    store_sc = "#pragma unroll\n      for (int j = 0; j < " + std::to_string(m.rk) + "; ++j) out[j] = acc[i][j];";
  const std::string store_stage =
      piece == 4 ? "      dst[0] = stage[s].x;\n      dst[@KT@] = stage[s].y;\n      dst[2 * @KT@] = stage[s].z;\n"
                   "      dst[3 * @KT@] = stage[s].w;"
                 : "      dst[0] = stage[s];";
  std::string text = replace_all(kTemplate, {{"@STAGE@", kStage},
                                             {"@STORE_STAGE@", store_stage},
                                             {"@PIECE@", piece == 4 ? "float4" : "float"},
                                             {"@ZERO@", piece == 4 ? "{0.0f, 0.0f, 0.0f, 0.0f}" : "0.0f"},
                                             {"@LOAD_A@", load_fragment("a", "qs + x * @TQ@ + ty * @RQ@", m.rq)},
                                             {"@LOAD_B@", load_fragment("b", "ks + x * @KT@ + tx * @RK@", m.rk)},
                                             {"@STORE_SC@", store_sc}});
  g.source = replace_all(std::move(text), {
      {"@NAME@", g.name},
      {"@QS_WORDS@", std::to_string(round4(size_t(tq) * size_t(p.head_dim)))},
      {"@KS_WORDS@", std::to_string(round4(size_t(kt) * size_t(p.head_dim)))},
      {"@SC_WORDS@", std::to_string(round4(size_t(tq) * size_t(kt)))},
      {"@TOP_WORDS@", std::to_string(size_t(tq) * size_t(p.k))},
      {"@HOLD@", std::to_string((p.k + 31) / 32)},
      {"@WARPS@", std::to_string(warps)},
      {"@LD@", std::to_string(ld)},
      {"@KX@", std::to_string(kt / m.rk)},
      {"@RQ@", std::to_string(m.rq)},
      {"@RK@", std::to_string(m.rk)},
      {"@TQ@", std::to_string(tq)},
      {"@KT@", std::to_string(kt)},
      {"@DW@", std::to_string(dw)},
      {"@W@", std::to_string(piece)},
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
  p.tile_queries = 64;  // with 64-key tiles: 4 x 4 scores per thread
  p.tile_keys = 64;
  while (p.tile_keys > 32 && staged_values(head_dim, p.tile_keys, p.threads) > kMaxStagedValues) p.tile_keys /= 2;
  // One block per SM where it fits, fewer queries per block where it does not.
  while (p.tile_queries > 8 && 4 * shared_words(head_dim, k, p.tile_queries, p.tile_keys) > 220 * 1024)
    p.tile_queries /= 2;
  return p;
}

}  // namespace rattn::cuda
