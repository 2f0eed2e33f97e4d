#include "runtime/index/projected_codes.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include <dnnl.hpp>

#include "core/dtype.h"
#include "core/error.h"

namespace rattn::internal {

void symmetric_eigen(std::vector<double> a, int n, std::vector<double>* values, std::vector<double>* vectors) {
  const size_t N = size_t(n);
  for (size_t i = 0; i < N; ++i)
    for (size_t j = 0; j < i; ++j) a[j * N + i] = a[i * N + j] = 0.5 * (a[i * N + j] + a[j * N + i]);
  std::vector<double> v(N * N, 0.0);  // columns: eigenvectors
  for (size_t i = 0; i < N; ++i) v[i * N + i] = 1.0;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0, total = 0;
    for (size_t i = 0; i < N; ++i)
      for (size_t j = 0; j < N; ++j) (i == j ? total : off) += a[i * N + j] * a[i * N + j];
    if (off <= 1e-26 * (total + off) || off == 0) break;
    for (size_t p = 0; p + 1 < N; ++p)
      for (size_t q = p + 1; q < N; ++q) {
        const double apq = a[p * N + q];
        if (std::fabs(apq) < 1e-300) continue;
        const double theta = (a[q * N + q] - a[p * N + p]) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (size_t k = 0; k < N; ++k) {  // columns p, q
          const double akp = a[k * N + p], akq = a[k * N + q];
          a[k * N + p] = c * akp - s * akq;
          a[k * N + q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < N; ++k) {  // rows p, q
          const double apk = a[p * N + k], aqk = a[q * N + k];
          a[p * N + k] = c * apk - s * aqk;
          a[q * N + k] = s * apk + c * aqk;
        }
        for (size_t k = 0; k < N; ++k) {
          const double vkp = v[k * N + p], vkq = v[k * N + q];
          v[k * N + p] = c * vkp - s * vkq;
          v[k * N + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[size_t(x) * N + size_t(x)] > a[size_t(y) * N + size_t(y)]; });
  values->resize(N);
  vectors->resize(N * N);
  for (size_t i = 0; i < N; ++i) {
    const size_t o = size_t(order[i]);
    (*values)[i] = a[o * N + o];
    for (size_t k = 0; k < N; ++k) (*vectors)[i * N + k] = v[k * N + o];
  }
}

void ProjectedCodes::fit(const RowsView& keys, int64_t rows, const std::vector<float>& query_moment, int dims,
                         int coarse_dims) {
  const int d = keys.dim;
  if (d <= 0 || rows < 0 || rows > keys.rows) fail(Status::invalid_argument, "projected codes: bad key rows");
  if (dims < 1 || dims > d) fail(Status::invalid_argument, "projected codes: dims must be in [1, head_dim]");
  if (coarse_dims < 0 || coarse_dims > dims)
    fail(Status::invalid_argument, "projected codes: coarse_dims must be in [0, dims]");
  if (!query_moment.empty() && query_moment.size() != size_t(d) * size_t(d))
    fail(Status::invalid_argument, "projected codes: query moment is not [d, d]");
  const size_t D = size_t(d);
  // Sq^{1/2} and Sq^{-1/2} (a small ridge keeps the inverse finite).
  std::vector<double> sq(D * D, 0.0);
  for (size_t i = 0; i < D; ++i)
    for (size_t j = 0; j < D; ++j) sq[i * D + j] = query_moment.empty() ? double(i == j) : double(query_moment[i * D + j]);
  double trace = 0;
  for (size_t i = 0; i < D; ++i) trace += sq[i * D + i];
  const double ridge = 1e-4 * std::max(trace, 1e-30) / double(d);
  for (size_t i = 0; i < D; ++i) sq[i * D + i] += ridge;
  std::vector<double> lq, uq;
  symmetric_eigen(sq, d, &lq, &uq);
  std::vector<double> half(D * D, 0.0), inv_half(D * D, 0.0);
  for (size_t e = 0; e < D; ++e) {
    const double l = std::max(lq[e], ridge), sl = std::sqrt(l), isl = 1.0 / sl;
    const double* u = uq.data() + e * D;
    for (size_t i = 0; i < D; ++i)
      for (size_t j = 0; j < D; ++j) {
        half[i * D + j] += sl * u[i] * u[j];
        inv_half[i * D + j] += isl * u[i] * u[j];
      }
  }
  // Key covariance from evenly spaced rows.
  std::vector<double> mean(D, 0.0), ck(D * D, 0.0), x(D);
  std::vector<float> xf(D);
  const int64_t step = std::max<int64_t>(1, rows / 16384);
  int64_t cnt = 0;
  const auto row_f32 = [&](int64_t i) -> const float* {
    if (keys.dtype == DType::f32) return static_cast<const float*>(keys.row(i));
    to_f32(keys.dtype, keys.row(i), xf.data(), xf.size());
    return xf.data();
  };
  for (int64_t i = 0; i < rows; i += step, ++cnt) {
    const float* r = row_f32(i);
    for (size_t j = 0; j < D; ++j) mean[j] += r[j];
  }
  for (auto& m : mean) m /= double(std::max<int64_t>(cnt, 1));
  for (int64_t i = 0; i < rows; i += step) {
    const float* r = row_f32(i);
    for (size_t j = 0; j < D; ++j) x[j] = r[j] - mean[j];
    for (size_t a = 0; a < D; ++a)
      for (size_t b = 0; b <= a; ++b) ck[a * D + b] += x[a] * x[b];
  }
  for (size_t a = 0; a < D; ++a)
    for (size_t b = 0; b < a; ++b) ck[b * D + a] = ck[a * D + b];
  // M = Sq^{1/2} Ck Sq^{1/2}.
  std::vector<double> t(D * D, 0.0), m(D * D, 0.0);
  for (size_t i = 0; i < D; ++i)
    for (size_t k = 0; k < D; ++k)
      for (size_t j = 0; j < D; ++j) t[i * D + j] += half[i * D + k] * ck[k * D + j];
  for (size_t i = 0; i < D; ++i)
    for (size_t k = 0; k < D; ++k)
      for (size_t j = 0; j < D; ++j) m[i * D + j] += t[i * D + k] * half[k * D + j];
  std::vector<double> lm, vm;
  symmetric_eigen(m, d, &lm, &vm);
  d_ = d;
  dims_ = dims;
  coarse_ = coarse_dims;
  key_proj_.assign(size_t(dims) * D, 0.0f);
  query_proj_.assign(size_t(dims) * D, 0.0f);
  for (size_t r = 0; r < size_t(dims); ++r) {
    const double* v = vm.data() + r * D;
    for (size_t j = 0; j < D; ++j) {
      double kp = 0, qp = 0;  // (Sq^{+-1/2} v)[j]; both symmetric
      for (size_t i = 0; i < D; ++i) {
        kp += half[j * D + i] * v[i];
        qp += inv_half[j * D + i] * v[i];
      }
      key_proj_[r * D + j] = float(kp);
      query_proj_[r * D + j] = float(qp);
    }
  }
  encode(keys, 0, rows, true);
}

void ProjectedCodes::append(const RowsView& keys, int64_t upto) {
  if (!fitted()) fail(Status::invalid_argument, "projected codes: append before fit");
  if (keys.dim != d_ || upto > keys.rows) fail(Status::invalid_argument, "projected codes: key store does not match the codes");
  if (upto > rows()) encode(keys, rows(), upto, false);
}

namespace {
// out[r] = <row r of the [dims, d] matrix `proj`, x>.
void project(const std::vector<float>& proj, int dims, int d, const float* x, float* out) {
  for (size_t r = 0; r < size_t(dims); ++r) {
    const float* p = proj.data() + r * size_t(d);
    float acc = 0;
    for (size_t j = 0; j < size_t(d); ++j) acc += p[j] * x[j];
    out[r] = acc;
  }
}
}  // namespace

void ProjectedCodes::project_query(const float* q, float* out) const { project(query_proj_, dims_, d_, q, out); }

void ProjectedCodes::project_key(const float* k, float* out) const { project(key_proj_, dims_, d_, k, out); }

// All rows' projections with one oneDNN GEMM per block (fp16/bf16 keys
// converted a block at a time): a row-by-row loop took 1.1 s for 131072 keys
// at 80 directions, d = 128, each time the codes are fitted.
void ProjectedCodes::encode(const RowsView& keys, int64_t from, int64_t to, bool fit_ranges) {
  const int64_t n = to - from;
  std::vector<float> proj(size_t(n) * size_t(dims_));
  if (n < 64) {  // an insert's few rows: a GEMM call costs more than the loop
    std::vector<float> xf(static_cast<size_t>(d_));
    for (int64_t i = 0; i < n; ++i) {
      const float* r = static_cast<const float*>(keys.row(from + i));
      if (keys.dtype != DType::f32) {
        to_f32(keys.dtype, keys.row(from + i), xf.data(), xf.size());
        r = xf.data();
      }
      project_key(r, proj.data() + size_t(i) * size_t(dims_));
    }
  } else {
    constexpr int64_t kBlock = 4096;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::atomic<bool> failed{false};
#pragma omp parallel num_threads(2) if (n > kBlock)
    {
      std::vector<float> xf(keys.dtype == DType::f32 ? 0 : size_t(kBlock) * size_t(d_));  // per thread
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t r0 = b * kBlock, rows = std::min(kBlock, n - r0);
        const float* x = static_cast<const float*>(keys.row(from + r0));
        if (keys.dtype != DType::f32) {
          to_f32(keys.dtype, keys.row(from + r0), xf.data(), size_t(rows) * size_t(d_));
          x = xf.data();
        }
        // proj[r0 .. r0 + rows) = x [rows, d] * key_proj_' ([dims, d]).
        if (dnnl_sgemm('N', 'T', rows, dims_, d_, 1.0f, x, d_, key_proj_.data(), d_, 0.0f,
                       proj.data() + size_t(r0) * size_t(dims_), dims_) != dnnl_success)
          failed = true;
      }
    }
    if (failed) fail(Status::internal, "projected codes: oneDNN sgemm failed");
  }
  if (fit_ranges) codes_.fit(RowsView{proj.data(), DType::f32, n, dims_}, n, coarse_);
  else codes_.append_rows(proj.data(), n);
}

}  // namespace rattn::internal
