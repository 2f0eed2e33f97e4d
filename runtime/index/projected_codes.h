#pragma once
// Learned low-dimensional traversal codes: the 8-bit codes of the keys
// projected onto `dims` < d directions chosen for the queries, so that a code
// row is one cache line (dims <= 64) instead of two (d = 128, ScalarCodes on
// the raw keys). With Sq the second moment of the training queries and Ck the
// covariance of the keys, a query q = Sq^{1/2} a (a white) scores
// <q, k> = <a, Sq^{1/2} k>; the rank-`dims` truncation of Sq^{1/2} k that loses
// the least of these scores on average keeps the top eigenvectors V of
// M = Sq^{1/2} Ck Sq^{1/2}. Hence key -> V' Sq^{1/2} k, query -> V' Sq^{-1/2} q,
// and <q, k> ~ <query', key'> + a term that is the same for every key (the
// keys' mean outside V), which a ranking ignores. dims = d is exact (before
// quantisation). The walk scores with these codes; the final candidates are
// re-ranked with the exact keys, so returned scores are exact.
#include <cstdint>
#include <vector>

#include "kernels/kv_store.h"
#include "runtime/index/distance.h"

namespace rattn::internal {

// Eigen-decomposition of a symmetric [n, n] row-major matrix (cyclic Jacobi,
// float64): eigenvalues in descending order, eigenvector i in row i of
// `vectors` ([n, n]). Only the lower triangle's symmetric part is assumed.
void symmetric_eigen(std::vector<double> a, int n, std::vector<double>* values, std::vector<double>* vectors);

class ProjectedCodes {
 public:
  // Fits the projection and encodes rows [0, rows) of `keys`.
  // `query_moment`: [d, d] second moment of the training queries (any
  // positive scale; empty: the identity, i.e. a plain PCA of the keys).
  // 1 <= dims <= d; the last coarse_dims (0..dims) directions get 4-bit codes
  // (ScalarCodes). The key covariance comes from at most 16384 evenly
  // spaced rows.
  void fit(const RowsView& keys, int64_t rows, const std::vector<float>& query_moment, int dims, int coarse_dims = 0);
  // Encodes rows [rows(), upto) with the fitted projection and ranges.
  void append(const RowsView& keys, int64_t upto);
  bool fitted() const { return codes_.fitted(); }
  int dims() const { return dims_; }
  int coarse_dims() const { return codes_.coarse_dims(); }
  int64_t rows() const { return codes_.rows(); }
  int64_t fitted_rows() const { return codes_.fitted_rows(); }
  const ScalarCodes& codes() const { return codes_; }
  // out[0, dims) = V' Sq^{-1/2} q, resp. V' Sq^{1/2} k (fp32 inputs).
  void project_query(const float* q, float* out) const;
  void project_key(const float* k, float* out) const;
  size_t memory_bytes() const {
    return codes_.memory_bytes() + (key_proj_.capacity() + query_proj_.capacity()) * sizeof(float);
  }

 private:
  void encode(const RowsView& keys, int64_t from, int64_t to, bool fit_ranges);
  int d_ = 0, dims_ = 0, coarse_ = 0;
  std::vector<float> key_proj_, query_proj_;  // [dims, d] each
  ScalarCodes codes_;
};

}  // namespace rattn::internal
