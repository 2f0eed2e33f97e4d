#pragma once
// Full attention of one KV head's GQA group over all its rows, split into one
// chunk of rows per thread: each chunk one dense_attention call for the whole
// group, the partials merged by log-sum-exp. The full-attention baseline of
// `rattn bench kernels` and `rattn bench decode`.
#include <vector>

#include "kernels/cpu_kernels.h"
#include "runtime/thread_pool.h"

namespace rattn::bench {

class SplitAttention {
 public:
  SplitAttention(int threads, int groups, int head_dim);
  int threads() const { return pool_.threads(); }
  // q: groups x head_dim; out: groups x head_dim, lse: groups (natural log).
  void run(CpuKernels& kernels, const float* q, const RowsView& keys, const RowsView& values, float* out, float* lse);

 private:
  ThreadPool pool_;
  int groups_, head_dim_;
  std::vector<float> chunk_out_, chunk_lse_;
};

}  // namespace rattn::bench
