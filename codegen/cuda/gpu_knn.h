#pragma once
// The index build's training-query kNN on a GPU: the generated kernel of
// knn_kernel.h compiled with NVRTC (through the kernel cache) and run through
// the driver API. Includers need no CUDA headers.
#include <cstdint>
#include <memory>
#include <string>

namespace rattn {

// Wall seconds of one run's steps: the copies to the device (with its
// allocations), the kernel, the copies back.
struct GpuKnnTimes {
  double upload_seconds = 0, kernel_seconds = 0, download_seconds = 0;
};

class GpuKnn {
 public:
  // nullptr when there is no usable GPU (*why_not then says why). Throws
  // rattn::Error for parameters the kernel does not cover or a kernel that
  // fails to build.
  static std::unique_ptr<GpuKnn> open(int head_dim, int k, std::string* why_not = nullptr, int device = 0);
  virtual ~GpuKnn();
  virtual std::string kernel_name() const = 0;
  // queries [nq, head_dim] and keys [nk, head_dim] fp32; limits null or [nq]
  // (query i ranks key rows < limits[i]). Writes ids and scores [nq, k], best
  // first, ties by the lower row; -1 / -inf past the visible keys. Thread-safe
  // (calls queue on the device's default stream). `times`, when not null,
  // receives the steps' wall seconds.
  virtual void run(const float* queries, int64_t nq, const float* keys, int64_t nk, const int32_t* limits,
                   int32_t* ids, float* scores, GpuKnnTimes* times) = 0;
};

}  // namespace rattn
