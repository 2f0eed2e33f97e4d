#pragma once
// The one distance interface of the index: batched inner products of one query
// against a list of key rows. Backed either by a CpuKernels implementation
// (the Halide kernels plug in there) or, when none is given, by the index's own
// vectorised loops (AVX2/FMA/F16C chosen at run time, plain C++ otherwise).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "kernels/kv_store.h"

namespace rattn::internal {

class Distance {
 public:
  virtual ~Distance() = default;
  // scores[i] = <query, keys.row(ids[i])>, unscaled. Rows are fetched a
  // few ahead of use (callers with random ids may also request the whole
  // batch first); a run of consecutive ids (a scan) is streamed.
  virtual void dots(const float* query, const RowsView& keys, const int32_t* ids, int n,
                    float* scores) const = 0;
  // Several queries over one list of rows, each row read once: scores[q * n
  // + i] = <queries[q], keys.row(ids[i])> for every q whose bit is set in
  // masks[i] (nq <= 32; other entries untouched). Each score equals the
  // one dots() computes for that query and row, bit for bit. This base
  // version runs dots() per query on its rows.
  virtual void dots_multi(const float* const* queries, int nq, const RowsView& keys, const int32_t* ids,
                          const uint32_t* masks, int n, float* scores) const;
  virtual const char* name() const = 0;
};

// kernels == nullptr selects the built-in vectorised loops.
std::unique_ptr<Distance> make_distance(std::shared_ptr<CpuKernels> kernels);

// The portable C++ loops alone, whatever the CPU (tests check both paths).
std::unique_ptr<Distance> make_portable_distance();

// Single-row inner product with the built-in loops (used by build and tests).
float dot_row(const float* query, const RowsView& keys, int64_t row);

// Requests every cache line of [p, p + bytes): a row that does not start on
// a line boundary spans one line more than bytes / 64 (a 512-byte fp32 row
// in a 16-byte aligned store: 9 lines; a 148-byte adjacency node: up to 4),
// and stepping by 64 from p would leave its last line to a demand miss.
template <int Locality = 1>
inline void prefetch_span(const void* p, size_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) & ~uintptr_t(63);
  for (uintptr_t line = first; line <= last; line += 64) __builtin_prefetch(reinterpret_cast<const void*>(line), 0, Locality);
}

// Prefetches every cache line of a row.
inline void prefetch_row(const RowsView& keys, int64_t row) {
  prefetch_span(keys.row(row), size_t(keys.dim) * dtype_size(keys.dtype));
}

// Large random-access arrays of the search (codes, adjacency) use the row
// stores' allocator: 64-byte aligned (each code row starts on a cache line),
// huge pages from 2 MiB up.
template <class T>
using SearchArrayAllocator = RowStorageAllocator<T>;

// Compressed traversal codes: an 8-bit scalar quantisation of the keys, per
// dimension j: key[j] ~ offset[j] + scale[j] * code[j], code in [0, 255],
// with offset/scale from the per-dimension min/max of the keys it was fitted
// on (later rows are clamped into that range). One contiguous array in row
// order, each row padded to a whole number of cache lines (d = 128: 128 B,
// a quarter of an fp32 row). A beam search scores with these and re-ranks
// its final pool with the exact keys.
//
// <q, key> ~ bias(q) + qscale * sum_j qi[j] * code[j], integer sums, with
// qi[j] = round(q[j] * scale[j] / qscale) in int16 (qscale = max_j
// |q[j] * scale[j]| / 32767) and bias(q) = sum_j q[j] * offset[j]. For a key
// inside the fitted range the error is at most error_bound(q) = sum_j |q[j]|
// * scale[j] / 2 (the key's rounding) + 255 * dim * qscale / 2 (the query's),
// plus fp32 rounding of bias and of the final product.
//
// Coarse dims (fit's `coarse_dims` > 0): the last coarse_dims dimensions are
// 4-bit codes (code in [0, 15], scale = range / 15), two per byte, so that a
// row of projected codes (ProjectedCodes, most important directions first)
// keeps more directions in one cache line: 48 fine + 32 coarse = 64 bytes.
// Row layout then: the fine codes padded to a multiple of 16 bytes, then
// blocks of 16 bytes (32 coarse dims each) of which byte b holds the
// block's coarse dims b (low nibble) and b + 16 (high nibble); the query's
// qi follows the same blocks unpacked (16 entries for the low nibbles, then
// 16 for the high ones).
class ScalarCodes {
 public:
  // Fits offset/scale on rows [0, rows) of `keys` and encodes them;
  // 0 <= coarse_dims <= dim.
  void fit(const RowsView& keys, int64_t rows, int coarse_dims = 0);
  // Encodes rows [rows(), upto) of `keys` with the fitted offset/scale.
  void append(const RowsView& keys, int64_t upto);
  // Encodes n more fp32 rows (dim() floats each) after rows(), e.g. keys
  // transformed by a caller (ProjectedCodes).
  void append_rows(const float* rows, int64_t n);
  void clear();
  bool fitted() const { return dim_ > 0; }
  int64_t rows() const { return rows_; }
  int64_t fitted_rows() const { return fitted_rows_; }  // rows the ranges came from
  int dim() const { return dim_; }
  int coarse_dims() const { return coarse_; }
  int stride() const { return stride_; }  // bytes per row (a multiple of 64)
  // The stride of codes of `dim` dims, the last `coarse_dims` of them 4-bit.
  static int row_stride(int dim, int coarse_dims);
  const uint8_t* row(int64_t i) const { return codes_.data() + size_t(i) * size_t(stride_); }
  void prefetch(int32_t id) const { prefetch_span(row(id), size_t(stride_)); }
  // The query in the codes' terms: qi (zero past dim; without coarse dims
  // stride() entries, else the row layout unpacked).
  struct Query {
    std::vector<int16_t> qi;
    float qscale = 0, bias = 0;
  };
  void prepare_query(const float* q, Query* out) const;
  // scores[i] ~ <q, key ids[i]> (rows already requested).
  void dots(const Query& q, const int32_t* ids, int n, float* scores) const;
  float error_bound(const float* q, const Query& prepared) const;
  float scale(int j) const { return scale_[size_t(j)]; }
  float offset(int j) const { return offset_[size_t(j)]; }
  size_t memory_bytes() const {
    return codes_.capacity() + (scale_.capacity() + offset_.capacity() + inv_scale_.capacity()) * sizeof(float);
  }
  // The portable loop alone, whatever the CPU (tests check both paths).
  void set_portable(bool p) { portable_ = p; }

 private:
  void encode_rows(const RowsView& keys, int64_t from, int64_t to);
  void encode_into(const float* row, int64_t i);  // row i (already allocated) from fp32
  int fine() const { return dim_ - coarse_; }
  int fine_bytes() const { return (fine() + 15) / 16 * 16; }            // fine codes, padded
  int coarse_blocks() const { return (coarse_ + 31) / 32; }             // 16-byte nibble blocks
  int dim_ = 0, coarse_ = 0, stride_ = 0;
  int64_t rows_ = 0, fitted_rows_ = 0;
  bool portable_ = false;
  std::vector<float> scale_, offset_, inv_scale_;
  std::vector<uint8_t, SearchArrayAllocator<uint8_t>> codes_;
};

// Traversal codes kept up to date with a growing key store: fitted on the
// first update(), extended by later ones, refitted once the rows have doubled
// since the fit (an index that starts small would otherwise clamp most later
// keys; amortised O(1) per key). A projected graph keeps one of its own, or
// the indexes over one key store (the query heads of a GQA group: same keys,
// so same codes) share one through KeyIndex::attach_traversal_codes(); its
// owner then calls update() where no search of those indexes runs (append
// may reallocate, a refit rewrites every row), and a search that finds the
// codes behind its index fails instead of racing.
class SharedTraversalCodes {
 public:
  // Encodes rows [rows(), upto) of `keys` (a refit: every row). Callers are
  // serialised; searches reading codes() must not run meanwhile.
  void update(const RowsView& keys, int64_t upto);
  void clear();
  int64_t rows() const { return rows_.load(std::memory_order_acquire); }  // rows encoded
  const ScalarCodes& codes() const { return codes_; }
  size_t memory_bytes() const { return codes_.memory_bytes(); }

 private:
  std::mutex mutex_;
  ScalarCodes codes_;
  std::atomic<int64_t> rows_{0};
};

}  // namespace rattn::internal
