#pragma once
// Exact maximum-inner-product scan over rows [0, size()) of the key store: the
// test oracle and the "flat" baseline of the benchmark.
#include <cstdint>
#include <memory>

#include "kernels/cpu_kernels.h"
#include "runtime/index/key_index.h"

namespace rattn {

// Indexes rows [0, num_keys). insert() only appends: key_id must equal size().
// kernels == nullptr: the index's built-in vectorised inner products.
std::unique_ptr<KeyIndex> make_brute_force_index(int64_t num_keys,
                                                 std::shared_ptr<CpuKernels> kernels = nullptr);

// Exact top-k of `query` over rows [0, num_keys) of `keys` (score descending,
// ties by lower id). A plain helper for tests and benchmarks.
void exact_top_k(const float* query, const RowsView& keys, int64_t num_keys, int k,
                 std::vector<int32_t>* ids, std::vector<float>* scores = nullptr);

// recall@k: the share of the first k of `truth` found among the first k of
// `got` (1 when truth is empty).
double recall_at(const std::vector<int32_t>& got, const std::vector<int32_t>& truth, int k);

}  // namespace rattn
