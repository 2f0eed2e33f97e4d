// The build's top-k lists of the training queries: exact (internal::exact_knn,
// blockwise oneDNN GEMM and a threshold top-k per query row) and partitioned
// (internal::partitioned_knn), chosen by internal::cpu_training_knn.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <dnnl.hpp>

#include "core/clock.h"
#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/hash.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph_impl.h"
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
  if (cpu_has_avx2()) return scan_push_avx2(s, n, id0, top);
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

namespace {

// The first c maximising s[c] - h[c] (ties: the lowest c). The assignment
// scans N x C such values, a third of the partitioned kNN's time when scalar.
int64_t argmax_minus_plain(const float* s, const float* h, int64_t C) {
  int64_t best = 0;
  float bv = s[0] - h[0];
  for (int64_t c = 1; c < C; ++c)
    if (s[c] - h[c] > bv) bv = s[c] - h[c], best = c;
  return best;
}
#if defined(__x86_64__)
// Vector maximum first, then the first index holding it: the same answer.
__attribute__((target("avx2"))) int64_t argmax_minus_avx2(const float* s, const float* h, int64_t C) {
  if (C < 16) return argmax_minus_plain(s, h, C);
  __m256 m = _mm256_sub_ps(_mm256_loadu_ps(s), _mm256_loadu_ps(h));
  int64_t c = 8;
  for (; c + 8 <= C; c += 8) m = _mm256_max_ps(m, _mm256_sub_ps(_mm256_loadu_ps(s + c), _mm256_loadu_ps(h + c)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float bv = lanes[0];
  for (int j = 1; j < 8; ++j) bv = std::max(bv, lanes[j]);
  for (; c < C; ++c) bv = std::max(bv, s[c] - h[c]);
  if (!(bv == bv)) return argmax_minus_plain(s, h, C);  // NaN: the scalar rule
  const __m256 target = _mm256_set1_ps(bv);
  for (c = 0; c + 8 <= C; c += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + c), _mm256_loadu_ps(h + c)), target, _CMP_EQ_OQ));
    if (mask) return c + __builtin_ctz(unsigned(mask));
  }
  for (; c < C; ++c)
    if (s[c] - h[c] == bv) return c;
  return argmax_minus_plain(s, h, C);
}
#endif
int64_t argmax_minus(const float* s, const float* h, int64_t C) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return argmax_minus_avx2(s, h, C);
#endif
  return argmax_minus_plain(s, h, C);
}

// C [m, n] = A [m, d] B [n, d]' with A and B rounded to bf16 (oneDNN's bf16 matmul: 2-3x sgemm's rate at these
// shapes on a CPU with AVX512-BF16 or AMX, one thread). The scan keeps a
// few more candidates than it needs and re-ranks them with f32 products,
// so bf16 only decides which keys reach that short list.
class Bf16Scores {
 public:
  // Whether the CPU has bf16 dot products and oneDNN a non-reference matmul
  // (probed once, at a head dimension of 64: the answer is the CPU's).
  static bool available() {
    static const bool ok = [] {
#if defined(__x86_64__)
      __builtin_cpu_init();
      if (!__builtin_cpu_supports("avx512bf16")) return false;
      try {
        const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
        const std::string impl = primitive_desc(eng, 64).impl_info_str();
        return impl.find("ref") == std::string::npos;
      } catch (const dnnl::error&) {
        return false;
      }
#else
      return false;
#endif
    }();
    return ok;
  }
  // One per thread (a stream each); null when oneDNN cannot make it.
  static std::unique_ptr<Bf16Scores> make(int d) {
    try {
      return std::unique_ptr<Bf16Scores>(new Bf16Scores(d));
    } catch (const dnnl::error&) {
      return nullptr;
    }
  }
  // C = A [m, d] B [n, d]' through fixed-shape primitives (AMX tiles on CPUs
  // that have them: 1.2-2.4x the runtime-shape primitive's rate at 16-256
  // rows, docs/notes/2026-11-27-index-build-at-scale.md), one per shape class,
  // since the shapes vary call to call. The caller provides padded_rows(m)
  // readable rows of a, padded_cols(n) readable rows of b (their products
  // land in columns that are never read), and c of padded_rows(m) x
  // padded_cols(n) floats; row i of the result starts at c + i * padded_cols(n).
  // False when oneDNN fails.
  static constexpr int64_t kRowStep = 16, kColStep = 64, kMaxRows = 256;
  static int64_t padded_rows(int64_t m) { return (m + kRowStep - 1) / kRowStep * kRowStep; }
  static int64_t padded_cols(int64_t n) { return (n + kColStep - 1) / kColStep * kColStep; }
  bool run_padded(const uint16_t* a, int64_t m, const uint16_t* b, int64_t n, float* c) {
    const int64_t ldc = padded_cols(n);
    for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
      const int64_t rows = padded_rows(std::min(kMaxRows, m - r0));
      dnnl::matmul* mm = fixed_shape(rows, ldc);
      const uint16_t* ar = a + size_t(r0) * size_t(d_);
      float* cr = c + size_t(r0) * size_t(ldc);
      if (!(mm ? execute(*mm, ar, rows, b, ldc, cr, ldc) : execute(mm_, ar, std::min(kMaxRows, m - r0), b, n, cr, ldc)))
        return false;
    }
    return true;
  }

 private:
  explicit Bf16Scores(int d) : d_(d), eng_(dnnl::engine::kind::cpu, 0), stream_(eng_), mm_(primitive_desc(eng_, d)) {}
  bool execute(dnnl::matmul& mm, const uint16_t* a, int64_t m, const uint16_t* b, int64_t n, float* c, int64_t ldc) {
    using tag = dnnl::memory;
    try {
      const tag::desc ad({m, d_}, tag::data_type::bf16, tag::dims{d_, 1});
      const tag::desc bd({d_, n}, tag::data_type::bf16, tag::dims{1, d_});
      const tag::desc cd({m, n}, tag::data_type::f32, tag::dims{ldc, 1});
      tag am(ad, eng_, const_cast<uint16_t*>(a)), bm(bd, eng_, const_cast<uint16_t*>(b)), cm(cd, eng_, c);
      mm.execute(stream_, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      stream_.wait();
    } catch (const dnnl::error&) {
      return false;
    }
    return true;
  }
  // The primitive for exactly rows x cols, made on first use; null where
  // oneDNN would only run its reference code for it (the runtime-shape
  // primitive is then used).
  dnnl::matmul* fixed_shape(int64_t rows, int64_t cols) {
    const auto key = std::make_pair(rows, cols);
    auto it = fixed_.find(key);
    if (it == fixed_.end()) {
      std::unique_ptr<dnnl::matmul> mm;
      try {
        using tag = dnnl::memory;
        const tag::desc ad({rows, d_}, tag::data_type::bf16, tag::dims{d_, 1});
        const tag::desc bd({d_, cols}, tag::data_type::bf16, tag::dims{1, d_});
        const tag::desc cd({rows, cols}, tag::data_type::f32, tag::dims{cols, 1});
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), eng_);
        if (std::string(pd.impl_info_str()).find("ref") == std::string::npos) mm = std::make_unique<dnnl::matmul>(pd);
      } catch (const dnnl::error&) {
      }
      it = fixed_.emplace(key, std::move(mm)).first;
    }
    return it->second.get();
  }
  static dnnl::matmul::primitive_desc primitive_desc(const dnnl::engine& eng, int d) {
    using tag = dnnl::memory;
    const auto R = DNNL_RUNTIME_DIM_VAL;
    const tag::desc ad({R, d}, tag::data_type::bf16, tag::dims{d, 1});
    const tag::desc bd({d, R}, tag::data_type::bf16, tag::dims{1, d});
    const tag::desc cd({R, R}, tag::data_type::f32, tag::dims{R, 1});
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng);
  }
  int d_;
  dnnl::engine eng_;
  dnnl::stream stream_;
  dnnl::matmul mm_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<dnnl::matmul>> fixed_;
};

// s[i] += spread * sqrt(max(v[i], 0)): a partition's likely best score.
void add_spread_plain(float* s, const float* v, size_t n, float spread) {
  for (size_t i = 0; i < n; ++i) s[i] += spread * std::sqrt(std::max(v[i], 0.0f));
}
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void add_spread_avx2(float* s, const float* v, size_t n, float spread) {
  const __m256 k = _mm256_set1_ps(spread), zero = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(s + i, _mm256_fmadd_ps(k, _mm256_sqrt_ps(_mm256_max_ps(_mm256_loadu_ps(v + i), zero)), _mm256_loadu_ps(s + i)));
  add_spread_plain(s + i, v + i, n - i, spread);
}
#endif
void add_spread(float* s, const float* v, size_t n, float spread) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma_f16c()) return add_spread_avx2(s, v, n, spread);
#endif
  add_spread_plain(s, v, n, spread);
}

// Rows [0, n) of `rows` (row-major, d) against `cents` [C, d]: the nearest
// centroid (L2) of each row, via GEMM: argmax_c <x, c> - |c|^2 / 2. Blocks
// of fixed size, so the result does not depend on the thread count. bf16:
// the products from bf16 rows and centroids (Bf16Scores).
std::vector<float> half_norms(const std::vector<float>& cents, int64_t C, int d) {
  std::vector<float> half_norm(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += double(cents[size_t(c) * size_t(d) + size_t(j)]) * cents[size_t(c) * size_t(d) + size_t(j)];
    half_norm[size_t(c)] = float(0.5 * s);
  }
  return half_norm;
}
// half_norm: |c|^2 / 2 of each centroid in the space its distances are
// meant in (a metric's: <x, L c> - |L' c|^2 / 2 is <L' x, c'> - |c'|^2 / 2
// with c' = L' c); by default the centroids' own.
void nearest_centroids(const float* rows, int64_t n, const std::vector<float>& cents, int64_t C, int d, int threads,
                       int32_t* out, bool bf16, std::vector<float> half_norm = {}) {
  if (half_norm.empty()) half_norm = half_norms(cents, C, d);
  // bf16: 128-row tiles of scores (1 MB at 2048 centroids) stay in L2;
  // 256 rows measured 20% slower there.
  const int64_t kRows = bf16 ? 128 : 256;
  const int64_t blocks = (n + kRows - 1) / kRows;
  std::atomic<bool> failed{false};
  // Padded with zero rows for the fixed-shape products (Bf16Scores::run_padded).
  const int64_t ldc = bf16 ? Bf16Scores::padded_cols(C) : C;
  std::vector<uint16_t> cents16(bf16 ? size_t(ldc) * size_t(d) : 0);
  from_f32(DType::bf16, cents.data(), cents16.data(), bf16 ? cents.size() : 0);
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tile(size_t(kRows) * size_t(ldc));
    std::vector<uint16_t> rows16(bf16 ? size_t(kRows) * size_t(d) : 0);
    const std::unique_ptr<Bf16Scores> mm = bf16 ? Bf16Scores::make(d) : nullptr;
    if (bf16 && !mm) failed = true;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const int64_t r0 = b * kRows, br = std::min(kRows, n - r0);
      const float* block = rows + size_t(r0) * size_t(d);
      if (bf16) from_f32(DType::bf16, block, rows16.data(), size_t(br) * size_t(d));
      if (bf16 ? !mm->run_padded(rows16.data(), br, cents16.data(), C, tile.data())
               : dnnl_sgemm('N', 'T', br, C, d, 1.0f, block, d, cents.data(), d, 0.0f, tile.data(), C) != dnnl_success) {
        failed = true;
        continue;
      }
      for (int64_t i = 0; i < br; ++i) out[r0 + i] = int32_t(argmax_minus(tile.data() + size_t(i) * size_t(ldc), half_norm.data(), C));
    }
  }
  if (failed) fail(Status::internal, "partitioned kNN: oneDNN GEMM failed");
}

// k-means (L2) of the keys into C partitions: a seeded sample of at most
// 48 C keys (as L' k when `cholesky` holds the metric's factor Lt), C of
// them as the first centroids, `iters` Lloyd steps (float64 sums in row
// order: deterministic). Returns the centroids [C, d], in the sample's space.
std::vector<float> key_partitions(const RowsView& kf, int64_t C, int iters, uint64_t seed, int threads, bool bf16,
                                  const std::vector<float>* cholesky = nullptr) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  const int64_t S = std::min<int64_t>(N, 48 * C);
  // Sample: the first S of a seeded partial shuffle of the rows, in row order.
  std::vector<int64_t> ids(static_cast<size_t>(N));
  std::iota(ids.begin(), ids.end(), 0);
  uint64_t st = seed ^ 0x6b6d65616e73ull;
  for (int64_t i = 0; i < S; ++i)
    std::swap(ids[size_t(i)], ids[size_t(i + int64_t(mix64(st += kGoldenGamma) % uint64_t(N - i)))]);
  ids.resize(size_t(S));
  std::vector<float> sample(size_t(S) * size_t(d));
  for (int64_t i = 0; i < S; ++i)
    std::memcpy(sample.data() + size_t(i) * size_t(d), kf.row(ids[size_t(i)]), sizeof(float) * size_t(d));
  // In a metric's space: the sample's rows times its Cholesky factor.
  KeyRows transformed;
  if (cholesky) transformed = rows_times_cholesky(RowsView{sample.data(), DType::f32, S, d}, *cholesky, threads);
  const float* rows = cholesky ? transformed.data() : sample.data();
  // First centroids: evenly spaced sample rows (the sample is shuffled).
  std::vector<float> cents(size_t(C) * size_t(d));
  for (int64_t c = 0; c < C; ++c)
    std::memcpy(cents.data() + size_t(c) * size_t(d), rows + size_t(c * S / C) * size_t(d), sizeof(float) * size_t(d));
  std::vector<int32_t> assign(static_cast<size_t>(S));
  std::vector<double> sum(size_t(C) * size_t(d));
  std::vector<int64_t> count(static_cast<size_t>(C));
  for (int it = 0; it < iters; ++it) {
    nearest_centroids(rows, S, cents, C, d, threads, assign.data(), bf16);
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t c = assign[size_t(i)];
      ++count[size_t(c)];
      for (int j = 0; j < d; ++j) sum[size_t(c) * size_t(d) + size_t(j)] += rows[size_t(i) * size_t(d) + size_t(j)];
    }
    for (int64_t c = 0; c < C; ++c)  // an empty partition keeps its centroid
      if (count[size_t(c)] > 0)
        for (int j = 0; j < d; ++j)
          cents[size_t(c) * size_t(d) + size_t(j)] = float(sum[size_t(c) * size_t(d) + size_t(j)] / double(count[size_t(c)]));
  }
  return cents;
}

}  // namespace

RowGroups group_rows(const std::vector<int32_t>& group_of, int64_t groups) {
  RowGroups g;
  g.start.assign(size_t(groups) + 1, 0);
  for (int32_t c : group_of) ++g.start[size_t(c) + 1];
  for (int64_t c = 0; c < groups; ++c) g.start[size_t(c) + 1] += g.start[size_t(c)];
  g.members.resize(group_of.size());
  std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
  for (size_t i = 0; i < group_of.size(); ++i) g.members[size_t(fill[size_t(group_of[i])]++)] = int32_t(i);
  return g;
}

std::vector<int32_t> key_partition_ids(const RowsView& rows, int64_t C, int iterations, uint64_t seed, int threads) {
  if (rows.dtype != DType::f32) fail(Status::invalid_argument, "key partitions: f32 rows expected");
  const float* data = static_cast<const float*>(rows.data);
  std::vector<int32_t> part(static_cast<size_t>(rows.rows));
  const bool bf16 = Bf16Scores::available();
  const std::vector<float> cents = key_partitions(rows, C, iterations, seed, threads, bf16);
  nearest_centroids(data, rows.rows, cents, C, rows.dim, threads, part.data(), bf16);
  return part;
}

std::vector<int32_t> partitioned_knn(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                                     int nq, const PartitionedKnnParams& kp, int threads,
                                     const std::function<void(double)>& step, int64_t causal_offset,
                                     KnnStats* stats) {
  const int64_t N = kf.rows, Q = int64_t(picked.size());
  const int d = kf.dim;
  if (kp.cluster_keys < 1 || kp.probes < 1 || kp.iterations < 0)
    fail(Status::invalid_argument, "partitioned kNN: cluster_keys and probes must be >= 1, iterations >= 0");
  const int64_t C = std::max<int64_t>(1, N / kp.cluster_keys);
  if (C <= kp.probes || Q == 0) {  // every partition probed: the exact scan is cheaper
    if (stats) *stats = KnnStats::exact(Q);
    return exact_knn(kf, queries, picked, nq, threads, step, causal_offset);
  }
  const auto report = [&](double x) {
    if (step) step(x);
  };
  double t_mark = seconds_now();
  const auto lap = [&] {
    const double t = seconds_now(), dt = t - t_mark;
    t_mark = t;
    return dt;
  };
  // bf16 products (k-means, probe ranking, scan) where the CPU has them.
  const bool bf16 = kp.bf16 && Bf16Scores::available();
  // 1. Partitions: k-means in the training queries' metric (keys L' k with
  //    L L' their second moment, so that two keys are near when queries score
  //    them alike, not when they agree in directions queries ignore); every
  //    key to its nearest centroid; the keys copied partition by partition
  //    (row ids ascending within one). A partition's probe centroid is the
  //    mean of its raw keys: <q, centroid> is the mean score of its keys.
  std::vector<int32_t> part(static_cast<size_t>(N));
  {
    std::vector<double> S(size_t(d) * size_t(d), 0.0);
    const int64_t qstep = std::max<int64_t>(1, Q / 8192);
    int64_t used = 0;
    for (int64_t i = 0; i < Q; i += qstep, ++used) {
      const float* q = queries + size_t(picked[size_t(i)]) * size_t(d);
      for (int a = 0; a < d; ++a)
        for (int b = 0; b <= a; ++b) S[size_t(a) * size_t(d) + size_t(b)] += double(q[a]) * double(q[b]);
    }
    double trace = 0;
    for (int a = 0; a < d; ++a) trace += S[size_t(a) * size_t(d) + size_t(a)];
    if (!std::isfinite(trace)) fail(Status::invalid_argument, "partitioned kNN: non-finite training queries");
    for (int a = 0; a < d; ++a) S[size_t(a) * size_t(d) + size_t(a)] += 1e-3 * trace / double(d) + 1e-12;
    // k-means of a sample in the metric's space (centroids c'), then every
    // key's nearest centroid from the raw keys against L c' with the
    // norms of c': the same distances without transforming all N keys.
    const std::vector<float> Lt = cholesky_columns(std::move(S), d);
    const std::vector<float> cents_t = key_partitions(kf, C, kp.iterations, kp.seed, threads, bf16, &Lt);
    std::vector<float> cents_raw(cents_t.size());
    if (dnnl_sgemm('N', 'N', C, d, d, 1.0f, cents_t.data(), d, Lt.data(), d, 0.0f, cents_raw.data(), d) != dnnl_success)
      fail(Status::internal, "partitioned kNN: oneDNN sgemm failed");
    nearest_centroids(static_cast<const float*>(kf.row(0)), N, cents_raw, C, d, threads, part.data(), bf16,
                      half_norms(cents_t, C, d));
  }
  const RowGroups groups = group_rows(part, C);
  const std::vector<int64_t>& pstart = groups.start;
  const std::vector<int32_t>& member = groups.members;  // position in the copy -> key row
  // The keys copied partition by partition: f32 for the f32 scan (the bf16
  // scan re-ranks from kf itself, so it needs no f32 copy).
  std::vector<float> kperm(bf16 ? 0 : size_t(N) * size_t(d));
  // The scan's bf16 copy of the keys, with zero rows past the end for the
  // fixed-shape products' padding (Bf16Scores::run_padded).
  std::vector<uint16_t> kperm16(bf16 ? size_t(N + Bf16Scores::kColStep) * size_t(d) : 0), q16(bf16 ? size_t(Q) * size_t(d) : 0);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* row = static_cast<const float*>(kf.row(member[size_t(i)]));
    if (bf16)
      from_f32(DType::bf16, row, kperm16.data() + size_t(i) * size_t(d), size_t(d));
    else
      std::memcpy(kperm.data() + size_t(i) * size_t(d), row, sizeof(float) * size_t(d));
  }
  if (bf16) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < Q; ++i)
      from_f32(DType::bf16, queries + size_t(picked[size_t(i)]) * size_t(d), q16.data() + size_t(i) * size_t(d), size_t(d));
  }
  // With bf16 scores each query keeps this many candidates for the f32
  // re-rank: bf16's rounding moves a key a few ranks, and 8 spare ones gave
  // the same graphs as 25 on four sets (docs/notes/2026-11-27-index-build-at-scale.md).
  const int kept = bf16 ? nq + 8 : nq;
  // Per partition: the mean of its raw keys and their variance per dimension.
  std::vector<float> cents(size_t(C) * size_t(d), 0.0f), vars(size_t(C) * size_t(d), 0.0f);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 16)
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> m(static_cast<size_t>(d), 0.0), m2(static_cast<size_t>(d), 0.0);
    for (int64_t i = pstart[size_t(c)]; i < pstart[size_t(c) + 1]; ++i) {
      const float* row = static_cast<const float*>(kf.row(member[size_t(i)]));
      for (int j = 0; j < d; ++j) {
        const double x = row[j];
        m[size_t(j)] += x;
        m2[size_t(j)] += x * x;
      }
    }
    const double n = double(std::max<int64_t>(1, pstart[size_t(c) + 1] - pstart[size_t(c)]));
    for (int j = 0; j < d; ++j) {
      const double mean = m[size_t(j)] / n;
      cents[size_t(c) * size_t(d) + size_t(j)] = float(mean);
      vars[size_t(c) * size_t(d) + size_t(j)] = float(std::max(0.0, m2[size_t(j)] / n - mean * mean));
    }
  }
  report(0.1);
  const double partition_seconds = lap();

  // 2. Each query's `probes` best partitions by <q, mean> + spread * sd,
  //    sd^2 = sum_j q_j^2 var_j: the partition's likely best scores, not its
  //    mean one (a wide partition holds more of a query's top keys).
  const int P = kp.probes;
  std::vector<int32_t> probe(size_t(Q) * size_t(P));
  // Zero rows pad the bf16 copies for the fixed-shape products.
  const int64_t ldc = bf16 ? Bf16Scores::padded_cols(C) : C;
  std::vector<uint16_t> cents16(bf16 ? size_t(ldc) * size_t(d) : 0), vars16(cents16.size());
  from_f32(DType::bf16, cents.data(), cents16.data(), bf16 ? cents.size() : 0);
  from_f32(DType::bf16, vars.data(), vars16.data(), bf16 ? vars.size() : 0);
  {
    // bf16: two 128-row tiles (2 MB at 2048 partitions) fit L2.
    const int64_t kRows = bf16 ? 128 : 256;
    const int64_t blocks = (Q + kRows - 1) / kRows;
    std::atomic<bool> failed{false};
#pragma omp parallel num_threads(threads)
    {
      std::vector<float> qb(size_t(kRows) * size_t(d)), q2(size_t(kRows) * size_t(d)), tile(size_t(kRows) * size_t(ldc)),
          tile2(size_t(kRows) * size_t(ldc));
      std::vector<uint16_t> qb16(bf16 ? qb.size() : 0), q216(bf16 ? q2.size() : 0);
      const std::unique_ptr<Bf16Scores> mm = bf16 ? Bf16Scores::make(d) : nullptr;
      if (bf16 && !mm) failed = true;
      TopK top(P);
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t q0 = b * kRows, bq = std::min(kRows, Q - q0);
        for (int64_t i = 0; i < bq; ++i)
          std::memcpy(qb.data() + size_t(i) * size_t(d), queries + size_t(picked[size_t(q0 + i)]) * size_t(d),
                      sizeof(float) * size_t(d));
        for (size_t i = 0; i < size_t(bq) * size_t(d); ++i) q2[i] = qb[i] * qb[i];
        bool ok;
        if (bf16) {
          from_f32(DType::bf16, qb.data(), qb16.data(), size_t(bq) * size_t(d));
          from_f32(DType::bf16, q2.data(), q216.data(), size_t(bq) * size_t(d));
          ok = !failed.load(std::memory_order_relaxed) && mm->run_padded(qb16.data(), bq, cents16.data(), C, tile.data()) &&
               mm->run_padded(q216.data(), bq, vars16.data(), C, tile2.data());
        } else {
          ok = dnnl_sgemm('N', 'T', bq, C, d, 1.0f, qb.data(), d, cents.data(), d, 0.0f, tile.data(), C) == dnnl_success &&
               dnnl_sgemm('N', 'T', bq, C, d, 1.0f, q2.data(), d, vars.data(), d, 0.0f, tile2.data(), C) == dnnl_success;
        }
        if (!ok) {
          failed = true;
          continue;
        }
        add_spread(tile.data(), tile2.data(), size_t(bq) * size_t(ldc), float(kp.spread));
        for (int64_t i = 0; i < bq; ++i) {
          top.reset();
          scan_push(tile.data() + size_t(i) * size_t(ldc), int(C), 0, top);
          // The scan needs the best probe first, then the 2nd-8th, then the
          // rest, each group in any order.
          auto& best = top.unordered();
          best_then_group(best, 8);
          int32_t* dst = probe.data() + size_t(q0 + i) * size_t(P);
          for (int j = 0; j < P; ++j) dst[j] = size_t(j) < best.size() ? best[size_t(j)].id : -1;  // -1: unranked
        }
      }
    }
    if (failed) fail(Status::internal, "partitioned kNN: oneDNN GEMM failed");
  }
  const double probe_seconds = lap();

  // 3. Queries ordered by their best partition, in blocks; within a block,
  //    each probed partition against the block's queries that probe it (one
  //    GEMM: alike queries share most probes), each query keeping its best nq.
  std::vector<int64_t> order(static_cast<size_t>(Q));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return probe[size_t(a) * size_t(P)] < probe[size_t(b) * size_t(P)]; });
  // Blocks large enough that about 1024 of their queries probe each
  // partition (a block's queries share most probes): every block reads each
  // partition's keys from memory about three times (best probe, 2nd-8th,
  // the rest), so fewer, larger blocks read less. At 524288 keys, 2048-query
  // blocks left the best-probe GEMMs at 1-2 rows and took 1.6x the GEMM
  // time of 8192-query blocks; 16384 scanned 5-10% faster than 8192. The
  // block count is a multiple of the threads', so that they finish together
  // (32768-query blocks, 4 for 2 threads, were slower).
  constexpr int64_t kKChunk = 512;
  const int64_t target_block = std::clamp<int64_t>(1024 * C / std::max(1, P), 256, 16384);
  const int64_t team = std::max(1, threads);
  const int64_t blocks = ((Q + target_block - 1) / target_block + team - 1) / team * team;
  const int64_t kQBlock = std::max<int64_t>(1, (Q + blocks - 1) / blocks);
  // Rows per GEMM: a [kRowsPerGemm x kKChunk] tile of scores stays in L2.
  constexpr int64_t kRowsPerGemm = 256;
  const int64_t groups_per_block = 3 * C;
  std::vector<int32_t> knn(size_t(Q) * size_t(nq));
  std::vector<uint8_t> short_list(static_cast<size_t>(Q), 0);
  std::atomic<int64_t> done{0}, scanned{0};
  std::atomic<bool> failed{false};
#pragma omp parallel num_threads(threads)
  {
    const int64_t ldc_max = bf16 ? Bf16Scores::padded_cols(kKChunk) : kKChunk;
    std::vector<float> qsub(size_t(kRowsPerGemm) * size_t(d)), tile(size_t(kRowsPerGemm) * size_t(ldc_max));
    // The block's (group, query) pairs, by group, then query (a counting
    // sort): group c < C is partition c for the queries whose best probe it
    // is, C + c for those that rank it 2nd-8th, 2C + c for the rest. The
    // best probes go first: a query's threshold then starts near its k-th
    // best score and later partitions push few.
    std::vector<int32_t> group_start(size_t(groups_per_block) + 1), pair_query;
    std::vector<int64_t> limit(static_cast<size_t>(kQBlock));
    std::vector<TopK> tops;
    const std::unique_ptr<Bf16Scores> bf16_scores = bf16 ? Bf16Scores::make(d) : nullptr;
    if (bf16 && !bf16_scores) failed = true;
    std::vector<uint16_t> qsub16(bf16 ? size_t(kRowsPerGemm) * size_t(d) : 0);
    const auto group_of = [&](int j, int32_t partition) { return partition + int32_t(C) * (j == 0 ? 0 : j < 8 ? 1 : 2); };
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < blocks; ++b) {
      if (failed.load(std::memory_order_relaxed)) continue;
      const int64_t q0 = b * kQBlock, bq = std::min(kQBlock, Q - q0);
      if (bq <= 0) continue;
      std::fill(group_start.begin(), group_start.end(), 0);
      for (int64_t i = 0; i < bq; ++i) {
        const int64_t qi = order[size_t(q0 + i)];
        limit[size_t(i)] = causal_offset < 0 ? N : picked[size_t(qi)] - causal_offset;  // last visible row
        for (int j = 0; j < P; ++j)
          if (const int32_t pj = probe[size_t(qi) * size_t(P) + size_t(j)]; pj >= 0) ++group_start[size_t(group_of(j, pj)) + 1];
      }
      for (int64_t g = 0; g < groups_per_block; ++g) group_start[size_t(g) + 1] += group_start[size_t(g)];
      pair_query.resize(size_t(group_start.back()));
      {
        std::vector<int32_t> fill(group_start.begin(), group_start.end() - 1);
        for (int64_t i = 0; i < bq; ++i) {
          const int64_t qi = order[size_t(q0 + i)];
          for (int j = 0; j < P; ++j)
            if (const int32_t pj = probe[size_t(qi) * size_t(P) + size_t(j)]; pj >= 0)
              pair_query[size_t(fill[size_t(group_of(j, pj))]++)] = int32_t(i);
        }
      }
      tops.assign(size_t(bq), TopK(kept));
      int64_t keys_scanned = 0;
      for (int64_t group = 0; group < groups_per_block && !failed.load(std::memory_order_relaxed); ++group) {
        const int64_t c = group % C;
        const int64_t keys = pstart[size_t(c) + 1] - pstart[size_t(c)];
        keys_scanned += (group_start[size_t(group) + 1] - group_start[size_t(group)]) * keys;
        for (int64_t g0 = group_start[size_t(group)]; g0 < group_start[size_t(group) + 1]; g0 += kRowsPerGemm) {
          const int64_t nsub = std::min<int64_t>(kRowsPerGemm, group_start[size_t(group) + 1] - g0);
          for (int64_t i = 0; i < nsub; ++i) {
            const int64_t qi = order[size_t(q0 + pair_query[size_t(g0 + i)])];
            if (bf16)
              std::memcpy(qsub16.data() + size_t(i) * size_t(d), q16.data() + size_t(qi) * size_t(d), sizeof(uint16_t) * size_t(d));
            else
              std::memcpy(qsub.data() + size_t(i) * size_t(d), queries + size_t(picked[size_t(qi)]) * size_t(d),
                          sizeof(float) * size_t(d));
          }
          for (int64_t k0 = pstart[size_t(c)]; k0 < pstart[size_t(c) + 1]; k0 += kKChunk) {
            const int64_t bk = std::min(kKChunk, pstart[size_t(c) + 1] - k0);
            const int64_t ldc = bf16 ? Bf16Scores::padded_cols(bk) : bk;
            if (bf16 ? !bf16_scores->run_padded(qsub16.data(), nsub, kperm16.data() + size_t(k0) * size_t(d), bk, tile.data())
                     : dnnl_sgemm('N', 'T', nsub, bk, d, 1.0f, qsub.data(), d, kperm.data() + size_t(k0) * size_t(d), d,
                                  0.0f, tile.data(), bk) != dnnl_success) {
              failed = true;
              break;
            }
            for (int64_t i = 0; i < nsub; ++i) {
              const int32_t local = pair_query[size_t(g0 + i)];
              float* sc = tile.data() + size_t(i) * size_t(ldc);
              if (causal_offset >= 0)  // keys past the query's own position never rank
                for (int64_t j = 0; j < bk; ++j)
                  if (member[size_t(k0 + j)] > limit[size_t(local)]) sc[j] = -std::numeric_limits<float>::infinity();
              // Ids are positions in the copy, mapped back below.
              scan_push(sc, int(bk), int32_t(k0), tops[size_t(local)]);
            }
          }
        }
      }
      scanned += keys_scanned;
      for (int64_t i = 0; i < bq; ++i) {
        const int64_t qi = order[size_t(q0 + i)];
        // With bf16 the f32 re-rank below sorts: the kept set in any order.
        std::vector<ScoredId>& best = bf16 ? tops[size_t(i)].unordered() : tops[size_t(i)].sorted();
        if (bf16) {  // the kept candidates re-ranked by their f32 scores
          const float* q = queries + size_t(picked[size_t(qi)]) * size_t(d);
          // The rows are scattered over the keys: fetch a few ahead.
          constexpr size_t kAhead = 6;
          const auto fetch = [&](size_t j) {
            if (j < best.size()) prefetch_row(kf, member[size_t(best[j].id)]);
          };
          for (size_t j = 0; j < kAhead; ++j) fetch(j);
          for (size_t j = 0; j < best.size(); ++j) {
            fetch(j + kAhead);
            if (std::isfinite(best[j].score)) best[j].score = dot_row(q, kf, member[size_t(best[j].id)]);
          }
          sort_best(best);
        }
        int32_t* dst = knn.data() + size_t(qi) * size_t(nq);
        size_t got = 0;
        for (; got < best.size() && got < size_t(nq); ++got) {
          if (!std::isfinite(best[got].score)) break;
          dst[got] = member[size_t(best[got].id)];
        }
        if (got < size_t(nq)) short_list[size_t(qi)] = 1;
      }
      const int64_t finished = done.fetch_add(bq) + bq;
      if (step && omp_get_thread_num() == 0) step(0.1 + 0.85 * double(finished) / double(Q));
    }
  }
  if (failed) fail(Status::internal, "partitioned kNN: oneDNN GEMM failed");
  // 4. Queries whose probes held fewer than nq (visible, finite) keys: the
  //    exact scan (which also reports non-finite scores).
  std::vector<int64_t> rest;
  std::vector<int64_t> rest_at;
  for (int64_t i = 0; i < Q; ++i)
    if (short_list[size_t(i)]) {
      rest.push_back(picked[size_t(i)]);
      rest_at.push_back(i);
    }
  if (!rest.empty()) {
    const std::vector<int32_t> exact = exact_knn(kf, queries, rest, nq, threads, {}, causal_offset);
    for (size_t r = 0; r < rest.size(); ++r)
      std::copy_n(exact.begin() + std::ptrdiff_t(r * size_t(nq)), nq, knn.begin() + std::ptrdiff_t(size_t(rest_at[r]) * size_t(nq)));
    scanned += int64_t(rest.size()) * N;
  }
  if (stats) {
    *stats = KnnStats{};
    stats->partitions = C;
    stats->scanned_fraction = double(scanned.load()) / (double(Q) * double(N));
    stats->partition_seconds = partition_seconds;
    stats->probe_seconds = probe_seconds;
    stats->scan_seconds = lap();
    stats->key_partition = std::move(part);
  }
  report(1.0);
  return knn;
}

int knn_auto_probes(int64_t keys) {
  constexpr double kBase = 131072, kProbes = 64;
  return int(std::lround(kProbes * std::sqrt(std::max(1.0, double(keys) / kBase))));
}

std::vector<int32_t> cpu_training_knn(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked, int nq,
                                  const GraphBuildParams& p, const std::function<void(double)>& step,
                                  int64_t causal_offset, KnnStats* stats) {
  if (p.knn_cluster_keys > 0 && kf.rows >= p.knn_min_keys) {
    PartitionedKnnParams kp;
    kp.cluster_keys = p.knn_cluster_keys;
    kp.probes = p.knn_probes > 0 ? p.knn_probes : knn_auto_probes(kf.rows);
    kp.iterations = p.knn_iterations;
    kp.bf16 = p.knn_bf16;
    kp.seed = p.seed;
    return partitioned_knn(kf, queries, picked, nq, kp, p.threads, step, causal_offset, stats);
  }
  if (stats) *stats = KnnStats::exact(int64_t(picked.size()));
  return exact_knn(kf, queries, picked, nq, p.threads, step, causal_offset);
}

}  // namespace rattn::internal
