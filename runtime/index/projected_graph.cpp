// The projected bipartite graph: build, beam search, insert, save/load.
#include "runtime/index/projected_graph.h"

#include "core/finite.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include <dnnl.hpp>

#include "core/error.h"
#include "core/hash.h"
#include "core/rope.h"
#include "runtime/index/distance.h"
#include "runtime/index/graph_search.h"
#include "runtime/index/projected_codes.h"
#include "runtime/index/serial.h"
#include "runtime/index/topk.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rattn {
namespace internal {
namespace {

// Image versions: 1 = first layout; 2 adds the insert parameters after the
// build parameters; 3 adds the key metric (GraphBuildParams::key_metric) the
// insert path uses; 4 the training queries' second moment; 5 the key mean of
// centred relations (GraphBuildParams::center_keys), which insert subtracts.
// All load (older images get the defaults: plain metric, uncentred insert).
constexpr uint32_t kGraphVersion = 5;  // 4: + the training queries' second moment; 5: + the key mean
constexpr int32_t kAbsent = -1;  // count field of a node not (yet) in the index
constexpr int32_t kNoParent = -1;  // parent_ of a node no path from the entries reaches
constexpr int32_t kRoot = -2;      // parent_ of an entry point
constexpr float kUnknownWeakest = std::numeric_limits<float>::quiet_NaN();

// One candidate of the beam: 8 bytes, so merging moves less. While a
// search runs, the sign bit of `id` marks an expanded candidate (ids are
// below 2^31); the flags are cleared when the walk ends.
struct Cand {
  float score;
  int32_t id;
};
constexpr int32_t kExpandedBit = std::numeric_limits<int32_t>::min();

class GraphScratch final : public SearchScratch {
 public:
  // Visited set: one epoch byte per node, visited when it equals `epoch`;
  // a search starts by bumping the epoch (O(1)), and only a wrap (every 255
  // searches) clears the bytes. A bitmap is 8x smaller, but its
  // read-modify-write of shared words chained each neighbour's test to the
  // previous store: bytes searched 8-16% faster at T = 131072 and 25% at
  // T = 2048 (docs/performance.md).
  std::vector<uint8_t> visited;
  uint8_t epoch = 0;
  std::vector<Cand> pool;
  std::vector<int32_t> batch_ids;
  std::vector<float> batch_scores;
  std::vector<Cand> merge_buf;  // a batch's entries that can enter the pool
  std::vector<int> merge_pos;   // and where they land

  // State of one beam search between its steps (ProjectedGraph::start /
  // score_step / expand_step / rerank_*), so that search_many() can
  // interleave several searches on one thread.
  enum class Stage { score, rerank, done };
  Stage stage = Stage::done;
  const float* query = nullptr;
  bool codes = false;         // scoring on the index's traversal codes
  ScalarCodes::Query code_query;  // the query in the codes' terms
  const ScalarCodes* code_set = nullptr;  // the codes walked (own, shared or projected)
  std::vector<float> projected_query;     // the query projected (ProjectedCodes)
  int L = 0, width = 1, rerank = 0;
  // Patience stop (SearchParams::patience): expansions in a row that left the
  // k-th best score unchanged.
  int patience = 0, k = 0, quiet = 0;
  float kth = 0;
  int cursor = 0;             // pool entries before it are expanded
  // Partial expansion: a candidate expanded at pool position >= full_rank
  // scores only its first `first` neighbours (0: whole lists).
  int first = 0, full_rank = 0;
  int nb = 0;                 // rows of the pending batch (batch_ids)
  float bar = 0;              // a new key above it is expanded soon: its adjacency is requested
  int64_t scored = 0;

  void begin(int64_t nodes) {
    if (visited.size() < size_t(nodes)) visited.resize(size_t(nodes), 0);
    if (++epoch == 0) {
      std::fill(visited.begin(), visited.end(), uint8_t(0));
      epoch = 1;
    }
  }
  size_t memory_bytes() const override {
    return visited.capacity() + (pool.capacity() + merge_buf.capacity()) * sizeof(Cand) +
           batch_ids.capacity() * sizeof(int32_t) + (batch_scores.capacity() + projected_query.capacity()) * sizeof(float) +
           merge_pos.capacity() * sizeof(int) + code_query.qi.capacity() * sizeof(int16_t);
  }
  bool test_and_set(int32_t id) { return test_and_set(visited.data(), epoch, id); }
  // The same on a copy of the fields: the expansion loop passes locals, since
  // its byte stores could otherwise alias the scratch's fields (reloaded per
  // neighbour).
  static bool test_and_set(uint8_t* visited_bytes, uint8_t current, int32_t id) {
    const uint8_t v = visited_bytes[size_t(id)];
    visited_bytes[size_t(id)] = current;
    return v == current;
  }
};

// Keeps `stream` of ScoredId sorted best first, bounded to `cap` entries.
// Occlusion (RNG-style) pruning around `pivot`: candidates come ranked by
// their inner product with the pivot (best first); c is dropped when a kept
// neighbour r satisfies <c, r> > <c, pivot>, i.e. d(c, r) < d(c, pivot) with
// d = -<a, b>. Dropped candidates fill the remaining slots in rank order.
void occlusion_prune(const RowsView& kf, const std::vector<ScoredId>& ranked, int M, std::vector<int32_t>* out) {
  out->clear();
  std::vector<int32_t> dropped;
  for (const ScoredId& c : ranked) {
    if (int(out->size()) >= M) break;
    const float* cv = static_cast<const float*>(kf.row(c.id));
    bool occluded = false;
    for (int32_t r : *out) {
      if (dot_row(cv, kf, r) > c.score) {
        occluded = true;
        break;
      }
    }
    if (occluded) {
      dropped.push_back(c.id);
    } else {
      out->push_back(c.id);
    }
  }
  for (size_t i = 0; i < dropped.size() && int(out->size()) < M; ++i) out->push_back(dropped[i]);
}

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
// throughput of the former 2-thread 256 x 8192 tiles (whose 8 MB of scores
// went through memory and back), docs/performance.md.
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

// K L with S = L L' (Cholesky of the symmetric positive definite [d, d] S,
// float64, only its lower triangle read): keys whose plain inner products
// are k1' S k2. One oneDNN GEMM per thread's share of the rows.
std::vector<float> keys_times_cholesky(const RowsView& kf, std::vector<double> S, int threads) {
  const int d = kf.dim;
  const int64_t N = kf.rows;
  for (int j = 0; j < d; ++j) {
    double diag = S[size_t(j) * size_t(d) + size_t(j)];
    for (int k = 0; k < j; ++k) diag -= S[size_t(j) * size_t(d) + size_t(k)] * S[size_t(j) * size_t(d) + size_t(k)];
    const double ljj = std::sqrt(std::max(diag, 1e-300));
    S[size_t(j) * size_t(d) + size_t(j)] = ljj;
    for (int i = j + 1; i < d; ++i) {
      double v = S[size_t(i) * size_t(d) + size_t(j)];
      for (int k = 0; k < j; ++k) v -= S[size_t(i) * size_t(d) + size_t(k)] * S[size_t(j) * size_t(d) + size_t(k)];
      S[size_t(i) * size_t(d) + size_t(j)] = v / ljj;
    }
  }
  // (L' k)_j = sum_{i >= j} L[i][j] k_i.
  std::vector<float> Lt(size_t(d) * size_t(d), 0.0f);  // row j: column j of L
  for (int j = 0; j < d; ++j)
    for (int i = j; i < d; ++i) Lt[size_t(j) * size_t(d) + size_t(i)] = float(S[size_t(i) * size_t(d) + size_t(j)]);
  std::vector<float> out(size_t(N) * size_t(d));
  std::atomic<bool> failed{false};
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t r0 = N * t / nt, r1 = N * (t + 1) / nt;
    if (r1 > r0 && dnnl_sgemm('N', 'T', r1 - r0, d, d, 1.0f, static_cast<const float*>(kf.row(r0)), d, Lt.data(), d,
                              0.0f, out.data() + size_t(r0) * size_t(d), d) != dnnl_success)
      failed = true;
  }
  if (failed) fail(Status::internal, "projected graph: oneDNN sgemm failed");
  return out;
}

// Keys transformed so that plain inner products give k1' S k2, with S the
// second moment (centered: the covariance) of the picked queries plus a small
// ridge: rows L' k with S = L L' (Cholesky).
// `alignment` receives d * tr(S_c K) / (tr(S_c) tr(K)) with S_c the query
// covariance and K the key covariance: 1 when keys vary as much in the
// directions queries vary in as elsewhere, << 1 when most key variance lies
// in directions queries ignore (a diagnostic: it did not predict on which
// data the metric helps).
std::vector<float> query_metric_keys(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                                     bool centered, double ridge_share, int threads, double* alignment,
                                     std::vector<float>* metric) {
  const int d = kf.dim;
  const int64_t Q = int64_t(picked.size()), N = kf.rows;
  {
    // Covariances from at most 8192 evenly spaced queries / keys.
    const auto cov = [&](int64_t n, const auto& row) {
      const int64_t step = std::max<int64_t>(1, n / 8192);
      std::vector<double> m(static_cast<size_t>(d), 0.0), c(size_t(d) * size_t(d), 0.0);
      int64_t cnt = 0;
      for (int64_t i = 0; i < n; i += step, ++cnt)
        for (int j = 0; j < d; ++j) m[size_t(j)] += row(i)[j];
      for (auto& x : m) x /= double(std::max<int64_t>(1, cnt));
      std::vector<double> x(static_cast<size_t>(d));
      for (int64_t i = 0; i < n; i += step) {
        for (int j = 0; j < d; ++j) x[size_t(j)] = row(i)[j] - m[size_t(j)];
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b) c[size_t(a) * size_t(d) + size_t(b)] += x[size_t(a)] * x[size_t(b)];
      }
      return c;
    };
    // The two covariances on two threads (a diagnostic; each is serial).
    std::vector<double> sq, sk;
#pragma omp parallel sections num_threads(std::min(threads, 2))
    {
#pragma omp section
      sq = cov(Q, [&](int64_t i) { return queries + size_t(picked[size_t(i)]) * size_t(d); });
#pragma omp section
      sk = cov(N, [&](int64_t i) { return static_cast<const float*>(kf.row(i)); });
    }
    double tq = 0, tk = 0, tqk = 0;
    for (int a = 0; a < d; ++a) {
      tq += sq[size_t(a) * size_t(d) + size_t(a)];
      tk += sk[size_t(a) * size_t(d) + size_t(a)];
    }
    for (size_t i = 0; i < sq.size(); ++i) tqk += sq[i] * sk[i];
    *alignment = tq > 0 && tk > 0 ? double(d) * tqk / (tq * tk) : 1.0;
  }
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  if (centered)
    for (int64_t i = 0; i < Q; ++i)
      for (int j = 0; j < d; ++j) mean[size_t(j)] += queries[size_t(picked[size_t(i)]) * size_t(d) + size_t(j)] / double(Q);
  std::vector<double> S(size_t(d) * size_t(d), 0.0);
#pragma omp parallel num_threads(threads)
  {
    std::vector<double> local(size_t(d) * size_t(d), 0.0), x(static_cast<size_t>(d));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < Q; ++i) {
      const float* q = queries + size_t(picked[size_t(i)]) * size_t(d);
      for (int j = 0; j < d; ++j) x[size_t(j)] = q[j] - mean[size_t(j)];
      for (int a = 0; a < d; ++a)
        for (int b = 0; b <= a; ++b) local[size_t(a) * size_t(d) + size_t(b)] += x[size_t(a)] * x[size_t(b)];
    }
#pragma omp critical
    for (size_t k = 0; k < S.size(); ++k) S[k] += local[k];
  }
  double trace = 0;
  for (int a = 0; a < d; ++a) trace += S[size_t(a) * size_t(d) + size_t(a)];
  const double ridge = ridge_share * trace / double(d) + 1e-12;
  for (int a = 0; a < d; ++a) S[size_t(a) * size_t(d) + size_t(a)] += ridge;
  // S itself (full, scaled to unit trace) for the insert path.
  metric->assign(size_t(d) * size_t(d), 0.0f);
  for (int a = 0; a < d; ++a)
    for (int b = 0; b <= a; ++b)
      (*metric)[size_t(a) * size_t(d) + size_t(b)] = (*metric)[size_t(b) * size_t(d) + size_t(a)] =
          float(S[size_t(a) * size_t(d) + size_t(b)] / (trace + double(d) * ridge));
  return keys_times_cholesky(kf, std::move(S), threads);
}

// Rows of fp32 `kf` minus `mean` ([d]).
std::vector<float> keys_minus(const RowsView& kf, const std::vector<float>& mean, int threads) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  std::vector<float> out(size_t(N) * size_t(d));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* r = static_cast<const float*>(kf.row(i));
    float* o = out.data() + size_t(i) * size_t(d);
    for (int j = 0; j < d; ++j) o[j] = r[j] - mean[size_t(j)];
  }
  return out;
}

// The keys minus their mean, for the plain key metric's key-to-key relations.
// A query ranks k and k + c alike for any common offset c, but <k1, k2> is
// dominated by |mean|^2 + <mean, k1 + k2> when the keys share a large mean
// (Gemma-3 270M layer 11: |mean| 107 against |k - mean| 78), so every
// projection, pruning and fill pass prefers the keys furthest along the
// mean over the keys that score alike; centred, <k1 - m, k2 - m> measures
// how alike two keys are (docs/index.md).
std::vector<float> centered_keys(const RowsView& kf, int threads, std::vector<float>* mean_out) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const float* r = static_cast<const float*>(kf.row(i));
    for (int j = 0; j < d; ++j) mean[size_t(j)] += r[j];
  }
  std::vector<float> m(static_cast<size_t>(d));
  for (int j = 0; j < d; ++j) m[size_t(j)] = float(mean[size_t(j)] / double(N));
  *mean_out = m;
  return keys_minus(kf, m, threads);
}

// Wall and process CPU time between marks, for GraphInfo::build_phases.
class PhaseClock {
 public:
  explicit PhaseClock(std::vector<BuildPhase>* out) : out_(out) {
    out_->clear();
    last_wall_ = wall();
    last_cpu_ = cpu();
  }
  void mark(const char* name) {
    const double w = wall(), c = cpu();
    out_->push_back({name, w - last_wall_, c - last_cpu_});
    last_wall_ = w;
    last_cpu_ = c;
  }

 private:
  static double wall() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  static double cpu() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  std::vector<BuildPhase>* out_;
  double last_wall_, last_cpu_;
};

}  // namespace

class ProjectedGraph final : public KeyIndex {
 public:
  ProjectedGraph(int M, int slots, int build_queue, int query_neighbors, std::shared_ptr<CpuKernels> kernels)
      : M_(M), slots_(slots), stride_(slots + 1), build_queue_(build_queue), query_neighbors_(query_neighbors),
        distance_(make_distance(std::move(kernels))) {}

  // ---- adjacency arena: per node [count | ids[slots]] ----
  int32_t* node(int64_t i) { return arena_.data() + size_t(i) * size_t(stride_); }
  const int32_t* node(int64_t i) const { return arena_.data() + size_t(i) * size_t(stride_); }
  int64_t nodes() const { return int64_t(arena_.size()) / stride_; }
  void resize_nodes(int64_t n) { arena_.resize(size_t(n) * size_t(stride_), 0); }
  void set_neighbors(int64_t i, const std::vector<int32_t>& ids) {
    int32_t* p = node(i);
    const int n = std::min<int>(int(ids.size()), slots_);
    p[0] = n;
    std::copy(ids.begin(), ids.begin() + n, p + 1);
    if (size_t(i) < weakest_.size()) weakest_[size_t(i)] = kUnknownWeakest;
  }

  std::unique_ptr<SearchScratch> make_scratch() const override { return std::make_unique<GraphScratch>(); }

  void search(const float* query, const RowsView& keys, const SearchParams& params, SearchScratch& scratch_base,
              SearchResult& out) const override {
    auto& s = static_cast<GraphScratch&>(scratch_base);
    start_search(query, keys, params, s);
    while (s.stage != GraphScratch::Stage::done) step(keys, s);
    finish_search(params, s, out);
  }

  // Validates the parameters and starts a search in `s` (search_many too).
  void start_search(const float* query, const RowsView& keys, const SearchParams& params, GraphScratch& s) const {
    if (params.k <= 0) fail(Status::invalid_argument, "projected graph: k must be positive");
    if (params.expand_width < 1 || params.expand_width > 64)
      fail(Status::invalid_argument, "projected graph: expand_width must be in [1, 64]");
    if (keys.rows < nodes()) fail(Status::invalid_argument, "projected graph: key store has fewer rows than the index");
    if (params.code_dims < 0 || params.code_dims > keys.dim)
      fail(Status::invalid_argument, "projected graph: code_dims must be in [0, head_dim]");
    if (params.code_coarse_dims < 0 || params.code_coarse_dims > params.code_dims)
      fail(Status::invalid_argument, "projected graph: code_coarse_dims must be in [0, code_dims]");
    const ProjectedCodes* projected = nullptr;
    if (params.traversal_codes) {
      // code_dims = d with coarse dims: projected too (the raw keys' dims have no order of importance).
      if (params.code_dims > 0 && (params.code_dims < keys.dim || params.code_coarse_dims > 0))
        projected = ensure_projected_codes(keys, {params.code_dims, params.code_coarse_dims});
      else ensure_codes(keys);
    }
    if (params.rerank < 0) fail(Status::invalid_argument, "projected graph: rerank must be >= 0");
    if (params.num_seeds < 0 || (params.num_seeds > 0 && !params.seeds))
      fail(Status::invalid_argument, "projected graph: num_seeds must be >= 0, with seeds when > 0");
    if (params.expand_first < 0 || params.full_expand_rank < 0)
      fail(Status::invalid_argument, "projected graph: expand_first and full_expand_rank must be >= 0");
    start(query, keys, std::max(params.queue_length, params.k), params.expand_width, params.traversal_codes, s,
          projected, params.seeds, params.num_seeds);
    s.rerank = params.rerank > 0 ? std::max(params.rerank, params.k) : params.k + std::max(16, params.k / 4);
    if (params.patience < 0) fail(Status::invalid_argument, "projected graph: patience must be >= 0");
    s.patience = params.patience;
    s.k = params.k;
    s.first = params.expand_first;  // past a list's length: the whole list (min in expand_step)
    s.full_rank = params.full_expand_rank > 0 ? std::min(params.full_expand_rank, s.L) : s.L;
  }

  // One step of a started search: scores the pending batch and requests the
  // next one, or (codes) re-ranks the final pool.
  void step(const RowsView& keys, GraphScratch& s) const {
    if (s.stage == GraphScratch::Stage::score) {
      score_step(keys, s);
      if (!expand_step(keys, s)) {
        for (Cand& c : s.pool) c.id &= ~kExpandedBit;
        if (s.codes) {
          rerank_request(keys, s);
          s.stage = GraphScratch::Stage::rerank;
        } else {
          s.stage = GraphScratch::Stage::done;
        }
      }
    } else if (s.stage == GraphScratch::Stage::rerank) {
      rerank_finish(keys, s);
      s.stage = GraphScratch::Stage::done;
    }
  }

  static void finish_search(const SearchParams& params, const GraphScratch& s, SearchResult& out) {
    out.keys_scored = s.scored;
    const int n = std::min<int>(params.k, int(s.pool.size()));
    out.ids.resize(size_t(n));
    out.scores.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      out.ids[size_t(i)] = s.pool[size_t(i)].id;
      out.scores[size_t(i)] = s.pool[size_t(i)].score;
    }
  }

  // Best-first beam search on the exact keys (the build and insert paths);
  // leaves the best L candidates (best first) in s.pool and returns the
  // number of keys scored.
  int64_t beam_search(const float* query, const RowsView& keys, int L, GraphScratch& s) const {
    start(query, keys, L, 1, false, s);
    while (s.stage != GraphScratch::Stage::done) step(keys, s);
    return s.scored;
  }

  // The beam search as steps. Each scored key is a random row (of the key
  // store, or of the codes), so memory latency dominates: a step requests
  // all rows of its batch before the first inner product (and the exact
  // path again a few rows ahead inside Distance::dots), and the adjacency of
  // the next candidates - and of any new key that beats them - is requested
  // before it is read. A step expands the best `width` unexpanded candidates
  // together (their rows' latencies overlap). search_many() runs other
  // searches' steps between a step's request and its inner products.
  // Speculatively fetching the next candidate's neighbour rows measured
  // slower on the shared machine (wasted bandwidth) and is not done.
  void start(const float* query, const RowsView& keys, int L, int width, bool codes, GraphScratch& s,
             const ProjectedCodes* projected = nullptr, const int32_t* seeds = nullptr, int n_seeds = 0) const {
    s.begin(nodes());
    s.pool.clear();
    s.pool.reserve(size_t(L) + 1);
    const size_t cap = size_t(slots_) * size_t(width) + entries_.size() + size_t(n_seeds);
    if (s.batch_ids.size() < cap) {
      s.batch_ids.resize(cap);
      s.batch_scores.resize(cap);
    }
    if (s.merge_buf.size() < cap) {
      s.merge_buf.resize(cap);
      s.merge_pos.resize(cap);
    }
    s.query = query;
    s.L = L;
    s.width = width;
    s.codes = codes;
    s.rerank = 0;
    s.scored = 0;
    s.cursor = 0;
    s.first = 0;
    s.full_rank = L;
    s.patience = 0;
    s.quiet = 0;
    s.kth = std::numeric_limits<float>::quiet_NaN();
    s.code_set = nullptr;
    if (codes && projected) {
      s.projected_query.resize(size_t(projected->dims()));
      projected->project_query(query, s.projected_query.data());
      s.code_set = &projected->codes();
    } else if (codes) {
      s.code_set = &traversal_codes().codes();
    }
    if (codes) s.code_set->prepare_query(projected ? s.projected_query.data() : query, &s.code_query);
    int nb = 0;
    auto offer = [&](int32_t e) {
      if (s.test_and_set(e)) return;
      request_row(keys, s, e);
      s.batch_ids[size_t(nb++)] = e;
    };
    for (int32_t e : entries_) offer(e);
    for (int i = 0; i < n_seeds; ++i)  // seeds come from outside: only ids of present nodes
      if (seeds[i] >= 0 && seeds[i] < nodes() && node(seeds[i])[0] != kAbsent) offer(seeds[i]);
    s.nb = nb;
    s.bar = -std::numeric_limits<float>::infinity();
    s.stage = GraphScratch::Stage::score;
  }

  void request_row(const RowsView& keys, const GraphScratch& s, int32_t id) const {
    if (s.codes) s.code_set->prefetch(id);
    else prefetch_row(keys, id);
  }

  void fetch_node(int32_t id) const {
    prefetch_span<3>(node(id), size_t(stride_) * sizeof(int32_t));
  }

  // Merges a scored batch into the pool (best first, at most L): the same
  // pool as inserting its entries one by one in sorted order (equal scores
  // after the entries already there, then in batch order), but one pass over
  // the pool's tail instead of a search and a move per entry. Returns the
  // position of the best new entry (pool size when none stayed).
  static int merge_batch(GraphScratch& s, const float* bsc, const int32_t* bids, int nb) {
    auto& pool = s.pool;
    const int size = int(pool.size()), L = s.L;
    // Entries that can enter, sorted best first (stable: insertion sort of a few).
    Cand* in = s.merge_buf.data();
    int c = 0;
    const bool full = size >= L;
    const float floor = full ? pool[size_t(size - 1)].score : 0.0f;
    for (int i = 0; i < nb; ++i) {
      if (full && !(bsc[i] > floor)) continue;
      int j = c++;
      while (j > 0 && in[j - 1].score < bsc[i]) {
        in[j] = in[j - 1];
        --j;
      }
      in[j] = {bsc[i], bids[i]};
    }
    if (c == 0) return size;
    // Where each lands in the current pool: after the entries scoring at
    // least as much (branch-free halving; non-decreasing in j).
    int* pos = s.merge_pos.data();
    const Cand* p0 = pool.data();
    for (int j = 0; j < c; ++j) {
      const Cand* base = p0;
      int n = size;
      while (n > 1) {
        const int half = n / 2;
        base = base[half - 1].score >= in[j].score ? base + half : base;
        n -= half;
      }
      pos[j] = int(base - p0) + (n == 1 && base->score >= in[j].score ? 1 : 0);
    }
    // The pool's blocks between landing points move right (the last block
    // first, so nothing unread is overwritten), clipped at the new size.
    const int new_size = std::min(size + c, L);
    pool.resize(size_t(new_size));
    Cand* p = pool.data();
    for (int j = c - 1; j >= 0; --j) {
      const int from = pos[j], end = j == c - 1 ? size : pos[j + 1], dst = from + j + 1;
      const int n_move = std::min(end - from, new_size - dst);
      if (n_move > 0) std::memmove(p + dst, p + from, sizeof(Cand) * size_t(n_move));
      if (from + j < new_size) p[from + j] = in[j];
    }
    return pos[0] < new_size ? pos[0] : size;
  }

  // Scores the pending batch and offers it to the pool.
  void score_step(const RowsView& keys, GraphScratch& s) const {
    const int nb = s.nb;
    if (nb == 0) return;
    const int32_t* bids = s.batch_ids.data();
    float* bsc = s.batch_scores.data();
    if (s.codes) s.code_set->dots(s.code_query, bids, nb, bsc);
    else distance_->dots(s.query, keys, bids, nb, bsc);
    s.scored += nb;
    for (int i = 0; i < nb; ++i)
      if (bsc[i] > s.bar) fetch_node(bids[i]);
    s.cursor = std::min(s.cursor, merge_batch(s, bsc, bids, nb));
    s.nb = 0;
  }

  // Expands the best s.width unexpanded candidates: their unvisited
  // neighbours become the pending batch, whose rows are requested. Returns
  // false when every candidate is expanded.
  bool expand_step(const RowsView& keys, GraphScratch& s) const {
    auto& pool = s.pool;
    const int size = int(pool.size());
    int j = s.cursor;
    while (j < size && pool[size_t(j)].id < 0) ++j;
    if (j >= size) return false;
    if (s.patience > 0 && size >= s.k) {
      const float kth = pool[size_t(s.k - 1)].score;
      if (kth != s.kth) {
        s.kth = kth;
        s.quiet = 0;
      } else if (++s.quiet > s.patience) {
        return false;  // the top k settled: stop before expanding the rest
      }
    }
    s.cursor = j;
    int32_t* bids = s.batch_ids.data();
    int nb = 0;
    for (int taken = 0; taken < s.width && j < size;) {
      const int32_t* nbr = node(pool[size_t(j)].id);
      pool[size_t(j)].id |= kExpandedBit;
      ++taken;
      // Ranked below full_rank: its first s.first neighbours only. A rank
      // only falls while the walk runs (better keys enter above it), so the
      // rest of such a list would never be taken later.
      const int cnt = nbr[0], hi = s.first > 0 && j >= s.full_rank ? std::min(s.first, cnt) : cnt;
      uint8_t* const visited = s.visited.data();
      const uint8_t epoch = s.epoch;
      for (int i = 1; i <= hi; ++i) {
        const int32_t id = nbr[i];
        bids[nb] = id;
        nb += GraphScratch::test_and_set(visited, epoch, id) ? 0 : 1;
      }
      ++j;
      while (j < size && pool[size_t(j)].id < 0) ++j;
    }
    for (int i = 0; i < nb; ++i) request_row(keys, s, bids[i]);
    // The next step expands the next `width` unexpanded candidates unless
    // this batch brings better ones.
    float bar = -std::numeric_limits<float>::infinity();
    int found = 0;
    for (; j < size && found < s.width; ++j) {
      if (pool[size_t(j)].id < 0) continue;
      fetch_node(pool[size_t(j)].id);
      bar = pool[size_t(j)].score;
      ++found;
    }
    if (found < s.width) bar = size >= s.L ? pool.back().score : -std::numeric_limits<float>::infinity();
    s.bar = bar;
    s.nb = nb;
    return true;
  }

  // Re-ranking of the final pool (codes; its best s.rerank when set): its
  // rows of the exact keys are requested here and scored in rerank_finish().
  void rerank_request(const RowsView& keys, GraphScratch& s) const {
    if (s.rerank > 0 && int(s.pool.size()) > s.rerank) s.pool.resize(size_t(s.rerank));
    const int n = int(s.pool.size());
    if (s.batch_ids.size() < size_t(n)) {
      s.batch_ids.resize(size_t(n));
      s.batch_scores.resize(size_t(n));
    }
    for (int i = 0; i < n; ++i) {
      s.batch_ids[size_t(i)] = s.pool[size_t(i)].id;
      prefetch_row(keys, s.pool[size_t(i)].id);
    }
  }

  // Exact scores for the pool, best first (ties by id); keys_scored is
  // unchanged: these keys were already counted.
  void rerank_finish(const RowsView& keys, GraphScratch& s) const {
    const int n = int(s.pool.size());
    distance_->dots(s.query, keys, s.batch_ids.data(), n, s.batch_scores.data());
    for (int i = 0; i < n; ++i) s.pool[size_t(i)].score = s.batch_scores[size_t(i)];
    std::sort(s.pool.begin(), s.pool.end(),
              [](const Cand& a, const Cand& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); });
  }

  // Fits the index's own traversal codes on first use, and extends them to
  // keys inserted since. search() is const and may run on several threads at
  // once (never concurrently with insert): the first caller encodes, the
  // others wait. Shared codes are the owner's to update: a search finding
  // them behind the index fails rather than rewrite rows that searches of
  // the other indexes may be reading.
  void ensure_codes(const RowsView& keys) const {
    if (shared_codes_) {
      const ScalarCodes& c = shared_codes_->codes();
      if (shared_codes_->rows() < nodes() || (c.fitted() && c.dim() != keys.dim))
        fail(Status::internal, "projected graph: the shared traversal codes cover " +
                                   std::to_string(shared_codes_->rows()) + " keys of dim " + std::to_string(c.dim()) +
                                   ", the index " + std::to_string(nodes()) + " of dim " + std::to_string(keys.dim) +
                                   ": their owner must update them before searching");
      return;
    }
    if (own_codes_.rows() >= nodes()) return;
    own_codes_.update(keys, nodes());
  }

  // The projected codes of one shape (directions, and how many of the last
  // are 4-bit): one set per shape, kept until the index is destroyed, so a
  // concurrent search's pointer stays valid; fitted on first use and
  // extended like the raw codes.
  using CodeShape = std::pair<int, int>;
  const ProjectedCodes* ensure_projected_codes(const RowsView& keys, CodeShape shape) const {
    std::lock_guard<std::mutex> lock(codes_mutex_);
    auto& slot = projected_codes_[shape];
    if (!slot) slot = std::make_unique<ProjectedCodes>();
    if (slot->rows() < nodes() || !slot->fitted()) update_projected(keys, *slot, shape);
    return slot.get();
  }
  void update_projected(const RowsView& keys, ProjectedCodes& pc, CodeShape shape) const {
    if (!pc.fitted() || nodes() >= 2 * std::max<int64_t>(pc.fitted_rows(), 8))
      pc.fit(keys, nodes(), query_moment_.size() == size_t(keys.dim) * size_t(keys.dim) ? query_moment_ : std::vector<float>{},
             shape.first, shape.second);
    else pc.append(keys, nodes());
  }

  const SharedTraversalCodes& traversal_codes() const { return shared_codes_ ? *shared_codes_ : own_codes_; }

  bool attach_traversal_codes(std::shared_ptr<SharedTraversalCodes> codes) override {
    shared_codes_ = std::move(codes);
    own_codes_.clear();
    return true;
  }

  // A beam search with the token's own query (its training query, as in the
  // build) and a short queue: the hits are the query's projected list; a
  // short local search with the key adds its key-to-key neighbours.
  // Out-edges: the M hits with the highest inner product with the new key.
  // In-edges: from the query's best `insert_pivots` hits (pivots; the first
  // always, replacing its weakest non-tree edge when full) and from the
  // `insert_reverse` best out-neighbours (reverse edges, taken only when a
  // slot is free or the new key beats the node's weakest neighbour). No
  // re-pruning: at most insert_pivots + insert_reverse lists are touched.
  void insert(int32_t key_id, const float* own_query, const RowsView& keys) override {
    insert_hinted(key_id, own_query, keys, nullptr, 0);
  }

  void insert_hinted(int32_t key_id, const float* own_query, const RowsView& keys, const int32_t* hint_ids,
                     int n_hints) override {
    if (key_id < 0 || key_id >= keys.rows)
      fail(Status::invalid_argument, "projected graph: insert of key " + std::to_string(key_id) + " not in the key store");
    if (key_id < nodes() && node(key_id)[0] != kAbsent)
      fail(Status::invalid_argument, "projected graph: key " + std::to_string(key_id) + " is already indexed");
    if (!own_query) fail(Status::invalid_argument, "projected graph: insert needs the token's own query");
    if (key_id >= nodes()) {
      const int64_t old = nodes();
      resize_nodes(int64_t(key_id) + 1);
      for (int64_t i = old; i < nodes(); ++i) node(i)[0] = kAbsent;
      parent_.resize(size_t(nodes()), kNoParent);
    }
    weakest_.resize(size_t(nodes()), kUnknownWeakest);
    node(key_id)[0] = 0;
    ++size_;
    // Insert never runs concurrently with search; shared codes are their owner's.
    if (!shared_codes_ && own_codes_.codes().fitted()) own_codes_.update(keys, nodes());
    for (auto& [shape, pc] : projected_codes_) update_projected(keys, *pc, shape);
    if (entries_.empty()) {  // first node of an empty graph
      entries_.push_back(key_id);
      parent_[size_t(key_id)] = kRoot;
      return;
    }
    std::vector<float>& x = insert_key_;
    x.resize(size_t(keys.dim));
    to_f32(keys.dtype, keys.row(key_id), x.data(), x.size());
    if (!metric_.empty()) {
      // Key-to-key relations in the build's metric: <S x, k> = x' S k.
      if (metric_.size() != size_t(keys.dim) * size_t(keys.dim))
        fail(Status::invalid_argument, "projected graph: key store dimension does not match the graph's key metric");
      std::vector<float>& xs = insert_metric_key_;
      xs.assign(size_t(keys.dim), 0.0f);
      for (int a = 0; a < keys.dim; ++a) {
        const float* row = metric_.data() + size_t(a) * size_t(keys.dim);
        float acc = 0;
        for (int b = 0; b < keys.dim; ++b) acc += row[b] * x[size_t(b)];
        xs[size_t(a)] = acc;
      }
      x.swap(xs);
    } else if (!key_mean_.empty()) {
      // Centred key relations (the build's center_keys): <x - m, k> orders
      // the keys as <x - m, k - m> does.
      if (key_mean_.size() != size_t(keys.dim))
        fail(Status::invalid_argument, "projected graph: key store dimension does not match the graph's key mean");
      for (int j = 0; j < keys.dim; ++j) x[size_t(j)] -= key_mean_[size_t(j)];
    }
    int64_t metric_cost = metric_.empty() ? 0 : keys.dim;  // the matrix-vector product: d inner products
    GraphScratch& s = insert_scratch_;
    const int64_t edge_scored_before = edge_scored_;
    int64_t scored = metric_cost;
    // Seeds: the entry points and the previously inserted key (decoded tokens
    // arrive in order, and neighbours in position are often neighbours).
    // entries_ may change here: insert never runs concurrently with search.
    const size_t n_entries = entries_.size();
    const bool chain = last_inserted_ >= 0 && last_inserted_ < nodes() && node(last_inserted_)[0] != kAbsent &&
                       std::find(entries_.begin(), entries_.end(), last_inserted_) == entries_.end();
    std::vector<int32_t>& hits = insert_hits_;
    hits.clear();
    // Hints: the own query's hits from an earlier search (the decode step's),
    // best first; they replace the own-query search, the costliest part.
    for (int i = 0; hint_ids && i < n_hints && int(hits.size()) < insert_queue_; ++i) {
      const int32_t id = hint_ids[i];
      if (id != key_id && id >= 0 && id < nodes() && node(id)[0] != kAbsent &&
          std::find(hits.begin(), hits.end(), id) == hits.end())
        hits.push_back(id);
    }
    if (hits.empty()) {
      if (chain) entries_.push_back(last_inserted_);
      scored += beam_search(own_query, keys, insert_queue_, s);
      entries_.resize(n_entries);
      for (const Cand& c : s.pool)
        if (c.id != key_id) hits.push_back(c.id);
    }
    const size_t query_hits = hits.size();
    std::vector<float>& sc = insert_scores_;
    sc.resize(hits.size());
    distance_->dots(x.data(), keys, hits.data(), int(hits.size()), sc.data());
    scored += int64_t(hits.size());
    if (insert_key_queue_ > 0 && !hits.empty()) {
      // The key's own neighbours too, so that queries aimed at this key (not
      // at its own query's region) find a way in: a short local search with
      // the key, seeded from the hits nearest to it and the previous key.
      std::vector<int32_t> seeds;
      for (int r = 0; r < 2; ++r) {
        int best = -1;
        for (size_t i = 0; i < query_hits; ++i)
          if ((best < 0 || sc[i] > sc[size_t(best)]) && std::find(seeds.begin(), seeds.end(), hits[i]) == seeds.end())
            best = int(i);
        if (best >= 0) seeds.push_back(hits[size_t(best)]);
      }
      if (chain && std::find(seeds.begin(), seeds.end(), last_inserted_) == seeds.end()) seeds.push_back(last_inserted_);
      entries_.swap(seeds);
      scored += beam_search(x.data(), keys, insert_key_queue_, s);
      entries_.swap(seeds);
      for (const Cand& c : s.pool)
        if (c.id != key_id && std::find(hits.begin(), hits.begin() + std::ptrdiff_t(query_hits), c.id) ==
                                  hits.begin() + std::ptrdiff_t(query_hits)) {
          hits.push_back(c.id);
          sc.push_back(c.score);  // already <key, c>
        }
    }
    last_inserted_ = key_id;
    if (hits.empty()) {
      link_anywhere(key_id);
      insert_scored_ += scored;
      ++inserts_;
      return;
    }
    std::vector<ScoredId>& ranked = insert_ranked_;
    ranked.clear();
    for (size_t i = 0; i < hits.size(); ++i) ranked.push_back({sc[i], hits[i]});
    const size_t keep = std::min(ranked.size(), size_t(M_));
    std::partial_sort(ranked.begin(), ranked.begin() + std::ptrdiff_t(keep), ranked.end(), better);
    int32_t* own = node(key_id);
    own[0] = int32_t(keep);
    weakest_[size_t(key_id)] = kUnknownWeakest;
    for (size_t i = 0; i < keep; ++i) own[i + 1] = ranked[i].id;
    add_in_edge(keys, hits[0], key_id, /*force=*/true);
    for (size_t i = 1; i < query_hits && int(i) < insert_pivots_; ++i) add_in_edge(keys, hits[i], key_id, /*force=*/false);
    for (size_t i = 0; i < keep && int(i) < insert_reverse_; ++i) add_in_edge(keys, ranked[i].id, key_id, /*force=*/false);
    if (parent_[size_t(key_id)] == kNoParent) link_anywhere(key_id);
    insert_scored_ += scored + (edge_scored_ - edge_scored_before);
    ++inserts_;
  }

  int64_t size() const override { return size_; }
  size_t memory_bytes() const override {
    return (arena_.capacity() + entries_.capacity() + parent_.capacity() + metric_.capacity() + weakest_.capacity()) *
               sizeof(int32_t) +
           own_codes_.memory_bytes() + projected_code_bytes() +
           (query_moment_.capacity() + key_mean_.capacity()) * sizeof(float) +
           sizeof(*this);  // shared codes: their owner counts them
  }
  size_t projected_code_bytes() const {
    std::lock_guard<std::mutex> lock(codes_mutex_);
    size_t b = 0;
    for (const auto& [shape, pc] : projected_codes_) b += pc->memory_bytes();
    return b;
  }

  void serialize(std::string* out) const override {
    ByteWriter w;
    w.put<int32_t>(M_);
    w.put<int32_t>(slots_);
    w.put<int32_t>(build_queue_);
    w.put<int32_t>(query_neighbors_);
    w.put<int32_t>(insert_queue_);
    w.put<int32_t>(insert_pivots_);
    w.put<int32_t>(insert_reverse_);
    w.put<int32_t>(insert_key_queue_);
    w.put_vec(metric_);
    w.put_vec(query_moment_);
    w.put_vec(key_mean_);
    w.put<int64_t>(size_);
    w.put<int64_t>(unreached_before_repair_);
    w.put<int64_t>(unreachable_);
    w.put_vec(entries_);
    w.put_vec(arena_);
    append_index_image(out, IndexKind::projected_graph, kGraphVersion, w.bytes());
  }

  static std::unique_ptr<ProjectedGraph> load(std::string_view payload, uint32_t version) {
    ByteReader r(payload);
    const int32_t M = r.get<int32_t>(), slots = r.get<int32_t>(), bq = r.get<int32_t>(), nq = r.get<int32_t>();
    if (M < 1 || slots < M || slots > 4096 || bq < 1 || bq > (1 << 20) || nq < 1 || nq > (1 << 20))
      fail(Status::corrupt_data, "projected graph image: bad parameters");
    auto g = std::make_unique<ProjectedGraph>(M, slots, bq, nq, nullptr);
    if (version >= 2) {
      const int32_t iq = r.get<int32_t>(), ip = r.get<int32_t>(), ir = r.get<int32_t>(), ik = r.get<int32_t>();
      if (iq < 1 || iq > (1 << 20) || ip < 1 || ip > (1 << 20) || ir < 0 || ir > (1 << 20) || ik < 0 || ik > (1 << 20))
        fail(Status::corrupt_data, "projected graph image: bad insert parameters");
      g->set_insert_params(iq, ip, ir, ik);
    }
    if (version >= 3) {
      g->metric_ = r.get_vec<float>(uint64_t(4096) * 4096);
      const auto side = uint64_t(std::llround(std::sqrt(double(g->metric_.size()))));
      if (side * side != g->metric_.size()) fail(Status::corrupt_data, "projected graph image: bad key metric size");
      for (float v : g->metric_)
        if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite key metric");
    }
    if (version >= 4) {
      g->query_moment_ = r.get_vec<float>(uint64_t(4096) * 4096);
      const auto side = uint64_t(std::llround(std::sqrt(double(g->query_moment_.size()))));
      if (side * side != g->query_moment_.size())
        fail(Status::corrupt_data, "projected graph image: bad query moment size");
      for (float v : g->query_moment_)
        if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite query moment");
    }
    if (version >= 5) {
      g->key_mean_ = r.get_vec<float>(4096);
      if (!g->key_mean_.empty() && !g->metric_.empty())
        fail(Status::corrupt_data, "projected graph image: both a key metric and a key mean");
      for (float v : g->key_mean_)
        if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite key mean");
    }
    g->size_ = r.get<int64_t>();
    g->unreached_before_repair_ = r.get<int64_t>();
    g->unreachable_ = r.get<int64_t>();
    g->entries_ = r.get_vec<int32_t>(1 << 20);
    g->arena_ = r.get_vec<int32_t, SearchArrayAllocator<int32_t>>(uint64_t(1) << 40);
    if (!r.at_end()) fail(Status::corrupt_data, "projected graph image: trailing bytes");
    if (g->arena_.size() % size_t(g->stride_) != 0) fail(Status::corrupt_data, "projected graph image: bad arena size");
    // Every id must point at a present node, so that search can never read
    // outside the arena or the key store.
    const int64_t n = g->nodes();
    int64_t present = 0;
    for (int64_t i = 0; i < n; ++i) present += g->node(i)[0] != kAbsent;
    if (present != g->size_) fail(Status::corrupt_data, "projected graph image: node count mismatch");
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* p = g->node(i);
      if (p[0] == kAbsent) continue;
      if (p[0] < 0 || p[0] > slots) fail(Status::corrupt_data, "projected graph image: bad degree");
      for (int j = 1; j <= p[0]; ++j)
        if (p[j] < 0 || p[j] >= n || g->node(p[j])[0] == kAbsent)
          fail(Status::corrupt_data, "projected graph image: neighbour id out of range");
    }
    if (g->entries_.empty() && n > 0) fail(Status::corrupt_data, "projected graph image: no entry point");
    for (int32_t e : g->entries_)
      if (e < 0 || e >= n || g->node(e)[0] == kAbsent) fail(Status::corrupt_data, "projected graph image: bad entry point");
    g->build_tree();
    return g;
  }

  void set_shifted_queries(int64_t n) { shifted_queries_ = n; }
  // refresh_projected_graph(); `queries` already hold their shifted copies.
  void refresh(const RowsView& keys, const std::vector<float>& queries, const GraphBuildParams& p);
  void set_insert_params(int queue, int pivots, int reverse, int key_queue) {
    insert_queue_ = queue;
    insert_pivots_ = pivots;
    insert_reverse_ = reverse;
    insert_key_queue_ = key_queue;
  }

  GraphInfo info() const {
    GraphInfo gi;
    gi.nodes = size_;
    gi.degree = M_;
    gi.slots = slots_;
    int64_t edges = 0;
    for (int64_t i = 0; i < nodes(); ++i) edges += std::max(0, node(i)[0]);
    gi.mean_degree = size_ ? double(edges) / double(size_) : 0.0;
    gi.unreached_before_repair = unreached_before_repair_;
    gi.unreachable = count_unreachable();
    gi.adjacency_bytes = arena_.size() * sizeof(int32_t);
    gi.code_bytes = traversal_codes().memory_bytes() + projected_code_bytes();
    gi.inserts = inserts_;
    gi.refresh_queries = refresh_queries_;
    gi.refresh_edges_offered = refresh_edges_;
    gi.key_alignment = key_alignment_;
    gi.training_queries = training_queries_;
    gi.shifted_queries = shifted_queries_;
    gi.key_metric = key_metric_used_;
    gi.insert_keys_scored = insert_scored_;
    gi.build_phases = build_phases_;
    gi.entry_points = int(entries_.size());
    gi.insert_queue = insert_queue_;
    gi.insert_pivots = insert_pivots_;
    gi.insert_reverse = insert_reverse_;
    gi.insert_key_queue = insert_key_queue_;
    return gi;
  }

  std::vector<int32_t> neighbors(int32_t id) const {
    if (id < 0 || id >= nodes() || node(id)[0] == kAbsent)
      fail(Status::invalid_argument, "projected graph: id " + std::to_string(id) + " is not in the index");
    const int32_t* nbr = node(id);
    return std::vector<int32_t>(nbr + 1, nbr + 1 + nbr[0]);
  }
  const std::vector<int32_t>& entries() const { return entries_; }

  // Distinct keys among the entry points, `ids` and the ids' neighbour lists.
  int64_t expansion_footprint(const int32_t* ids, int n) const {
    std::vector<uint8_t> seen(size_t(nodes()), 0);
    int64_t count = 0;
    auto mark = [&](int32_t id) {
      if (!seen[size_t(id)]) {
        seen[size_t(id)] = 1;
        ++count;
      }
    };
    for (int32_t e : entries_) mark(e);
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= nodes() || node(ids[i])[0] == kAbsent)
        fail(Status::invalid_argument, "expansion_footprint: id " + std::to_string(ids[i]) + " is not in the index");
      mark(ids[i]);
      const int32_t* nbr = node(ids[i]);
      for (int j = 1; j <= nbr[0]; ++j) mark(nbr[j]);
    }
    return count;
  }

  // ---- build ----
  void build(const RowsView& keys, const float* queries, int64_t num_queries, const GraphBuildParams& p,
             const ProgressFn& progress);

 private:
  // Adds edge from -> to; returns whether it was added. A full node keeps
  // its best neighbours by inner product with itself (`force`: the new edge
  // wins regardless). Edges of the spanning tree (parent_) are never
  // replaced, so every key reachable from the entry points stays reachable.
  // The slot j (1..count) of `from`'s weakest non-tree edge, given the
  // scores sc[j - 1] of its list; 0 (and +inf) when every edge is a tree edge.
  int weakest_non_tree_slot(int32_t from, const float* sc, float* worst_score) const {
    const int32_t* p = node(from);
    int worst = 0;
    *worst_score = std::numeric_limits<float>::infinity();
    for (int j = 1; j <= p[0]; ++j) {
      if (parent_[size_t(p[j])] == from) continue;  // tree edge
      if (sc[j - 1] < *worst_score) {
        *worst_score = sc[j - 1];
        worst = j;
      }
    }
    return worst;
  }

  bool add_in_edge(const RowsView& keys, int32_t from, int32_t to, bool force) {
    int32_t* p = node(from);
    for (int j = 1; j <= p[0]; ++j)
      if (p[j] == to) {
        adopt(from, to);
        return true;
      }
    const bool cached = size_t(from) < weakest_.size();
    if (p[0] < slots_) {
      p[++p[0]] = to;
      if (cached) weakest_[size_t(from)] = kUnknownWeakest;  // the new edge may be weaker
      adopt(from, to);
      return true;
    }
    edge_vec_.resize(size_t(keys.dim));
    to_f32(keys.dtype, keys.row(from), edge_vec_.data(), edge_vec_.size());
    if (cached && !force && !std::isnan(weakest_[size_t(from)])) {
      // Refused unless it beats the cached weakest edge (a lower bound of the
      // true one): one inner product instead of rescoring the list.
      float s_new = 0;
      distance_->dots(edge_vec_.data(), keys, &to, 1, &s_new);
      edge_scored_ += 1;
      if (!(s_new > weakest_[size_t(from)])) return false;
    }
    // The node's list and the new key, scored in one batched call.
    edge_ids_.assign(p + 1, p + 1 + p[0]);
    edge_ids_.push_back(to);
    edge_scores_.resize(edge_ids_.size());
    distance_->dots(edge_vec_.data(), keys, edge_ids_.data(), int(edge_ids_.size()), edge_scores_.data());
    edge_scored_ += int64_t(edge_ids_.size());
    const float* sc = edge_scores_.data();
    float worst_score;
    const int worst = weakest_non_tree_slot(from, sc, &worst_score);
    if (worst == 0 || !(force || sc[p[0]] > worst_score)) {
      if (cached) weakest_[size_t(from)] = worst_score;  // +inf when every edge is a tree edge
      return false;
    }
    if (cached) {  // the weakest non-tree edge after the replacement (to's edge counted)
      float w = sc[p[0]];
      for (int j = 1; j <= p[0]; ++j)
        if (j != worst && parent_[size_t(p[j])] != from) w = std::min(w, sc[j - 1]);
      weakest_[size_t(from)] = w;
    }
    p[worst] = to;
    adopt(from, to);
    return true;
  }

  // Tree bookkeeping after an edge from -> to: when `from` is reachable and
  // `to` was not, `to` and everything reachable only through it join the
  // tree (breadth first, through nodes without a parent).
  void adopt(int32_t from, int32_t to) {
    if (parent_[size_t(from)] == kNoParent || parent_[size_t(to)] != kNoParent) return;
    parent_[size_t(to)] = from;
    tree_queue_.assign(1, to);
    grow_tree();
  }

  // Spanning tree of everything reachable from the entry points (BFS).
  void build_tree() {
    weakest_.clear();  // tree edges may change: the cached bounds no longer hold
    parent_.assign(size_t(nodes()), kNoParent);
    tree_queue_.clear();
    for (int32_t e : entries_)
      if (parent_[size_t(e)] == kNoParent) {
        parent_[size_t(e)] = kRoot;
        tree_queue_.push_back(e);
      }
    grow_tree();
  }

  // Breadth first from the tree nodes in tree_queue_: every node without a
  // parent that they reach joins the tree.
  void grow_tree() {
    for (size_t h = 0; h < tree_queue_.size(); ++h) {
      const int32_t* nb = node(tree_queue_[h]);
      for (int j = 1; j <= nb[0]; ++j)
        if (parent_[size_t(nb[j])] == kNoParent) {
          parent_[size_t(nb[j])] = tree_queue_[h];
          tree_queue_.push_back(nb[j]);
        }
    }
  }

  // Present keys no path from the entry points reaches (a fresh traversal,
  // independent of parent_).
  int64_t count_unreachable() const {
    const std::vector<uint8_t> seen = reachable();
    int64_t n = 0;
    for (int64_t i = 0; i < nodes(); ++i) n += !seen[size_t(i)] && node(i)[0] != kAbsent;
    return n;
  }

  // Last resort for a key outside the tree: an in-edge from the first tree
  // node (entries first, then by id) with a free slot or a non-tree edge.
  // Tree leaves always qualify, so this never fails while the tree is non-empty.
  void link_anywhere(int32_t to) {
    const auto try_from = [&](int32_t from) {
      if (from == to || parent_[size_t(from)] == kNoParent) return false;
      int32_t* p = node(from);
      if (p[0] < slots_) {
        p[++p[0]] = to;
      } else {
        int j = 1;
        while (j <= p[0] && parent_[size_t(p[j])] == from) ++j;
        if (j > p[0]) return false;
        p[j] = to;
      }
      if (size_t(from) < weakest_.size()) weakest_[size_t(from)] = kUnknownWeakest;  // to's edge is unscored
      adopt(from, to);
      return true;
    };
    for (int32_t e : entries_)
      if (try_from(e)) return;
    for (int64_t i = 0; i < nodes(); ++i)
      if (node(i)[0] != kAbsent && try_from(int32_t(i))) return;
    // Nothing is reachable (an empty graph): the key becomes an entry.
    entries_.push_back(to);
    parent_[size_t(to)] = kRoot;
  }

  void connect_unreached(const RowsView& kf, const GraphBuildParams& p);
  // Returns the in-edges it offered.
  int64_t repair_with_queries(const RowsView& kf, const RowsView& kk, const float* queries,
                              const std::vector<int64_t>& picked, const std::vector<int32_t>& knn, int nq,
                              const GraphBuildParams& p);
  void apply_repair_edges(const RowsView& kk, std::vector<std::pair<int32_t, int32_t>>* edges,
                          std::vector<int64_t>* group_start, int threads);
  void fill_from_two_hop(const RowsView& kf, const GraphBuildParams& p);
  void order_by_cooccurrence(const std::vector<int32_t>& knn, int64_t num_lists, int nq, int threads);
  std::vector<uint8_t> reachable() const;

  int M_, slots_, stride_, build_queue_, query_neighbors_;
  std::unique_ptr<Distance> distance_;
  // Traversal codes of the keys (search path; SearchParams::traversal_codes):
  // derived from the key store, never saved; fitted on the first search that
  // wants them, extended by insert; or codes shared with the other indexes
  // over the same key store (attach_traversal_codes), which the owner updates.
  mutable SharedTraversalCodes own_codes_;
  std::shared_ptr<SharedTraversalCodes> shared_codes_;
  // Learned low-dimensional codes, per shape (SearchParams::code_dims, code_coarse_dims).
  mutable std::map<CodeShape, std::unique_ptr<ProjectedCodes>> projected_codes_;
  // [d, d] second moment of the training queries (unit trace; empty: not
  // known, e.g. an image before version 4): the projected codes' query model.
  std::vector<float> query_moment_;
  mutable std::mutex codes_mutex_;  // guards projected_codes_
  // Huge pages where the kernel allows (madvise): every expansion reads a
  // random node, like the codes.
  std::vector<int32_t, SearchArrayAllocator<int32_t>> arena_;
  std::vector<int32_t> entries_;
  // Derived (not saved): a spanning tree of the graph from the entry points,
  // parent_[v] = the node whose edge to v is v's tree edge (kRoot for entries,
  // kNoParent while unreachable). Edge replacement keeps tree edges.
  std::vector<int32_t> parent_;
  // Insert path only (empty until the first insert, cleared with the tree):
  // per node, the lowest score of its non-tree edges when add_in_edge last
  // scored its list, or kUnknownWeakest. It never exceeds the true value:
  // during inserts lists change only through add_in_edge, which keeps it, and
  // edges only ever become tree edges, which raises the true value. So a new
  // edge at or below it is refused with one inner product. Not saved.
  std::vector<float> weakest_;
  // Insert path: one search with the own query (queue insert_queue_), then
  // in-edges from that many best hits / best out-neighbours.
  int insert_queue_ = 32, insert_pivots_ = 4, insert_reverse_ = 16, insert_key_queue_ = 16;  // v1 images
  int32_t last_inserted_ = -1;
  double key_alignment_ = 0;  // build diagnostics (not saved)
  int64_t training_queries_ = 0, shifted_queries_ = 0;  // build diagnostics (not saved)
  int key_metric_used_ = 0;
  std::vector<BuildPhase> build_phases_;  // build diagnostics (not saved)
  std::vector<float> metric_;  // [d, d] S of the key metric (empty: plain inner product); saved
  std::vector<float> key_mean_;  // [d] mean of the built keys when relations were centred (center_keys); saved
  std::vector<float> insert_metric_key_;
  // seeds the next insert's search (not saved)
  int64_t inserts_ = 0, insert_scored_ = 0, edge_scored_ = 0;  // counters for GraphInfo
  int64_t refresh_queries_ = 0, refresh_edges_ = 0;  // refresh counters for GraphInfo (not saved)
  // Reused buffers of the serial edit paths (insert, linking, repair edges).
  GraphScratch insert_scratch_;
  std::vector<float> insert_key_, insert_scores_, edge_vec_, edge_scores_;
  std::vector<int32_t> insert_hits_, edge_ids_, tree_queue_;
  std::vector<ScoredId> insert_ranked_;
  int64_t size_ = 0;
  int64_t unreached_before_repair_ = 0;
  int64_t unreachable_ = 0;
};

// Under-full nodes take their best 2-hop neighbours; computed from a frozen
// copy of the lists, then applied, so threads never read a list being written.
void ProjectedGraph::fill_from_two_hop(const RowsView& kf, const GraphBuildParams& p) {
  const int64_t N = nodes();
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  std::vector<int32_t> added(size_t(N) * size_t(M_), -1);
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<int32_t> cand;
    std::vector<uint32_t> seen;
    std::vector<float> scores;
    std::vector<ScoredId> ranked;
#pragma omp for schedule(dynamic, 256)
    for (int64_t v = 0; v < N; ++v) {
      const int32_t* nv = node(v);
      if (nv[0] < 0 || nv[0] >= M_) continue;
      // 2-hop nodes that are neither v nor its neighbours, each once (a
      // per-thread stamp array; each v is visited once, so v + 1 is fresh).
      cand.clear();
      if (seen.empty()) seen.assign(size_t(N), 0u);
      const uint32_t stamp = uint32_t(v) + 1;
      seen[size_t(v)] = stamp;
      for (int j = 1; j <= nv[0]; ++j) seen[size_t(nv[j])] = stamp;
      for (int j = 1; j <= nv[0]; ++j) {
        const int32_t* nu = node(nv[j]);
        for (int i = 1; i <= nu[0]; ++i)
          if (seen[size_t(nu[i])] != stamp) {
            seen[size_t(nu[i])] = stamp;
            cand.push_back(nu[i]);
          }
      }
      // One batched call: random rows, fetched ahead of use.
      scores.resize(cand.size());
      build_dist->dots(static_cast<const float*>(kf.row(v)), kf, cand.data(), int(cand.size()), scores.data());
      ranked.resize(cand.size());
      for (size_t i = 0; i < cand.size(); ++i) ranked[i] = {scores[i], cand[i]};
      const size_t want = std::min(ranked.size(), size_t(M_ - nv[0]));
      std::partial_sort(ranked.begin(), ranked.begin() + std::ptrdiff_t(want), ranked.end(), Better{});
      for (size_t i = 0; i < want; ++i) added[size_t(v) * size_t(M_) + i] = ranked[i].id;
    }
  }
  for (int64_t v = 0; v < N; ++v) {
    int32_t* nv = node(v);
    for (int i = 0; i < M_ && nv[0] < M_; ++i) {
      const int32_t c = added[size_t(v) * size_t(M_) + size_t(i)];
      if (c < 0) break;
      nv[++nv[0]] = c;
    }
  }
}

// Counts, for every edge v -> u, the training lists holding both v and u
// (saturating at 2^16 - 1), then sorts each list by that count, stable.
// Thread t counts the nodes v with v % threads == t, so no two threads write
// one count; each marks every list's members in its own stamp array.
void ProjectedGraph::order_by_cooccurrence(const std::vector<int32_t>& knn, int64_t num_lists, int nq, int threads) {
  const int64_t N = nodes();
  std::vector<uint16_t> together(size_t(N) * size_t(slots_), 0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    std::vector<uint32_t> stamp(size_t(N), 0);
    for (int64_t q = 0; q < num_lists; ++q) {
      const int32_t* list = knn.data() + size_t(q) * size_t(nq);
      const uint32_t mark = uint32_t(q) + 1;
      for (int j = 0; j < nq; ++j) stamp[size_t(list[j])] = mark;
      for (int j = 0; j < nq; ++j) {
        const int32_t v = list[j];
        if (v % T != t) continue;
        const int32_t* nbr = node(v);
        uint16_t* c = together.data() + size_t(v) * size_t(slots_);
        for (int i = 0; i < nbr[0]; ++i)
          if (stamp[size_t(nbr[i + 1])] == mark && c[i] != UINT16_MAX) ++c[i];
      }
    }
#pragma omp barrier
    std::vector<std::pair<int, int32_t>> ranked;
#pragma omp for schedule(static)
    for (int64_t v = 0; v < N; ++v) {
      int32_t* nbr = node(v);
      const uint16_t* c = together.data() + size_t(v) * size_t(slots_);
      ranked.resize(size_t(std::max(nbr[0], 0)));
      for (size_t i = 0; i < ranked.size(); ++i) ranked[i] = {-int(c[i]), nbr[i + 1]};
      std::stable_sort(ranked.begin(), ranked.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (size_t i = 0; i < ranked.size(); ++i) nbr[i + 1] = ranked[i].second;
    }
  }
}

std::vector<uint8_t> ProjectedGraph::reachable() const {
  std::vector<uint8_t> seen(size_t(nodes()), 0);
  std::vector<int32_t> stack(entries_.begin(), entries_.end());
  for (int32_t e : entries_) seen[size_t(e)] = 1;
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    const int32_t* nb = node(v);
    for (int j = 1; j <= nb[0]; ++j)
      if (!seen[size_t(nb[j])]) {
        seen[size_t(nb[j])] = 1;
        stack.push_back(nb[j]);
      }
  }
  return seen;
}

// Keys that no path from the entry points reaches are linked in: a beam
// search with the key itself as the query finds its neighbourhood; the key
// gets out-edges (if it has none) and an in-edge from the best reachable hit
// (a free slot first; else it replaces a hit's weakest non-tree edge; else
// any tree node takes it). Linking a key also brings in whatever is reachable
// only through it, and the tree is never cut, so one pass reaches every key.
void ProjectedGraph::connect_unreached(const RowsView& kf, const GraphBuildParams& p) {
  build_tree();
  std::vector<int32_t> todo;
  for (int64_t i = 0; i < nodes(); ++i)
    if (parent_[size_t(i)] == kNoParent) todo.push_back(int32_t(i));
  unreached_before_repair_ = int64_t(todo.size());
  if (todo.empty()) return;
  const int want = M_;
  std::vector<int32_t> hits(todo.size() * size_t(want), -1);
#pragma omp parallel num_threads(p.threads)
  {
    GraphScratch s;
#pragma omp for schedule(dynamic, 64)
    for (int64_t t = 0; t < int64_t(todo.size()); ++t) {
      beam_search(static_cast<const float*>(kf.row(todo[size_t(t)])), kf, build_queue_, s);
      int n = 0;
      for (size_t i = 0; i < s.pool.size() && n < want; ++i)
        if (s.pool[i].id != todo[size_t(t)]) hits[size_t(t) * size_t(want) + size_t(n++)] = s.pool[i].id;
    }
  }
  for (size_t t = 0; t < todo.size(); ++t) {
    const int32_t x = todo[t];
    const int32_t* h = hits.data() + t * size_t(want);
    if (node(x)[0] == 0) {
      std::vector<ScoredId> ranked;
      const float* xv = static_cast<const float*>(kf.row(x));
      for (int i = 0; i < want && h[i] >= 0; ++i) ranked.push_back({dot_row(xv, kf, h[i]), h[i]});
      std::sort(ranked.begin(), ranked.end(), Better{});
      std::vector<int32_t> out;
      occlusion_prune(kf, ranked, M_, &out);
      set_neighbors(x, out);
    }
    if (parent_[size_t(x)] != kNoParent) continue;  // reached through a key linked before
    for (int i = 0; i < want && h[i] >= 0 && parent_[size_t(x)] == kNoParent; ++i) {
      int32_t* nb = node(h[i]);
      if (nb[0] < slots_) {
        nb[++nb[0]] = x;
        adopt(h[i], x);
      }
    }
    for (int i = 0; i < want && h[i] >= 0 && parent_[size_t(x)] == kNoParent; ++i)
      add_in_edge(kf, h[i], x, /*force=*/true);
    if (parent_[size_t(x)] == kNoParent) link_anywhere(x);
  }
  unreachable_ = count_unreachable();
}

// Query-guided repair: training queries search the graph; a key of a query's
// exact top-Nq list the search missed is the kind of key decode queries miss
// too, so it gets an in-edge from the found list key nearest to it. Queries
// run in chunks (searches in parallel, edges applied in order) so later
// searches see earlier repairs.
int64_t ProjectedGraph::repair_with_queries(const RowsView& kf, const RowsView& kk, const float* queries,
                                            const std::vector<int64_t>& picked, const std::vector<int32_t>& knn,
                                            int nq, const GraphBuildParams& p) {
  const int64_t Q = int64_t(picked.size());
  const int64_t R = std::min<int64_t>(Q, int64_t(std::llround(double(Q) * p.repair_fraction)));
  if (R <= 0) return 0;
  const int64_t stride = std::max<int64_t>(1, Q / R);
  int64_t offered = 0;
  const int L = std::max(build_queue_, nq);
  constexpr int64_t kChunk = 512;
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  // Edges (from, to) of each query of a chunk, applied in query order, so
  // the pass gives the same graph whichever thread searched which query.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> per_query(static_cast<size_t>(kChunk));
  std::vector<std::pair<int32_t, int32_t>> edges;
  std::vector<int64_t> group_start;
  for (int64_t c0 = 0; c0 < R; c0 += kChunk) {
    const int64_t c1 = std::min(R, c0 + kChunk);
#pragma omp parallel num_threads(p.threads)
    {
      GraphScratch s;
      std::vector<uint32_t> mark;  // mark[id] == tag: in the search result
      std::vector<int32_t> hits, missed;
      std::vector<float> scores;
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = c0; r < c1; ++r) {
        auto& mine = per_query[size_t(r - c0)];
        mine.clear();
        const int64_t qi = r * stride;
        const float* q = queries + size_t(picked[size_t(qi)]) * size_t(kf.dim);
        beam_search(q, kf, L, s);
        if (mark.size() < size_t(nodes())) mark.assign(size_t(nodes()), 0u);
        const uint32_t tag = uint32_t(r + 1);
        for (size_t i = 0; i < s.pool.size() && int(i) < nq; ++i) mark[size_t(s.pool[i].id)] = tag;
        const int32_t* nn = knn.data() + size_t(qi) * size_t(nq);
        hits.clear();
        missed.clear();
        for (int j = 0; j < nq; ++j) {
          // Rows of the key store not in the index (a refresh over a graph
          // with gaps) take no edges.
          if (node(nn[j])[0] == kAbsent) continue;
          (mark[size_t(nn[j])] == tag ? hits : missed).push_back(nn[j]);
        }
        if (hits.empty()) continue;
        scores.resize(hits.size());
        for (int32_t m : missed) {
          // The found key nearest to m (the first of equals), one batched call.
          build_dist->dots(static_cast<const float*>(kk.row(m)), kk, hits.data(), int(hits.size()), scores.data());
          size_t best = 0;
          for (size_t i = 1; i < hits.size(); ++i)
            if (scores[i] > scores[best]) best = i;
          mine.push_back({hits[best], m});
        }
      }
    }
    edges.clear();
    for (int64_t r = 0; r < c1 - c0; ++r) edges.insert(edges.end(), per_query[size_t(r)].begin(), per_query[size_t(r)].end());
    offered += int64_t(edges.size());
    apply_repair_edges(kk, &edges, &group_start, p.threads);
  }
  return offered;
}

// Adds the in-edges (from, to), in order, as add_in_edge(force = false) would.
// Once every key is in the spanning tree (after connect_unreached) no edge
// changes the tree, so the edits of different `from` lists are independent:
// the edges are grouped by `from` (stable, keeping their order) and the
// groups edited in parallel, with the same result as the serial loop.
void ProjectedGraph::apply_repair_edges(const RowsView& kk, std::vector<std::pair<int32_t, int32_t>>* edges,
                                        std::vector<int64_t>* group_start, int threads) {
  const bool tree_complete =
      weakest_.empty() && std::none_of(parent_.begin(), parent_.end(), [](int32_t v) { return v == kNoParent; });
  if (!tree_complete || threads <= 1) {
    for (const auto& e : *edges) add_in_edge(kk, e.first, e.second, /*force=*/false);
    return;
  }
  std::stable_sort(edges->begin(), edges->end(),
                   [](const std::pair<int32_t, int32_t>& a, const std::pair<int32_t, int32_t>& b) { return a.first < b.first; });
  group_start->clear();
  for (size_t i = 0; i < edges->size(); ++i)
    if (i == 0 || (*edges)[i].first != (*edges)[i - 1].first) group_start->push_back(int64_t(i));
  group_start->push_back(int64_t(edges->size()));
  const int64_t groups = int64_t(group_start->size()) - 1;
#pragma omp parallel num_threads(threads)
  {
    std::vector<int32_t> ids;
    std::vector<float> sc;
#pragma omp for schedule(dynamic, 64)
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t from = (*edges)[size_t((*group_start)[size_t(g)])].first;
      int32_t* p = node(from);
      const float* fv = static_cast<const float*>(kk.row(from));
      for (int64_t i = (*group_start)[size_t(g)]; i < (*group_start)[size_t(g) + 1]; ++i) {
        const int32_t to = (*edges)[size_t(i)].second;
        if (std::find(p + 1, p + 1 + p[0], to) != p + 1 + p[0]) continue;
        if (p[0] < slots_) {
          p[++p[0]] = to;
          continue;
        }
        // The list and the new key in one call; the weakest non-tree edge
        // gives way when the new key beats it (add_in_edge's rule).
        ids.assign(p + 1, p + 1 + p[0]);
        ids.push_back(to);
        sc.resize(ids.size());
        distance_->dots(fv, kk, ids.data(), int(ids.size()), sc.data());
        float worst_score;
        const int worst = weakest_non_tree_slot(from, sc.data(), &worst_score);
        if (worst != 0 && sc[size_t(p[0])] > worst_score) p[worst] = to;
      }
    }
  }
}

void ProjectedGraph::build(const RowsView& keys_in, const float* queries, int64_t num_queries,
                           const GraphBuildParams& p, const ProgressFn& progress) {
  const int64_t N = keys_in.rows;
  const int d = keys_in.dim;
  PhaseClock clock(&build_phases_);
  // The build works on an fp32 copy (GEMM input); search uses the store itself.
  std::vector<float> kcopy;
  RowsView kf = keys_in;
  if (keys_in.dtype != DType::f32) {
    kcopy.resize(size_t(N) * size_t(d));
    to_f32(keys_in.dtype, keys_in.data, kcopy.data(), kcopy.size());
    kf = RowsView{kcopy.data(), DType::f32, N, d};
  }
  resize_nodes(N);
  size_ = N;
  const auto report = [&](double x) {
    if (progress) progress(std::min(1.0, std::max(0.0, x)));
  };

  // 1. Training queries: a seeded sample.
  std::vector<int64_t> picked;
  if (num_queries > 0) {
    const int64_t want = std::clamp<int64_t>(int64_t(std::llround(double(num_queries) * p.sample_fraction)), 1, num_queries);
    picked.resize(size_t(num_queries));
    std::iota(picked.begin(), picked.end(), 0);
    uint64_t st = p.seed;
    for (int64_t i = 0; i < want; ++i) {
      const int64_t j = i + int64_t(mix64(st += kGoldenGamma) % uint64_t(num_queries - i));
      std::swap(picked[size_t(i)], picked[size_t(j)]);
    }
    picked.resize(size_t(want));
    std::sort(picked.begin(), picked.end());
  }
  const int nq = int(std::min<int64_t>(p.query_neighbors, N));
  if (p.causal) {
    // Causal lists: query t only against the keys it attends to (rows
    // <= t - causal_key_offset); queries that see fewer than nq keys drop out.
    picked.erase(std::remove_if(picked.begin(), picked.end(),
                                [&](int64_t t) { return t - p.causal_key_offset + 1 < nq; }),
                 picked.end());
  }
  const int64_t Q = int64_t(picked.size());
  training_queries_ = Q;

  // 2. Exact top-nq per training query.
  std::vector<int32_t> knn;
  if (Q > 0)
    knn = exact_knn(kf, queries, picked, nq, p.threads, [&](double x) { report(0.6 * x); },
                    p.causal ? p.causal_key_offset : -1);
  clock.mark("exact_topk");
  // Key-to-key relations of the graph passes (projection order, occlusion,
  // reverse pruning, 2-hop fill, connectivity, repair) in the queries'
  // metric: <k1, k2>_S = k1' S k2 with S the second moment of the training
  // queries, i.e. how alike two keys score across queries. Computed as plain
  // inner products of transformed keys L' k (S = L L').
  std::vector<float> kt;
  RowsView kk = kf;
  if (Q > 0 && p.key_metric != 0) {
    kt = query_metric_keys(kf, queries, picked, p.key_metric == 2, p.key_metric_ridge, p.threads, &key_alignment_,
                           &metric_);
    kk = RowsView{kt.data(), DType::f32, N, d};
  } else if (p.center_keys) {
    kt = centered_keys(kf, p.threads, &key_mean_);
    kk = RowsView{kt.data(), DType::f32, N, d};
  }
  key_metric_used_ = (Q > 0 && p.key_metric != 0) ? p.key_metric : 0;
  // The training queries' second moment (at most 8192 evenly spaced ones,
  // unit trace): the query model of the projected traversal codes.
  if (Q > 0 && p.keep_query_moment) {
    const int64_t qstep = std::max<int64_t>(1, Q / 8192);
    std::vector<double> mom(size_t(d) * size_t(d), 0.0);
    for (int64_t i = 0; i < Q; i += qstep) {
      const float* q = queries + size_t(picked[size_t(i)]) * size_t(d);
      for (int a = 0; a < d; ++a)
        for (int b = 0; b <= a; ++b) mom[size_t(a) * size_t(d) + size_t(b)] += double(q[a]) * double(q[b]);
    }
    double tr = 0;
    for (int a = 0; a < d; ++a) tr += mom[size_t(a) * size_t(d) + size_t(a)];
    query_moment_.assign(size_t(d) * size_t(d), 0.0f);
    if (tr > 0 && std::isfinite(tr))
      for (int a = 0; a < d; ++a)
        for (int b = 0; b <= a; ++b)
          query_moment_[size_t(a) * size_t(d) + size_t(b)] = query_moment_[size_t(b) * size_t(d) + size_t(a)] =
              float(mom[size_t(a) * size_t(d) + size_t(b)] / tr);
    else query_moment_.clear();
  }
  clock.mark("key_metric");
  const RowsView kp = (p.key_metric_passes & 1) ? kk : kf;  // projection, reverse edges, 2-hop fill

  // 3. Pivot per query: its best key, unless that key already serves as pivot
  //    for pivot_capacity queries (hubs), then the next one.
  std::vector<int64_t> order(static_cast<size_t>(Q));
  std::iota(order.begin(), order.end(), 0);
  {
    uint64_t st = p.seed ^ 0xabcdef;
    for (int64_t i = Q - 1; i > 0; --i) std::swap(order[size_t(i)], order[size_t(mix64(st += kGoldenGamma) % uint64_t(i + 1))]);
  }
  std::vector<int32_t> uses(static_cast<size_t>(N), 0);
  std::vector<int32_t> top1_count(static_cast<size_t>(N), 0);
  std::vector<std::pair<int32_t, int64_t>> pairs;  // (pivot, query)
  pairs.reserve(size_t(Q) * size_t(p.pivots_per_query));
  std::vector<int32_t> listed_count(static_cast<size_t>(N), 0);
  for (int64_t qi : order) {
    const int32_t* nn = knn.data() + size_t(qi) * size_t(nq);
    ++top1_count[size_t(nn[0])];
    for (int j = 0; j < nq; ++j) ++listed_count[size_t(nn[j])];
    int got = 0;
    for (int j = 0; j < nq && got < p.pivots_per_query; ++j)
      if (uses[size_t(nn[j])] < p.pivot_capacity) {
        ++uses[size_t(nn[j])];
        pairs.push_back({nn[j], qi});
        ++got;
      }
    if (got == 0) pairs.push_back({nn[0], qi});
  }
  // Queries grouped by pivot (CSR).
  std::vector<int64_t> start(size_t(N) + 1, 0);
  for (const auto& pr : pairs) ++start[size_t(pr.first) + 1];
  for (int64_t i = 0; i < N; ++i) start[size_t(i) + 1] += start[size_t(i)];
  std::vector<int64_t> by_pivot(pairs.size());
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (const auto& pr : pairs) by_pivot[size_t(fill[size_t(pr.first)]++)] = pr.second;
  }
  pairs.clear();
  pairs.shrink_to_fit();
  clock.mark("pivots");
  report(0.65);

  // The build's batched inner products: the built-in kernels (bit-identical
  // to dot_row) whatever distance_ the searches use.
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);

  // 4. Projection + occlusion pruning: each pivot links to its queries' other
  //    neighbours, ranked by inner product with the pivot.
  const int M = p.degree;
  const size_t pool_limit = size_t(3) * size_t(M);
  std::vector<int32_t> fwd(size_t(N) * size_t(M), -1);
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<int32_t> cand, kept;
    std::vector<uint32_t> seen;
    std::vector<float> scores;
    std::vector<ScoredId> ranked;
#pragma omp for schedule(dynamic, 256)
    for (int64_t v = 0; v < N; ++v) {
      if (start[size_t(v)] == start[size_t(v) + 1]) continue;
      // The union of the lists, deduplicated with a per-thread stamp array
      // (each node v is visited once, so v + 1 is a fresh stamp).
      cand.clear();
      if (seen.empty()) seen.assign(size_t(N), 0u);
      const uint32_t stamp = uint32_t(v) + 1;
      seen[size_t(v)] = stamp;
      for (int64_t b = start[size_t(v)]; b < start[size_t(v) + 1]; ++b) {
        const int32_t* nn = knn.data() + size_t(by_pivot[size_t(b)]) * size_t(nq);
        for (int j = 0; j < nq; ++j)
          if (seen[size_t(nn[j])] != stamp) {
            seen[size_t(nn[j])] = stamp;
            cand.push_back(nn[j]);
          }
      }
      // One batched call: random rows, fetched ahead of use (the same row
      // kernel as dot_row, so the same scores).
      scores.resize(cand.size());
      build_dist->dots(static_cast<const float*>(kp.row(v)), kp, cand.data(), int(cand.size()), scores.data());
      ranked.resize(cand.size());
      for (size_t i = 0; i < cand.size(); ++i) ranked[i] = {scores[i], cand[i]};
      if (ranked.size() > pool_limit) {
        std::nth_element(ranked.begin(), ranked.begin() + std::ptrdiff_t(pool_limit), ranked.end(), Better{});
        ranked.resize(pool_limit);
      }
      std::sort(ranked.begin(), ranked.end(), Better{});
      occlusion_prune(kp, ranked, M, &kept);
      std::copy(kept.begin(), kept.end(), fwd.begin() + std::ptrdiff_t(size_t(v) * size_t(M)));
    }
  }
  if (p.repair_fraction <= 0 && !p.cooccurrence_order) {
    knn.clear();
    knn.shrink_to_fit();
  }
  clock.mark("projection_pruning");
  report(0.75);

  // 5. Reverse edges, re-pruned where a node's degree would exceed M.
  std::vector<int64_t> rstart(size_t(N) + 1, 0);
  for (size_t e = 0; e < fwd.size(); ++e)
    if (fwd[e] >= 0) ++rstart[size_t(fwd[e]) + 1];
  for (int64_t i = 0; i < N; ++i) rstart[size_t(i) + 1] += rstart[size_t(i)];
  std::vector<int32_t> rev(static_cast<size_t>(rstart[size_t(N)]));
  {
    std::vector<int64_t> fill(rstart.begin(), rstart.end() - 1);
    for (int64_t v = 0; v < N; ++v)
      for (int j = 0; j < M; ++j) {
        const int32_t c = fwd[size_t(v) * size_t(M) + size_t(j)];
        if (c >= 0) rev[size_t(fill[size_t(c)]++)] = int32_t(v);
      }
  }
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<int32_t> pool, kept;
    std::vector<float> scores;
    std::vector<ScoredId> ranked;
#pragma omp for schedule(dynamic, 256)
    for (int64_t v = 0; v < N; ++v) {
      pool.clear();
      for (int j = 0; j < M; ++j) {
        const int32_t c = fwd[size_t(v) * size_t(M) + size_t(j)];
        if (c >= 0) pool.push_back(c);
      }
      const size_t nfwd = pool.size();
      for (int64_t b = rstart[size_t(v)]; b < rstart[size_t(v) + 1]; ++b)
        if (std::find(pool.begin(), pool.begin() + std::ptrdiff_t(nfwd), rev[size_t(b)]) == pool.begin() + std::ptrdiff_t(nfwd))
          pool.push_back(rev[size_t(b)]);
      if (int(pool.size()) <= M) {
        set_neighbors(v, pool);
        continue;
      }
      scores.resize(pool.size());
      build_dist->dots(static_cast<const float*>(kp.row(v)), kp, pool.data(), int(pool.size()), scores.data());
      ranked.resize(pool.size());
      for (size_t i = 0; i < pool.size(); ++i) ranked[i] = {scores[i], pool[i]};
      if (ranked.size() > pool_limit) {
        std::nth_element(ranked.begin(), ranked.begin() + std::ptrdiff_t(pool_limit), ranked.end(), Better{});
        ranked.resize(pool_limit);
      }
      std::sort(ranked.begin(), ranked.end(), Better{});
      occlusion_prune(kp, ranked, M, &kept);
      set_neighbors(v, kept);
    }
  }
  fwd.clear();
  fwd.shrink_to_fit();
  clock.mark("reverse_edges");
  if (p.fill_two_hop) fill_from_two_hop((p.key_metric_passes & 1) ? kk : kf, p);
  clock.mark("two_hop_fill");
  report(0.85);

  // 6. Entry points: the key nearest (L2) to the centroid of all keys, then
  //    the keys most often the best key of a training query (sinks, typically).
  {
    std::vector<double> centroid(static_cast<size_t>(d), 0.0);
    for (int64_t i = 0; i < N; ++i) {
      const float* r = static_cast<const float*>(kf.row(i));
      for (int j = 0; j < d; ++j) centroid[size_t(j)] += r[j];
    }
    for (auto& c : centroid) c /= double(N);
    int64_t best = 0;
    double best_d = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < N; ++i) {
      const float* r = static_cast<const float*>(kf.row(i));
      double s = 0;
      for (int j = 0; j < d; ++j) s += (r[j] - centroid[size_t(j)]) * (r[j] - centroid[size_t(j)]);
      if (s < best_d) {
        best_d = s;
        best = i;
      }
    }
    entries_.assign(1, int32_t(best));
    // Then the keys most often a training query's best key (sinks, typically),
    // then the keys most often in training queries' lists: seeds spread over
    // the regions queries go to, all scored when a search starts.
    const auto add_by = [&](const std::vector<int32_t>& count, int how_many) {
      std::vector<int32_t> ids(static_cast<size_t>(N));
      std::iota(ids.begin(), ids.end(), 0);
      const int n = std::min<int>(how_many, int(N));
      std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
        return count[size_t(a)] > count[size_t(b)] || (count[size_t(a)] == count[size_t(b)] && a < b);
      });
      for (int i = 0; i < n && int(entries_.size()) < p.entry_points; ++i)
        if (count[size_t(ids[size_t(i)])] > 0 &&
            std::find(entries_.begin(), entries_.end(), ids[size_t(i)]) == entries_.end())
          entries_.push_back(ids[size_t(i)]);
    };
    add_by(top1_count, std::min(p.entry_points - 1, 8));
    add_by(listed_count, p.entry_points);
  }
  clock.mark("entry_points");

  // 7. Connectivity for keys no projected edge reaches.
  connect_unreached((p.key_metric_passes & 2) ? kk : kf, p);
  clock.mark("connectivity");
  if (p.repair_fraction > 0 && Q > 0) {
    repair_with_queries(kf, (p.key_metric_passes & 4) ? kk : kf, queries, picked, knn, nq, p);
    unreachable_ = count_unreachable();
  }
  clock.mark("repair");
  if (p.cooccurrence_order && Q > 0) order_by_cooccurrence(knn, Q, nq, p.threads);
  knn.clear();
  knn.shrink_to_fit();
  clock.mark("list_order");
  // The same BFS tree a load computes, so that inserts into a built graph
  // and into its saved and loaded copy give the same graph.
  build_tree();
  clock.mark("spanning_tree");
  report(1.0);
}

// Query-guided repair of a finished graph with later queries (the insert
// path's missing piece): their exact top-Nq lists over every indexed key go
// through the build's repair pass, in the build's key relations (saved
// metric or key mean).
void ProjectedGraph::refresh(const RowsView& keys, const std::vector<float>& queries, const GraphBuildParams& p) {
  const int64_t N = nodes();
  const int d = keys.dim;
  if (keys.rows < N) fail(Status::invalid_argument, "projected graph refresh: key store has fewer rows than the index");
  if ((!metric_.empty() && metric_.size() != size_t(d) * size_t(d)) || (!key_mean_.empty() && key_mean_.size() != size_t(d)))
    fail(Status::invalid_argument, "projected graph refresh: key store dimension does not match the graph");
  if (!(p.threads >= 1 && p.query_neighbors >= 1))
    fail(Status::invalid_argument, "projected graph refresh: threads and query_neighbors must be >= 1");
  const int64_t Q = int64_t(queries.size()) / d;
  if (Q == 0 || size_ == 0) return;
  std::vector<float> kcopy;
  RowsView kf{keys.data, DType::f32, N, d};
  if (keys.dtype != DType::f32) {
    kcopy.resize(size_t(N) * size_t(d));
    to_f32(keys.dtype, keys.data, kcopy.data(), kcopy.size());
    kf.data = kcopy.data();
  }
  std::vector<int64_t> picked(static_cast<size_t>(Q));
  std::iota(picked.begin(), picked.end(), 0);
  const int nq = int(std::min<int64_t>(p.query_neighbors, N));
  const std::vector<int32_t> knn = exact_knn(kf, queries.data(), picked, nq, p.threads, {});
  // The repair's key relations (key_metric_passes bit 4, as in the build).
  std::vector<float> kt;
  RowsView kk = kf;
  if ((p.key_metric_passes & 4) && !metric_.empty()) {
    kt = keys_times_cholesky(kf, std::vector<double>(metric_.begin(), metric_.end()), p.threads);
    kk.data = kt.data();
  } else if ((p.key_metric_passes & 4) && !key_mean_.empty()) {
    kt = keys_minus(kf, key_mean_, p.threads);
    kk.data = kt.data();
  }
  GraphBuildParams rp = p;
  rp.repair_fraction = 1.0;
  refresh_edges_ += repair_with_queries(kf, kk, queries.data(), picked, knn, nq, rp);
  refresh_queries_ += Q;
  unreachable_ = count_unreachable();
}

bool search_many_projected(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params) {
  // A few jobs (a GQA group's query heads): fixed-size arrays, no allocation.
  constexpr int kMaxJobs = 64;
  if (n < 1 || n > kMaxJobs) return false;
  const ProjectedGraph* graphs[kMaxJobs];
  GraphScratch* scratches[kMaxJobs];
  for (int i = 0; i < n; ++i) {
    graphs[i] = dynamic_cast<const ProjectedGraph*>(jobs[i].index);
    scratches[i] = dynamic_cast<GraphScratch*>(jobs[i].scratch);
    if (!graphs[i] || !scratches[i]) return false;
    for (int j = 0; j < i; ++j)
      if (scratches[j] == scratches[i]) return false;  // one scratch holds one search's state
  }
  for (int i = 0; i < n; ++i)
    graphs[i]->start_search(jobs[i].query, keys, internal::job_params(params, jobs[i]), *scratches[i]);
  // Round robin, one step each: a step requests its next batch's rows and
  // the other searches' steps run while they arrive.
  for (int active = n; active > 0;) {
    for (int i = 0; i < n; ++i) {
      GraphScratch& s = *scratches[i];
      if (s.stage == GraphScratch::Stage::done) continue;
      graphs[i]->step(keys, s);
      if (s.stage == GraphScratch::Stage::done) {
        ProjectedGraph::finish_search(params, s, *jobs[i].out);
        --active;
      }
    }
  }
  return true;
}

std::unique_ptr<KeyIndex> load_projected_graph(std::string_view payload, uint32_t version) {
  if (version < 1 || version > kGraphVersion)
    fail(Status::corrupt_data, "projected graph image: unknown version " + std::to_string(version));
  return ProjectedGraph::load(payload, version);
}

}  // namespace internal

namespace internal {
std::vector<float> rope_shifted_queries(const float* queries, int64_t num_queries, int dim,
                                        const GraphBuildParams& p) {
  std::vector<float> out;
  const int64_t n = std::min<int64_t>(p.shift_queries, num_queries);
  if (n <= 0 || dim < 2) return out;
  const int shifts[4] = {p.shift_span / 8, p.shift_span / 4, p.shift_span / 2, p.shift_span};
  out.resize(size_t(4 * n) * size_t(dim));
  float* o = out.data();
  for (int shift : shifts) {
    const RopeAngles angles(dim, double(shift), p.rope_base);
    for (int64_t t = num_queries - n; t < num_queries; ++t, o += dim)
      angles.rotate(queries + size_t(t) * size_t(dim), o, p.rope_interleaved);
  }
  return out;
}
}  // namespace internal

namespace {
// `queries` [n, dim] followed by their RoPE-shifted copies
// (internal::rope_shifted_queries); `who` names the caller in the errors on
// shift parameters RoPE cannot take.
std::vector<float> with_shifted_copies(const float* queries, int64_t n, int dim, const GraphBuildParams& p,
                                       const char* who) {
  const auto bad = [who](const std::string& m) { fail(Status::invalid_argument, std::string(who) + ": " + m); };
  if (p.shift_queries < 0) bad("shift_queries must be >= 0");
  if (p.shift_queries > 0) {
    if (p.shift_span < 8) bad("shift_span must be >= 8");
    if (!(p.rope_base > 1.0)) bad("rope_base must be > 1");
    if (dim % 2 != 0) bad("RoPE-shifted queries need an even head dimension");
  }
  const std::vector<float> extra = internal::rope_shifted_queries(queries, n, dim, p);
  std::vector<float> out;
  out.reserve(size_t(n) * size_t(dim) + extra.size());
  out.assign(queries, queries + size_t(n) * size_t(dim));
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}
}  // namespace

std::unique_ptr<KeyIndex> build_projected_graph(const RowsView& keys, const float* train_queries, int64_t num_queries,
                                                const GraphBuildParams& p, std::shared_ptr<CpuKernels> kernels,
                                                const ProgressFn& progress) {
  const auto bad = [](const std::string& m) { fail(Status::invalid_argument, "build_projected_graph: " + m); };
  if (!keys.data || keys.rows < 1 || keys.dim < 1) bad("no keys");
  if (keys.rows > std::numeric_limits<int32_t>::max()) bad("more than 2^31 keys");
  if (keys.dtype != DType::f32 && keys.dtype != DType::f16 && keys.dtype != DType::bf16) bad("unknown key dtype");
  if (num_queries < 0 || (num_queries > 0 && !train_queries)) bad("bad training queries");
  if (p.degree < 2 || p.degree > 1024) bad("degree must be in [2, 1024]");
  if (p.query_neighbors < 2) bad("query_neighbors must be >= 2");
  if (!(p.sample_fraction > 0.0 && p.sample_fraction <= 1.0)) bad("sample_fraction must be in (0, 1]");
  if (!(p.repair_fraction >= 0.0 && p.repair_fraction <= 1.0)) bad("repair_fraction must be in [0, 1]");
  if (p.key_metric < 0 || p.key_metric > 2) bad("key_metric must be 0, 1 or 2");
  if (p.causal_key_offset < 0) bad("causal_key_offset must be >= 0");
  if (!(p.key_metric_ridge > 0.0) || p.key_metric_passes < 0 || p.key_metric_passes > 7)
    bad("key_metric_ridge must be > 0 and key_metric_passes in [0, 7]");
  if (p.build_queue < 1 || p.threads < 1 || p.pivot_capacity < 1 || p.extra_slots < 0 || p.entry_points < 1)
    bad("build_queue, threads, pivot_capacity and entry_points must be >= 1, extra_slots >= 0");
  if (p.insert_queue < 1 || p.insert_queue > (1 << 20) || p.insert_pivots < 1 || p.insert_pivots > (1 << 20) ||
      p.insert_reverse < 0 || p.insert_reverse > (1 << 20) || p.insert_key_queue < 0 || p.insert_key_queue > (1 << 20))
    bad("insert_queue and insert_pivots must be in [1, 2^20], insert_reverse and insert_key_queue in [0, 2^20]");
  if (p.shift_queries < 0) bad("shift_queries must be >= 0");
  if (p.causal && p.shift_queries > 0 && num_queries > 0) bad("shift_queries does not combine with causal training lists");
  // The build never trusts its data: a NaN score has no rank, and an
  // unranked top-k list would index outside the graph.
  if (const int64_t at = first_out_of_range(keys.dtype, keys.data, size_t(keys.rows) * size_t(keys.dim), DType::f32);
      at >= 0)
    bad("key " + std::to_string(at / keys.dim) + ", element " + std::to_string(at % keys.dim) + ": " +
        describe_out_of_range(keys.dtype, keys.data, size_t(at), DType::f32));
  if (num_queries > 0)
    if (const int64_t at = first_out_of_range(train_queries, size_t(num_queries) * size_t(keys.dim)); at >= 0)
      bad("training query " + std::to_string(at / keys.dim) + ", element " + std::to_string(at % keys.dim) + ": " +
          describe_out_of_range(DType::f32, train_queries, size_t(at), DType::f32));
  std::vector<float> train;
  const int64_t original_queries = num_queries;
  if (p.shift_queries > 0 && num_queries > 0) {
    train = with_shifted_copies(train_queries, num_queries, keys.dim, p, "build_projected_graph");
    train_queries = train.data();
    num_queries = int64_t(train.size() / size_t(keys.dim));
  }
  auto g = std::make_unique<internal::ProjectedGraph>(p.degree, p.degree + p.extra_slots, p.build_queue,
                                                      p.query_neighbors, std::move(kernels));
  g->set_insert_params(p.insert_queue, p.insert_pivots, p.insert_reverse, p.insert_key_queue);
  g->build(keys, train_queries, num_queries, p, progress);
  g->set_shifted_queries(num_queries - original_queries);
  return g;
}

bool is_projected_graph(const KeyIndex& index) {
  return dynamic_cast<const internal::ProjectedGraph*>(&index) != nullptr;
}

void refresh_projected_graph(KeyIndex& index, const RowsView& keys, const float* queries, int64_t num_queries,
                             const GraphBuildParams& p) {
  auto* g = dynamic_cast<internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "refresh_projected_graph: not a projected graph index");
  if (num_queries < 0 || (num_queries > 0 && !queries))
    fail(Status::invalid_argument, "refresh_projected_graph: needs num_queries >= 0 query rows");
  if (keys.dim < 1) fail(Status::invalid_argument, "refresh_projected_graph: no key dimension");
  g->refresh(keys, with_shifted_copies(queries, num_queries, keys.dim, p, "refresh_projected_graph"), p);
}

void set_insert_params(KeyIndex& index, const GraphBuildParams& p) {
  auto* g = dynamic_cast<internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "set_insert_params: not a projected graph index");
  if (p.insert_queue < 1 || p.insert_queue > (1 << 20) || p.insert_pivots < 1 || p.insert_pivots > (1 << 20) ||
      p.insert_reverse < 0 || p.insert_reverse > (1 << 20) || p.insert_key_queue < 0 || p.insert_key_queue > (1 << 20))
    fail(Status::invalid_argument, "set_insert_params: insert_queue and insert_pivots must be in [1, 2^20], insert_reverse and insert_key_queue in [0, 2^20]");
  g->set_insert_params(p.insert_queue, p.insert_pivots, p.insert_reverse, p.insert_key_queue);
}

GraphInfo projected_graph_info(const KeyIndex& index) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_info: not a projected graph index");
  return g->info();
}

std::vector<int32_t> projected_graph_neighbors(const KeyIndex& index, int32_t id) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_neighbors: not a projected graph index");
  return g->neighbors(id);
}

std::vector<int32_t> projected_graph_entries(const KeyIndex& index) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_entries: not a projected graph index");
  return g->entries();
}

int64_t expansion_footprint(const KeyIndex& index, const int32_t* ids, int n) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "expansion_footprint: not a projected graph index");
  if (n < 0 || (n > 0 && !ids)) fail(Status::invalid_argument, "expansion_footprint: bad id list");
  return g->expansion_footprint(ids, n);
}

}  // namespace rattn
