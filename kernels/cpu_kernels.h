#pragma once
// The CPU kernel interface: graph-search distances, partial attention over a
// list of token ids, dense attention over a contiguous range, and the merge.
// Implementations: plain reference loops (kernels/reference_kernels.cpp) and
// Halide-generated kernels (codegen/halide). All log-sum-exp values use the
// NATURAL logarithm: lse = log(sum_i exp(s_i)), s_i = <q, k_i> / sqrt(d).
#include <cstdint>
#include <memory>

#include "kernels/kv_store.h"

namespace rattn {

// What a kernel set is specialised for.
struct KernelSpec {
  int head_dim = 128;
  int group_size = 1;  // query heads sharing one KV head
  DType kv_dtype = DType::f16;
};

// Implementations are thread-safe: one instance may be called from many
// threads at once (scratch space is per call or thread-local).
class CpuKernels {
 public:
  virtual ~CpuKernels() = default;
  virtual const KernelSpec& spec() const = 0;

  // scores[g * n + i] = <queries[g], keys.row(ids[i])> for g < groups, i < n.
  // `groups` is 1 (one query head) or spec().group_size (a whole GQA group).
  // Unscaled inner products: the graph search ranks by these.
  virtual void gathered_dot(const float* queries, int groups, const RowsView& keys,
                            const int32_t* ids, int n, float* scores) = 0;

  // Partial attention of `groups` query heads over tokens ids[0..n):
  // out[g * d + j] and lse[g] (natural log, scale 1/sqrt(d)). n == 0 gives
  // out = 0 and lse = -inf.
  virtual void partial_attention(const float* queries, int groups, const RowsView& keys,
                                 const RowsView& values, const int32_t* ids, int n,
                                 float* out, float* lse) = 0;

  // Dense attention of `groups` query heads over rows [begin, end).
  virtual void dense_attention(const float* queries, int groups, const RowsView& keys,
                               const RowsView& values, int64_t begin, int64_t end,
                               float* out, float* lse) = 0;
};

// Merges partial result b into a, for `heads` heads of dimension d (natural-log
// lse). Associative and commutative; exact when the token sets are disjoint.
void merge_partials_ln(float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                       int heads, int d);

// Plain scalar C++ loops: the baseline for benchmarks and the stand-in until
// the Halide kernels are in.
std::unique_ptr<CpuKernels> make_reference_kernels(const KernelSpec& spec);

}  // namespace rattn
