// The key-to-key relations of the projected graph's build passes: keys under
// the training queries' metric (Cholesky transform) or minus their mean.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include <dnnl.hpp>

#include "core/error.h"
#include "runtime/index/projected_graph_impl.h"

namespace rattn::internal {

std::vector<float> cholesky_columns(std::vector<double> S, int d) {
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
  std::vector<float> Lt(size_t(d) * size_t(d), 0.0f);  // row j: column j of L
  for (int j = 0; j < d; ++j)
    for (int i = j; i < d; ++i) Lt[size_t(j) * size_t(d) + size_t(i)] = float(S[size_t(i) * size_t(d) + size_t(j)]);
  return Lt;
}

KeyRows rows_times_cholesky(const RowsView& kf, const std::vector<float>& Lt, int threads) {
  const int d = kf.dim;
  const int64_t N = kf.rows;
  // (L' k)_j = sum_{i >= j} L[i][j] k_i.
  KeyRows out(size_t(N) * size_t(d));
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

KeyRows keys_times_cholesky(const RowsView& kf, std::vector<double> S, int threads) {
  return rows_times_cholesky(kf, cholesky_columns(std::move(S), kf.dim), threads);
}

KeyRows query_metric_keys(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
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

KeyRows keys_minus(const RowsView& kf, const std::vector<float>& mean, int threads) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  KeyRows out(size_t(N) * size_t(d));
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
KeyRows centered_keys(const RowsView& kf, const std::vector<double>& mean, int threads, std::vector<float>* mean_out) {
  *mean_out = std::vector<float>(mean.begin(), mean.end());
  return keys_minus(kf, *mean_out, threads);
}

std::vector<double> key_means(const RowsView& kf, int threads) {
  const int64_t N = kf.rows;
  const int d = kf.dim;
  // Split by dimensions across the threads: each mean is the serial loop's
  // sum, over the rows in row order.
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
#pragma omp parallel num_threads(int(std::max<int64_t>(1, std::min<int64_t>(threads, d))))
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const int j0 = int(int64_t(d) * t / T), j1 = int(int64_t(d) * (t + 1) / T);
    for (int64_t i = 0; i < N; ++i) {
      const float* r = static_cast<const float*>(kf.row(i));
      for (int j = j0; j < j1; ++j) mean[size_t(j)] += r[j];
    }
  }
  for (auto& x : mean) x /= double(std::max<int64_t>(1, N));
  return mean;
}

}  // namespace rattn::internal
