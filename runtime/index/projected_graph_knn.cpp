// The build's exact top-k lists (internal::exact_knn): blockwise oneDNN GEMM
// and a threshold top-k per query row.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include <dnnl.hpp>

#include "core/error.h"
#include "runtime/index/projected_graph.h"
#include "runtime/index/topk.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rattn::internal {
namespace {

// Pushes row scores s[0..n) (ids id0 + j) into `top`, skipping most values
// with a vector compare against the current threshold.
#if defined(__x86_64__)
__attribute__((target("avx2"))) void scan_push_avx2(const float* s, int n, int32_t id0, TopK& top) {
  int j = 0;
  // 32 scores per test: once the threshold has settled almost every block
  // of 32 is below it, so one branch covers four vectors.
  for (; j + 32 <= n; j += 32) {
    const __m256 thr = _mm256_set1_ps(top.threshold());
    const __m256 any = _mm256_or_ps(
        _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j), thr, _CMP_GE_OQ),
                     _mm256_cmp_ps(_mm256_loadu_ps(s + j + 8), thr, _CMP_GE_OQ)),
        _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j + 16), thr, _CMP_GE_OQ),
                     _mm256_cmp_ps(_mm256_loadu_ps(s + j + 24), thr, _CMP_GE_OQ)));
    if (_mm256_movemask_ps(any) == 0) continue;
    for (int b = 0; b < 32; b += 8) {
      // The threshold may rise inside the block: re-read it per vector.
      const __m256 t = _mm256_set1_ps(top.threshold());
      unsigned mask = unsigned(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j + b), t, _CMP_GE_OQ)));
      for (; mask; mask &= mask - 1) {  // the set bits only
        const int e = __builtin_ctz(mask);
        top.push(s[j + b + e], id0 + j + b + e);
      }
    }
  }
  for (; j + 8 <= n; j += 8) {
    const __m256 thr = _mm256_set1_ps(top.threshold());
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(s + j), thr, _CMP_GE_OQ));
    if (mask == 0) continue;
    for (int b = 0; b < 8; ++b)
      if (mask & (1 << b)) top.push(s[j + b], id0 + j + b);
  }
  for (; j < n; ++j) top.push(s[j], id0 + j);
}
#endif
void scan_push(const float* s, int n, int32_t id0, TopK& top) {
#if defined(__x86_64__)
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return bool(__builtin_cpu_supports("avx2"));
  }();
  if (avx2) return scan_push_avx2(s, n, id0, top);
#endif
  for (int j = 0; j < n; ++j) top.push(s[j], id0 + j);
}

}  // namespace

// Exact top-nq keys (row ids, best first) of each query: blockwise GEMM with
// oneDNN, then a threshold top-k per query row. Never holds more than one
// [query block x key block] tile of scores per thread.
// Each thread owns whole query blocks (no barrier between the GEMM and the
// selection) and computes one L2-sized tile at a time, which it scans while
// the tile is still in its cache: such tiles measured 1.7-2x the GEMM
// throughput of 2-thread 256 x 8192 tiles (whose 8 MB of scores go through
// memory and back), docs/performance.md.
// causal_offset >= 0: query row t only sees key rows r <= t - causal_offset
// (its own past); `picked` must then be sorted and every picked query must
// see at least nq keys. The GEMM skips the key blocks no query of a block sees.
std::vector<int32_t> exact_knn(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                               int nq, int threads, const std::function<void(double)>& step,
                               int64_t causal_offset) {
  const int64_t N = kf.rows, Q = int64_t(picked.size());
  const int d = kf.dim;
  std::vector<int32_t> knn(size_t(Q) * size_t(nq));
  // Tiles of 128K scores (512 KB, half this machine's L2). Taller tiles
  // measured ~6% faster (less key traffic per GEMM); shorter ones keep the
  // threads balanced on small query sets (at least 8 blocks per thread).
  constexpr int64_t kTile = 128 * 1024;
  const int64_t kQBlock = Q >= 512 * 8 * int64_t(threads) ? 512 : 128, kKBlock = kTile / kQBlock;
  const int64_t blocks = (Q + kQBlock - 1) / kQBlock;
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false}, unranked{false};
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> qblock(size_t(kQBlock) * size_t(d)), tile(size_t(kQBlock) * size_t(kKBlock));
    std::vector<TopK> tops;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const int64_t q0 = b * kQBlock, bq = std::min(kQBlock, Q - q0);
      for (int64_t i = 0; i < bq; ++i)
        std::memcpy(qblock.data() + size_t(i) * size_t(d), queries + size_t(picked[size_t(q0 + i)]) * size_t(d),
                    sizeof(float) * size_t(d));
      tops.assign(size_t(bq), TopK(nq));
      const int64_t key_end =
          causal_offset < 0 ? N : std::min<int64_t>(N, picked[size_t(q0 + bq - 1)] - causal_offset + 1);
      for (int64_t k0 = 0; k0 < key_end; k0 += kKBlock) {
        const int64_t bk = std::min(kKBlock, key_end - k0);
        // Inside the parallel region oneDNN runs the GEMM on this thread alone.
        const dnnl_status_t st =
            dnnl_sgemm('N', 'T', bq, bk, d, 1.0f, qblock.data(), d, static_cast<const float*>(kf.row(k0)), d, 0.0f,
                       tile.data(), bk);
        if (st != dnnl_success) {
          failed = true;
          break;
        }
        for (int64_t i = 0; i < bq; ++i) {
          const int64_t visible =
              causal_offset < 0 ? bk : std::min<int64_t>(bk, picked[size_t(q0 + i)] - causal_offset + 1 - k0);
          if (visible > 0) scan_push(tile.data() + size_t(i) * size_t(bk), int(visible), int32_t(k0), tops[size_t(i)]);
        }
      }
      for (int64_t i = 0; i < bq; ++i) {
        const auto& best = tops[size_t(i)].sorted();
        int32_t* dst = knn.data() + size_t(q0 + i) * size_t(nq);
        if (best.size() < size_t(nq)) {  // unranked (non-finite) scores: never index past the list
          unranked = true;
          std::fill(dst, dst + nq, 0);
          continue;
        }
        for (int j = 0; j < nq; ++j) dst[j] = best[size_t(j)].id;
      }
      const int64_t finished = done.fetch_add(bq) + bq;
      if (step && omp_get_thread_num() == 0) step(double(finished) / double(Q));
    }
  }
  if (failed) fail(Status::internal, "projected graph build: oneDNN sgemm failed");
  if (unranked)
    fail(Status::invalid_argument, "projected graph build: a training query's scores could not be ranked (non-finite)");
  if (step) step(1.0);
  return knn;
}

}  // namespace rattn::internal
