#pragma once
// The one distance interface of the index: batched inner products of one query
// against a list of key rows. Backed either by a CpuKernels implementation
// (the Halide kernels plug in there) or, when none is given, by the index's own
// vectorised loops (AVX2/FMA/F16C chosen at run time, plain C++ otherwise).
#include <cstdint>
#include <memory>

#include "runtime/cpu_kernels.h"
#include "runtime/kv_store.h"

namespace rattn::internal {

class Distance {
 public:
  virtual ~Distance() = default;
  // scores[i] = <query, keys.row(ids[i])>, unscaled. Rows are fetched a
  // few ahead of use (callers with random ids may also request the whole
  // batch first); a run of consecutive ids (a scan) is streamed.
  virtual void dots(const float* query, const RowsView& keys, const int32_t* ids, int n,
                    float* scores) const = 0;
  virtual const char* name() const = 0;
};

// kernels == nullptr selects the built-in vectorised loops.
std::unique_ptr<Distance> make_distance(std::shared_ptr<CpuKernels> kernels);

// The portable C++ loops alone, whatever the CPU (tests check both paths).
std::unique_ptr<Distance> make_portable_distance();

// Single-row inner product with the built-in loops (used by build and tests).
float dot_row(const float* query, const RowsView& keys, int64_t row);

// Prefetches the first `lines` cache lines of a row.
inline void prefetch_row(const RowsView& keys, int64_t row) {
  const char* p = static_cast<const char*>(keys.row(row));
  const int bytes = keys.dim * int(dtype_size(keys.dtype));
  for (int off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
}

}  // namespace rattn::internal
