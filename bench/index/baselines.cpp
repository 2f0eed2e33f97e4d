#include "bench/index/baselines.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFFlat.h>
#include <hnswlib/hnswlib.h>

namespace rattn::bench {

std::vector<float> column_mean(const float* rows, int64_t n, int d) {
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) sum[size_t(j)] += rows[size_t(i) * size_t(d) + size_t(j)];
  std::vector<float> mean(static_cast<size_t>(d), 0.0f);
  for (int j = 0; j < d; ++j) mean[size_t(j)] = n > 0 ? float(sum[size_t(j)] / double(n)) : 0.0f;
  return mean;
}

std::vector<float> centred_rows(const float* rows, int64_t n, int d, std::vector<float>* mean_out) {
  *mean_out = column_mean(rows, n, d);
  return rows_minus(rows, n, d, *mean_out);
}

std::vector<float> rows_minus(const float* rows, int64_t n, int d, const std::vector<float>& mean) {
  std::vector<float> out(size_t(n) * size_t(d));
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) out[size_t(i) * size_t(d) + size_t(j)] = rows[size_t(i) * size_t(d) + size_t(j)] - mean[size_t(j)];
  return out;
}

QueryMetric::QueryMetric(const float* queries, int64_t n, int d, bool covariance, double ridge_share) : d_(d) {
  const size_t D = size_t(d);
  std::vector<double> mean(D, 0.0);
  if (covariance && n > 0)
    for (int64_t i = 0; i < n; ++i)
      for (size_t j = 0; j < D; ++j) mean[j] += double(queries[size_t(i) * D + j]) / double(n);
  std::vector<double> S(D * D, 0.0), x(D);
  for (int64_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < D; ++j) x[j] = double(queries[size_t(i) * D + j]) - mean[j];
    for (size_t a = 0; a < D; ++a)
      for (size_t b = 0; b <= a; ++b) S[a * D + b] += x[a] * x[b];
  }
  double trace = 0;
  for (size_t a = 0; a < D; ++a) trace += S[a * D + a];
  const double ridge = ridge_share * trace / double(d) + 1e-12;
  for (size_t a = 0; a < D; ++a) S[a * D + a] += ridge;
  // Cholesky, lower triangle (S is positive definite with the ridge).
  l_.assign(D * D, 0.0);
  for (size_t i = 0; i < D; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double v = S[i * D + j];
      for (size_t k = 0; k < j; ++k) v -= l_[i * D + k] * l_[j * D + k];
      l_[i * D + j] = i == j ? std::sqrt(std::max(v, 1e-300)) : v / l_[j * D + j];
    }
}

std::vector<float> QueryMetric::keys(const float* rows, int64_t n) const {
  const size_t D = size_t(d_);
  std::vector<float> out(size_t(n) * D);
  for (int64_t r = 0; r < n; ++r) {
    const float* k = rows + size_t(r) * D;
    for (size_t i = 0; i < D; ++i) {
      double acc = 0;
      for (size_t j = i; j < D; ++j) acc += l_[j * D + i] * double(k[j]);
      out[size_t(r) * D + i] = float(acc);
    }
  }
  return out;
}

std::vector<float> QueryMetric::queries(const float* rows, int64_t n) const {
  const size_t D = size_t(d_);
  std::vector<float> out(size_t(n) * D);
  std::vector<double> y(D);
  for (int64_t r = 0; r < n; ++r) {
    const float* q = rows + size_t(r) * D;
    for (size_t i = 0; i < D; ++i) {
      double v = q[i];
      for (size_t j = 0; j < i; ++j) v -= l_[i * D + j] * y[j];
      y[i] = v / l_[i * D + i];
      out[size_t(r) * D + i] = float(y[i]);
    }
  }
  return out;
}

namespace {

thread_local int64_t hnsw_distance_calls = 0;

// hnswlib's inner-product kernel for this space's dimension, with its
// parameter: each space carries its own (the kernel depends on the dimension).
struct CountedKernel {
  hnswlib::DISTFUNC<float> base;
  void* base_param;
};
float counted_ip_distance(const void* a, const void* b, const void* param) {
  ++hnsw_distance_calls;
  const auto* k = static_cast<const CountedKernel*>(param);
  return k->base(a, b, k->base_param);
}
class CountingIpSpace final : public hnswlib::SpaceInterface<float> {
 public:
  explicit CountingIpSpace(size_t dim) : base_(dim), kernel_{base_.get_dist_func(), base_.get_dist_func_param()} {}
  size_t get_data_size() override { return base_.get_data_size(); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return &counted_ip_distance; }
  void* get_dist_func_param() override { return &kernel_; }

 private:
  hnswlib::InnerProductSpace base_;
  CountedKernel kernel_;
};

}  // namespace

struct HnswIp::Impl {
  Impl(int d, int64_t capacity, int M, int efc, uint64_t seed)
      : dim(d), space(size_t(d)), h(&space, size_t(capacity), size_t(M), size_t(efc), size_t(seed)) {}
  int dim;
  CountingIpSpace space;
  hnswlib::HierarchicalNSW<float> h;
  int64_t added = 0;
};

HnswIp::HnswIp(int d, int64_t capacity, int M, int ef_construction, uint64_t seed)
    : impl_(std::make_unique<Impl>(d, capacity, M, ef_construction, seed)) {}
HnswIp::~HnswIp() = default;

void HnswIp::add(const float* rows, int64_t first_id, int64_t n, int threads) {
  if (n <= 0) return;
  const size_t d = size_t(impl_->dim);
  int64_t start = 0;
  if (impl_->added == 0) {
    impl_->h.addPoint(rows, size_t(first_id));
    start = 1;
  }
  auto& h = impl_->h;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 256)
  for (int64_t i = start; i < n; ++i) h.addPoint(rows + size_t(i) * d, size_t(first_id + i));
  impl_->added += n;
}

void HnswIp::search(const float* q, int k, int ef, std::vector<int32_t>* ids, int64_t* scored) {
  impl_->h.setEf(size_t(ef));
  hnsw_distance_calls = 0;
  auto pq = impl_->h.searchKnn(q, size_t(k));
  *scored += hnsw_distance_calls;
  ids->assign(pq.size(), -1);
  for (size_t i = pq.size(); i-- > 0;) {  // the queue pops the worst first
    (*ids)[i] = int32_t(pq.top().second);
    pq.pop();
  }
}

size_t HnswIp::bytes() const { return size_t(impl_->added) * impl_->h.size_data_per_element_; }

struct IvfIp::Impl {
  Impl(int d, int nlist) : quantizer(d), ivf(&quantizer, d, size_t(nlist), faiss::METRIC_INNER_PRODUCT), nlist(nlist) {}
  faiss::IndexFlatIP quantizer;
  faiss::IndexIVFFlat ivf;
  int nlist;
  std::vector<float> cd;
  std::vector<faiss::Index::idx_t> cl, lab;
  std::vector<float> dist;
};

IvfIp::IvfIp(int d, int nlist, const float* train_rows, int64_t n, uint64_t seed, int threads)
    : impl_(std::make_unique<Impl>(d, nlist)) {
  auto& ivf = impl_->ivf;
  ivf.cp.niter = 10;
  ivf.cp.max_points_per_centroid = 40;  // trains on a sample: faiss here uses the reference BLAS
  ivf.cp.seed = int(seed);
  ivf.verbose = false;
  omp_set_num_threads(threads);
  ivf.train(faiss::Index::idx_t(n), train_rows);
  omp_set_num_threads(1);
}
IvfIp::~IvfIp() = default;

void IvfIp::add(const float* rows, int64_t n, int threads) {
  omp_set_num_threads(threads);
  impl_->ivf.add(faiss::Index::idx_t(n), rows);
  omp_set_num_threads(1);
}

void IvfIp::search(const float* q, int k, int nprobe, std::vector<int32_t>* ids) {
  Impl& m = *impl_;
  m.ivf.nprobe = size_t(nprobe);
  m.dist.resize(size_t(k));
  m.lab.resize(size_t(k));
  m.ivf.search(1, q, faiss::Index::idx_t(k), m.dist.data(), m.lab.data());
  ids->clear();
  for (auto l : m.lab)
    if (l >= 0) ids->push_back(int32_t(l));
}

int64_t IvfIp::keys_scored(const float* q, int nprobe) {
  Impl& m = *impl_;
  m.cd.resize(size_t(nprobe));
  m.cl.resize(size_t(nprobe));
  m.quantizer.search(1, q, nprobe, m.cd.data(), m.cl.data());
  int64_t s = m.nlist;
  for (auto l : m.cl)
    if (l >= 0) s += int64_t(m.ivf.invlists->list_size(size_t(l)));
  return s;
}

size_t IvfIp::bytes() const {
  const size_t d = size_t(impl_->ivf.d), n = size_t(impl_->ivf.ntotal);
  return n * (d * sizeof(float) + sizeof(faiss::Index::idx_t)) + size_t(impl_->nlist) * d * sizeof(float);
}

}  // namespace rattn::bench
