// GpuKnn over the driver API: one module per (head_dim, k), device buffers
// per call (the build calls it once per index).
#include "codegen/cuda/gpu_knn.h"

#include <cuda.h>

#include <vector>

#include "codegen/cuda/cuda_driver.h"
#include "codegen/cuda/knn_kernel.h"
#include "codegen/cuda/nvrtc_compiler.h"
#include "core/clock.h"
#include "core/error.h"

namespace rattn {

GpuKnn::~GpuKnn() = default;

namespace {

using cuda_driver::check;
using cuda_driver::driver;

// Device memory freed on scope exit.
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  explicit DeviceBuffer(size_t bytes) {
    if (bytes) check(driver().mem_alloc(&ptr, bytes), "cuMemAlloc");
  }
  ~DeviceBuffer() {
    if (ptr) driver().mem_free(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

class DriverGpuKnn final : public GpuKnn {
 public:
  DriverGpuKnn(int head_dim, int k, int device) {
    const auto& d = driver();
    check(d.device_get(&device_, device), "cuDeviceGet");
    int major = 0, minor = 0;
    d.attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_);
    d.attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_);
    cuda::KnnKernelParams p = cuda::default_knn_params(head_dim, k);
    p.arch = cuda_driver::native_arch_or_compatible(major, minor);
    gen_ = cuda::generate_knn_kernel(p);
    check(d.ctx_retain(&ctx_, device_), "cuDevicePrimaryCtxRetain");
    try {
      check(d.ctx_set(ctx_), "cuCtxSetCurrent");
      cuda::KernelCache cache;
      cuda::CompileOptions co;
      co.arch = p.arch;
      const cuda::CompiledModule m = cache.get_or_compile(gen_.name, gen_.source, co);
      check(d.module_load(&module_, m.cubin.data()), "cuModuleLoadData");
      check(d.get_function(&fn_, module_, gen_.name.c_str()), "cuModuleGetFunction");
      check(d.func_set_attribute(fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(gen_.shared_bytes)),
            "cuFuncSetAttribute");
    } catch (...) {
      release();
      throw;
    }
    head_dim_ = head_dim;
    k_ = k;
  }
  ~DriverGpuKnn() override { release(); }

  std::string kernel_name() const override { return gen_.name; }

  void run(const float* queries, int64_t nq, const float* keys, int64_t nk, const int32_t* limits, int32_t* ids,
           float* scores, GpuKnnTimes* times) override {
    if (nq <= 0) return;
    const double t0 = seconds_now();
    if (nk > int64_t(INT32_MAX)) fail(Status::unsupported, "GpuKnn: more than 2^31 keys");
    const auto& d = driver();
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");  // this thread's context
    const size_t qb = size_t(nq) * size_t(head_dim_) * 4, kb = size_t(nk) * size_t(head_dim_) * 4;
    const size_t ob = size_t(nq) * size_t(k_) * 4;
    DeviceBuffer dq(qb), dk(kb), dl(limits ? size_t(nq) * 4 : 0), di(ob), ds(ob);
    check(d.htod(dq.ptr, queries, qb), "cuMemcpyHtoD(queries)");
    if (kb) check(d.htod(dk.ptr, keys, kb), "cuMemcpyHtoD(keys)");
    if (limits) check(d.htod(dl.ptr, limits, size_t(nq) * 4), "cuMemcpyHtoD(limits)");
    const double t1 = seconds_now();
    long long nq_arg = nq, nk_arg = nk;
    void* args[] = {&dq.ptr, &dk.ptr, &dl.ptr, &nq_arg, &nk_arg, &di.ptr, &ds.ptr};
    const unsigned blocks = unsigned((nq + gen_.tile_queries - 1) / gen_.tile_queries);
    check(d.launch(fn_, blocks, 1, 1, unsigned(gen_.threads), 1, 1, unsigned(gen_.shared_bytes), nullptr, args,
                   nullptr),
          "cuLaunchKernel(knn)");
    check(d.stream_sync(nullptr), "cuStreamSynchronize(knn)");
    const double t2 = seconds_now();
    check(d.dtoh(ids, di.ptr, ob), "cuMemcpyDtoH(ids)");
    check(d.dtoh(scores, ds.ptr, ob), "cuMemcpyDtoH(scores)");
    if (times) *times = {t1 - t0, t2 - t1, seconds_now() - t2};
  }

 private:
  void release() {
    const auto& d = driver();
    if (module_) d.module_unload(module_);
    if (ctx_) d.ctx_release(device_);
    module_ = nullptr;
    ctx_ = nullptr;
  }

  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction fn_ = nullptr;
  cuda::GeneratedKnn gen_;
  int head_dim_ = 0, k_ = 0;
};

}  // namespace

std::unique_ptr<GpuKnn> GpuKnn::open(int head_dim, int k, std::string* why_not, int device) {
  const auto& d = driver();
  if (d.devices <= 0) {
    if (why_not) *why_not = d.why_not.empty() ? "no CUDA device" : d.why_not;
    return nullptr;
  }
  if (device < 0 || device >= d.devices) fail(Status::invalid_argument, "GpuKnn: no device " + std::to_string(device));
  return std::make_unique<DriverGpuKnn>(head_dim, k, device);
}

}  // namespace rattn
