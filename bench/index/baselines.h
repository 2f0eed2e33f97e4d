#pragma once
// The baselines of `rattn bench index`, hnswlib HNSW and faiss IVF-Flat (both
// inner product), behind a small interface so that the bench can build each
// on raw keys and on the key transform of the projected graph's build, and a
// test can compare the two.
#include <cstdint>
#include <memory>
#include <vector>

namespace rattn::bench {

// The mean of rows [0, n) ([n, d]).
std::vector<float> column_mean(const float* rows, int64_t n, int d);

// The rows minus their column mean (accumulated in float64); the mean goes to
// *mean_out. A query ranks k and k - mean alike (the offset <q, mean> is the
// same for every key), so exact top-k and recall do not change.
std::vector<float> centred_rows(const float* rows, int64_t n, int d, std::vector<float>* mean_out);
// rows[i] - mean for each of n rows.
std::vector<float> rows_minus(const float* rows, int64_t n, int d, const std::vector<float>& mean);

// The query metric of the graph's key metrics 1 and 2: S = the second moment
// (covariance: true) of the queries plus ridge_share * trace(S) / d * I, and
// its Cholesky factor S = L L'. Keys L' k and queries L^-1 q have the inner
// products <q, k> of the originals, so the exact top-k is the same, while
// key-to-key inner products become k1' S k2: how alike two keys score.
class QueryMetric {
 public:
  QueryMetric(const float* queries, int64_t n, int d, bool covariance, double ridge_share);
  std::vector<float> keys(const float* rows, int64_t n) const;     // L' k per row
  std::vector<float> queries(const float* rows, int64_t n) const;  // L^-1 q per row

 private:
  int d_;
  std::vector<double> l_;  // lower triangle, row-major [d, d]
};

// hnswlib HNSW, inner-product space. keys_scored() counts the inner products
// hnswlib computes (its own counter adds whole neighbour lists, visited or not).
class HnswIp {
 public:
  HnswIp(int d, int64_t capacity, int M, int ef_construction, uint64_t seed);
  ~HnswIp();
  HnswIp(const HnswIp&) = delete;
  HnswIp& operator=(const HnswIp&) = delete;
  // Adds rows [0, n) as ids first_id.. on `threads` threads (the first added
  // row of an empty index on this thread: hnswlib needs an entry point).
  void add(const float* rows, int64_t first_id, int64_t n, int threads);
  // The best k ids for q at search breadth ef, best first; adds the inner
  // products computed to *scored.
  void search(const float* q, int k, int ef, std::vector<int32_t>* ids, int64_t* scored);
  size_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// faiss IVF-Flat, inner product, k-means on a sample (10 iterations, at most
// 40 points per centroid), nlist lists.
class IvfIp {
 public:
  IvfIp(int d, int nlist, const float* train_rows, int64_t n, uint64_t seed, int threads);
  ~IvfIp();
  IvfIp(const IvfIp&) = delete;
  IvfIp& operator=(const IvfIp&) = delete;
  void add(const float* rows, int64_t n, int threads);
  // Searches with nprobe lists on this thread.
  void search(const float* q, int k, int nprobe, std::vector<int32_t>* ids);
  // Keys a search scores: the probed lists' sizes plus the nlist centroids
  // (apart from search() so that timing leaves it out).
  int64_t keys_scored(const float* q, int nprobe);
  size_t bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rattn::bench
