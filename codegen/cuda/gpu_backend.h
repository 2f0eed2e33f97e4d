#pragma once
// GPU partial attention over the static set (sinks + recent window) for the
// runtime. Includers need no CUDA headers: the driver API is opened with
// dlopen("libcuda.so.1") at run time and libcuda is never linked, so a program
// using this runs (and falls back to the CPU kernels) on machines without a GPU.
//
// Use:
//   auto gpu = rattn::open_gpu_attention(spec);   // nullptr: no GPU, use CpuKernels
//   gpu->upload_static_set(kv_heads, keys, values, capacity);  // prefill / load
//   gpu->update_static_row(row, new_keys, new_values);         // each decode step
//   gpu->partial_attention(queries, out, lse);                 // each decode step
//     (or begin_partial_attention(queries) ... finish_partial_attention(out, lse))
//   rattn::merge_partials_ln(out, lse, cpu_out, cpu_lse, heads, d);
// All lse values are NATURAL log (scores scaled by 1/sqrt(head_dim)).
#include <map>
#include <memory>
#include <string>

#include "core/error.h"
#include "kernels/cpu_kernels.h"  // KernelSpec, RowsView (header-only)

namespace rattn {

struct GpuAttentionOptions {
  std::string arch;  // "" = the device's own (e.g. "sm_90"), or the closest lower
                     // supported arch of the same major version
  std::string cache_dir;               // "" = the default NVRTC cache directory
  std::map<std::string, double> knobs;  // plan knobs: "cuda.splits", "cuda.warps", ... (others ignored)
  int device = 0;
};

// Not thread-safe: one decode stream per instance.
class GpuAttention {
 public:
  virtual ~GpuAttention();
  virtual const KernelSpec& spec() const = 0;
  virtual std::string device_name() const = 0;
  // The generated kernel module's name (its shape and knobs), "" for a backend without one.
  virtual std::string kernel_name() const { return {}; }
  // Copies the static set of `kv_heads` KV heads to the GPU: keys[h] and
  // values[h] hold the same number of rows (sinks first, then the recent
  // window), spec().head_dim wide, in spec().kv_dtype. GPU memory holds
  // `capacity_rows` rows per head (>= rows; e.g. sinks + window), so that
  // update_static_row() can fill or replace rows in place later.
  virtual void upload_static_set(int kv_heads, const RowsView* keys, const RowsView* values,
                                 int64_t capacity_rows) = 0;
  // The same with no room beyond the given rows.
  void upload_static_set(int kv_heads, const RowsView* keys, const RowsView* values) {
    upload_static_set(kv_heads, keys, values, kv_heads > 0 ? keys[0].rows : 0);
  }
  // Writes row `row` of every head's static set in GPU memory: keys[h] and
  // values[h] point to one row (head_dim values in kv_dtype). `row` either
  // replaces a row (< rows()) or appends one (== rows(), below the capacity).
  // Attention is order-independent over the set, so a window kept as a ring
  // (the new token overwriting the slot of the one leaving) needs only this:
  // one row per head crosses the bus per decode step, not the whole set.
  virtual void update_static_row(int64_t row, const void* const* keys, const void* const* values) = 0;
  // Rows per head of the static set on the GPU now.
  virtual int64_t rows() const = 0;
  // queries: [kv_heads][group_size][head_dim] fp32 (the uploaded heads, in
  // order). out: same shape; lse: [kv_heads][group_size], natural log; an
  // empty static set gives out = 0 and lse = -inf.
  virtual void partial_attention(const float* queries, float* out, float* lse) = 0;
  // The same in two halves, so that the caller works while the GPU does:
  // begin_ returns once the work is queued; finish_ waits and writes out and
  // lse. `queries` must stay unchanged until finish_ returns (the CUDA
  // backend copies them at once; a backend may read them in finish_). A
  // begin_ without its finish_ (an exception in between) is waited for by the
  // next call. This default runs everything in finish_.
  virtual void begin_partial_attention(const float* queries) { begun_queries_ = queries; }
  virtual void finish_partial_attention(float* out, float* lse) {
    const float* q = begun_queries_;
    begun_queries_ = nullptr;
    if (!q) fail(Status::invalid_argument, "GpuAttention::finish_partial_attention without a begin");
    partial_attention(q, out, lse);
  }

 private:
  const float* begun_queries_ = nullptr;
};

// nullptr when there is no usable GPU (libcuda.so.1 missing, cuInit or
// cuDeviceGetCount failing, no device); *why_not then says which. Throws
// rattn::Error for an unsupported spec or a kernel that fails to build.
std::unique_ptr<GpuAttention> open_gpu_attention(const KernelSpec& spec,
                                                 const GpuAttentionOptions& options = {},
                                                 std::string* why_not = nullptr);

// True when the driver loads and reports at least one device.
bool gpu_present(std::string* why_not = nullptr);

// The flash-decoding split count (knob cuda.splits) for a static set of
// `rows` rows per KV head over `kv_heads` heads when the plan names none. A
// block runs per split and head: about 256 rows per block, and no more than
// about two blocks per SM of an H100 in all (measured best on one, for 640 to
// 131072 rows and 1 or 8 heads; docs/performance.md), 4 to 64.
int static_set_splits(int64_t rows, int kv_heads);

}  // namespace rattn
