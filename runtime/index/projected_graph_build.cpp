// The projected graph's build, as its phases (training queries, exact
// top-k lists, key relations, pivots, projection, reverse edges, 2-hop fill,
// entry points, connectivity, repair, list order), and refresh().
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <exception>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/error.h"
#include "core/hash.h"
#include "runtime/index/projected_graph_impl.h"

namespace rattn::internal {
namespace {

// Wall and process CPU time between marks, for GraphInfo::build_phases.
class PhaseClock {
 public:
  explicit PhaseClock(std::vector<BuildPhase>* out) : out_(out) {
    out_->clear();
    last_wall_ = seconds_now();
    last_cpu_ = cpu();
  }
  void mark(const char* name) {
    const double w = seconds_now(), c = cpu();
    out_->push_back({name, w - last_wall_, c - last_cpu_});
    last_wall_ = w;
    last_cpu_ = c;
  }

 private:
  static double cpu() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  std::vector<BuildPhase>* out_;
  double last_wall_, last_cpu_;
};

// The first `rows` rows of `keys` as fp32 (the build's GEMM and pass input):
// the store itself when it is fp32, else a copy in `storage`.
RowsView f32_rows(const RowsView& keys, int64_t rows, std::vector<float>* storage) {
  RowsView kf{keys.data, DType::f32, rows, keys.dim};
  if (keys.dtype != DType::f32) {
    storage->resize(size_t(rows) * size_t(keys.dim));
    to_f32(keys.dtype, keys.data, storage->data(), storage->size());
    kf.data = storage->data();
  }
  return kf;
}

// 1. Training queries: a seeded sample of sample_fraction of them, in row
//    order; with causal lists, only those that see at least nq keys.
std::vector<int64_t> pick_training_queries(int64_t num_queries, int nq, const GraphBuildParams& p) {
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
  if (p.causal) {
    // Causal lists: query t only against the keys it attends to (rows
    // <= t - causal_key_offset); queries that see fewer than nq keys drop out.
    picked.erase(std::remove_if(picked.begin(), picked.end(),
                                [&](int64_t t) { return t - p.causal_key_offset + 1 < nq; }),
                 picked.end());
  }
  return picked;
}

// 3. Pivot per query: its best key, unless that key already serves as pivot
//    for pivot_capacity queries (hubs), then the next one; each query takes
//    up to pivots_per_query pivots.
struct Pivots {
  std::vector<int64_t> start;     // [N + 1]: the queries of pivot v are by_pivot[start[v], start[v + 1])
  std::vector<int64_t> by_pivot;  // query ids grouped by pivot (CSR)
  std::vector<int32_t> top1_count;    // per key: training queries whose best key it is
  std::vector<int32_t> listed_count;  // per key: training lists holding it
};

Pivots assign_pivots(const std::vector<int32_t>& knn, int64_t Q, int nq, int64_t N, const GraphBuildParams& p) {
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
  return Pivots{std::move(start), std::move(by_pivot), std::move(top1_count), std::move(listed_count)};
}

// 4. Projection + occlusion pruning: each pivot links to its queries' other
//    neighbours, ranked by inner product with the pivot (`kp`: the keys in
//    the projection's key relations). Returns [N, M] out-lists (-1: empty slot).
std::vector<int32_t> project_and_prune(const RowsView& kp, const std::vector<int32_t>& knn, int nq, const Pivots& pv,
                                       const GraphBuildParams& p, const Distance* build_dist) {
  const int64_t N = kp.rows;
  const int M = p.degree;
  const std::vector<int64_t>& start = pv.start;
  const std::vector<int64_t>& by_pivot = pv.by_pivot;
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
      keep_best_sorted(ranked, pool_limit);
      occlusion_prune(kp, ranked, M, &kept);
      std::copy(kept.begin(), kept.end(), fwd.begin() + std::ptrdiff_t(size_t(v) * size_t(M)));
    }
  }
  return fwd;
}

// 5. Reverse edges: each node's list is its out-list `fwd` plus the nodes
//    linking to it, re-pruned where the degree would exceed M.
void add_reverse_edges(ProjectedGraph& g, const RowsView& kp, const std::vector<int32_t>& fwd,
                       const GraphBuildParams& p, const Distance* build_dist) {
  const int64_t N = kp.rows;
  const int M = p.degree;
  const size_t pool_limit = size_t(3) * size_t(M);
  // In-lists by a counting sort on the build threads: thread t counts and
  // fills the sources of its own range of v, after the ranges before it,
  // so every in-list holds its sources in ascending order, as serially.
  const int team = int(std::max<int64_t>(1, std::min<int64_t>(p.threads, N)));
  std::vector<std::vector<int64_t>> at(static_cast<size_t>(team));  // per thread: its next slot of each in-list
  std::vector<int64_t> rstart(size_t(N) + 1, 0);
  std::vector<int32_t> rev;
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t v0 = N * t / T, v1 = N * (t + 1) / T;
    std::vector<int64_t>& mine = at[size_t(t)];
    mine.assign(size_t(N), 0);
    for (size_t e = size_t(v0) * size_t(M); e < size_t(v1) * size_t(M); ++e)
      if (fwd[e] >= 0) ++mine[size_t(fwd[e])];
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t c = 0; c < N; ++c) {
      int64_t total = 0;
      for (int u = 0; u < T; ++u) {
        const int64_t n = at[size_t(u)][size_t(c)];
        at[size_t(u)][size_t(c)] = total;  // the offset of thread u's sources within c's list
        total += n;
      }
      rstart[size_t(c) + 1] = total;
    }
#pragma omp single
    {
      for (int64_t i = 0; i < N; ++i) rstart[size_t(i) + 1] += rstart[size_t(i)];
      rev.resize(static_cast<size_t>(rstart[size_t(N)]));
    }
    for (int64_t v = v0; v < v1; ++v)
      for (int j = 0; j < M; ++j) {
        const int32_t c = fwd[size_t(v) * size_t(M) + size_t(j)];
        if (c >= 0) rev[size_t(rstart[size_t(c)] + mine[size_t(c)]++)] = int32_t(v);
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
        g.set_neighbors(v, pool);
        continue;
      }
      scores.resize(pool.size());
      build_dist->dots(static_cast<const float*>(kp.row(v)), kp, pool.data(), int(pool.size()), scores.data());
      ranked.resize(pool.size());
      for (size_t i = 0; i < pool.size(); ++i) ranked[i] = {scores[i], pool[i]};
      keep_best_sorted(ranked, pool_limit);
      occlusion_prune(kp, ranked, M, &kept);
      g.set_neighbors(v, kept);
    }
  }
}

// 6. Entry points: the key nearest (L2) to the centroid of all keys, then
//    the keys most often a training query's best key (sinks, typically),
//    then the keys most often in training queries' lists: seeds spread over
//    the regions queries go to, all scored when a search starts.
std::vector<int32_t> choose_entry_points(const RowsView& kf, const std::vector<double>& centroid, const Pivots& pv,
                                         int entry_points, int threads) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  std::vector<int32_t> entries;
  // The distances split across the threads by rows; the first minimum wins,
  // as serially.
  std::vector<std::pair<double, int64_t>> nearest(size_t(std::max(1, threads)),
                                                  {std::numeric_limits<double>::infinity(), 0});
#pragma omp parallel num_threads(std::max(1, threads))
  {
    std::pair<double, int64_t>& mine = nearest[size_t(omp_get_thread_num())];
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* r = static_cast<const float*>(kf.row(i));
      double s = 0;
      for (int j = 0; j < d; ++j) s += (r[j] - centroid[size_t(j)]) * (r[j] - centroid[size_t(j)]);
      if (s < mine.first) mine = {s, i};
    }
  }
  int64_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (const auto& [dist, i] : nearest)
    if (dist < best_d || (dist == best_d && i < best)) {
      best_d = dist;
      best = i;
    }
  entries.assign(1, int32_t(best));
  const auto add_by = [&](const std::vector<int32_t>& count, int how_many) {
    std::vector<int32_t> ids(static_cast<size_t>(N));
    std::iota(ids.begin(), ids.end(), 0);
    const int n = std::min<int>(how_many, int(N));
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return count[size_t(a)] > count[size_t(b)] || (count[size_t(a)] == count[size_t(b)] && a < b);
    });
    for (int i = 0; i < n && int(entries.size()) < entry_points; ++i)
      if (count[size_t(ids[size_t(i)])] > 0 &&
          std::find(entries.begin(), entries.end(), ids[size_t(i)]) == entries.end())
        entries.push_back(ids[size_t(i)]);
  };
  add_by(pv.top1_count, std::min(entry_points - 1, 8));
  add_by(pv.listed_count, entry_points);
  return entries;
}

}  // namespace

void ProjectedGraph::build(const RowsView& keys_in, const float* queries, int64_t num_queries,
                           const GraphBuildParams& p, const ProgressFn& progress) {
  const int64_t N = keys_in.rows;
  const int d = keys_in.dim;
  PhaseClock clock(&build_phases_);
  // The build works on an fp32 copy (GEMM input); search uses the store itself.
  std::vector<float> kcopy;
  const RowsView kf = f32_rows(keys_in, N, &kcopy);
  resize_nodes(N);
  size_ = N;
  const auto report = [&](double x) {
    if (progress) progress(std::min(1.0, std::max(0.0, x)));
  };

  // 1. Training queries.
  const int nq = int(std::min<int64_t>(p.query_neighbors, N));
  const std::vector<int64_t> picked = pick_training_queries(num_queries, nq, p);
  const int64_t Q = int64_t(picked.size());
  training_queries_ = Q;

  // 2. Top-nq per training query (exact or partitioned, p.knn_*), and the
  // key relations of the passes with the query model of the projected codes.
  // A GPU's kNN runs beside the key relations, which do not depend on it;
  // its phase is then the wait for it after them.
  std::vector<int32_t> knn;
  knn_stats_ = KnnStats{};
  KeyRows kt;
  RowsView kk;
  std::vector<double> key_mean;  // per dimension: the centred keys' and the entry point's
  const double check_start = seconds_now();
  const bool knn_on_gpu = Q > 0 && training_knn_on_gpu(p, N, Q, d, nq);  // automatic: opens the device
  const double check_seconds = seconds_now() - check_start;
  if (knn_on_gpu) {
    KnnStats gpu_stats;
    std::exception_ptr gpu_error;
    std::thread gpu([&] {
      try {
        knn = training_knn(kf, queries, picked, nq, p, {}, &gpu_stats);
      } catch (...) {
        gpu_error = std::current_exception();
      }
    });
    try {
      kk = key_relations(kf, queries, picked, p, &kt, &key_mean);
      if (p.keep_query_moment) keep_query_moment(queries, picked, d);
    } catch (...) {
      gpu.join();
      throw;
    }
    clock.mark("key_metric");
    gpu.join();
    if (gpu_error) std::rethrow_exception(gpu_error);
    knn_stats_ = std::move(gpu_stats);
    knn_stats_.gpu_open_seconds += check_seconds;
    clock.mark("training_knn");
    report(0.6);
  } else {
    if (Q > 0)
      knn = training_knn(kf, queries, picked, nq, p, [&](double x) { report(0.6 * x); }, &knn_stats_);
    clock.mark("training_knn");
    kk = key_relations(kf, queries, picked, p, &kt, &key_mean);
    if (Q > 0 && p.keep_query_moment) keep_query_moment(queries, picked, d);
    clock.mark("key_metric");
  }
  const RowsView kp = (p.key_metric_passes & 1) ? kk : kf;  // projection, reverse edges, 2-hop fill

  // 3. Pivots.
  const Pivots pivots = assign_pivots(knn, Q, nq, N, p);
  clock.mark("pivots");
  report(0.65);

  // The build's batched inner products: the built-in kernels (bit-identical
  // to dot_row) whatever distance_ the searches use.
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  // 4. Projection and occlusion pruning.
  std::vector<int32_t> fwd = project_and_prune(kp, knn, nq, pivots, p, build_dist.get());
  if (p.repair_fraction <= 0 && !p.cooccurrence_order) {
    knn.clear();
    knn.shrink_to_fit();
  }
  clock.mark("projection_pruning");
  report(0.75);

  // 5. Reverse edges; under-full nodes take their best 2-hop neighbours.
  add_reverse_edges(*this, kp, fwd, p, build_dist.get());
  fwd.clear();
  fwd.shrink_to_fit();
  clock.mark("reverse_edges");
  if (p.fill_two_hop) fill_from_two_hop((p.key_metric_passes & 1) ? kk : kf, p);
  clock.mark("two_hop_fill");
  report(0.85);

  // 6. Entry points.
  entries_ = choose_entry_points(kf, key_mean, pivots, p.entry_points, p.threads);
  clock.mark("entry_points");

  // 7. Connectivity for keys no projected edge reaches.
  connect_unreached((p.key_metric_passes & 2) ? kk : kf, p, knn_stats_.key_partition);
  knn_stats_.key_partition = {};
  clock.mark("connectivity");
  // 8. Query-guided repair (repair_fraction of the training queries). Its
  //    searches walk the key store itself, as decode's do: an fp16 store
  //    is half the bytes of the fp32 copy.
  if (p.repair_fraction > 0 && Q > 0) {
    repair_with_queries(keys_in, (p.key_metric_passes & 4) ? kk : kf, queries, picked, knn, nq, p);
    unreachable_ = count_outside_tree();
  }
  clock.mark("repair");
  // 9. Lists ordered by co-occurrence in the training lists.
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

// Key-to-key relations of the graph passes (projection order, occlusion,
// reverse pruning, 2-hop fill, connectivity, repair). With key_metric in the
// queries' metric: <k1, k2>_S = k1' S k2 with S the second moment of the
// training queries, i.e. how alike two keys score across queries, computed
// as plain inner products of transformed keys L' k (S = L L'); with
// center_keys the keys minus their mean; else the keys themselves. Keeps
// the metric or the mean for the insert path; `storage` holds the keys,
// `key_mean` the keys' mean (key_means), which the entry point uses too.
RowsView ProjectedGraph::key_relations(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                                       const GraphBuildParams& p, KeyRows* storage, std::vector<double>* key_mean) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  *key_mean = key_means(kf, p.threads);
  const bool metric = !picked.empty() && p.key_metric != 0;
  RowsView kk = kf;
  if (metric) {
    *storage = query_metric_keys(kf, queries, picked, p.key_metric == 2, p.key_metric_ridge, p.threads,
                                 &key_alignment_, &metric_);
    kk = RowsView{storage->data(), DType::f32, N, d};
  } else if (p.center_keys) {
    *storage = centered_keys(kf, *key_mean, p.threads, &key_mean_);
    kk = RowsView{storage->data(), DType::f32, N, d};
  }
  key_metric_used_ = metric ? p.key_metric : 0;
  return kk;
}

// The training queries' second moment (at most 8192 evenly spaced ones,
// unit trace): the query model of the projected traversal codes.
void ProjectedGraph::keep_query_moment(const float* queries, const std::vector<int64_t>& picked, int d) {
  const int64_t Q = int64_t(picked.size());
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
  const RowsView kf = f32_rows(keys, N, &kcopy);
  std::vector<int64_t> picked(static_cast<size_t>(Q));
  std::iota(picked.begin(), picked.end(), 0);
  const int nq = int(std::min<int64_t>(p.query_neighbors, N));
  const std::vector<int32_t> knn = exact_knn(kf, queries.data(), picked, nq, p.threads, {});
  // The repair's key relations (key_metric_passes bit 4, as in the build).
  KeyRows kt;
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
  rp.repair_max_queries = 0;  // the refresh's sample is its own choice
  const RowsView store{keys.data, keys.dtype, N, d};  // the searches walk the store, as in the build
  refresh_edges_ += repair_with_queries(store, kk, queries.data(), picked, knn, nq, rp);
  refresh_queries_ += Q;
  unreachable_ = count_unreachable();
}

}  // namespace rattn::internal
