#include "bench/split_attention.h"

#include <algorithm>
#include <cstring>

namespace rattn::bench {

SplitAttention::SplitAttention(int threads, int groups, int head_dim)
    : pool_(threads), groups_(groups), head_dim_(head_dim) {
  chunk_out_.resize(size_t(pool_.threads()) * size_t(groups) * size_t(head_dim));
  chunk_lse_.resize(size_t(pool_.threads()) * size_t(groups));
}

void SplitAttention::run(CpuKernels& kernels, const float* q, const RowsView& keys, const RowsView& values,
                         float* out, float* lse) {
  const int chunks = pool_.threads();
  const size_t part = size_t(groups_) * size_t(head_dim_);
  const int64_t n = keys.rows, per = (n + chunks - 1) / chunks;
  pool_.parallel_for(chunks, [&](int64_t c) {
    const int64_t begin = std::min(n, c * per), end = std::min(n, begin + per);
    kernels.dense_attention(q, groups_, keys, values, begin, end, chunk_out_.data() + size_t(c) * part,
                            chunk_lse_.data() + size_t(c) * size_t(groups_));
  });
  std::memcpy(out, chunk_out_.data(), part * sizeof(float));
  std::memcpy(lse, chunk_lse_.data(), size_t(groups_) * sizeof(float));
  for (int c = 1; c < chunks; ++c)
    merge_partials_ln(out, lse, chunk_out_.data() + size_t(c) * part, chunk_lse_.data() + size_t(c) * size_t(groups_),
                      groups_, head_dim_);
}

}  // namespace rattn::bench
