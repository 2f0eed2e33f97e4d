// The driver API through dlopen: any failure of dlopen / cuInit /
// cuDeviceGetCount means "no GPU". cuda.h is included for types only.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "codegen/cuda/cuda_driver.h"
#include "codegen/cuda/gpu_backend.h"
#include "codegen/cuda/model_kernels.h"
#include "codegen/cuda/print_cuda.h"
#include "core/embedded_abi.h"
#include "core/error.h"

namespace rattn {

GpuAttention::~GpuAttention() = default;

namespace {

template <typename F>
bool sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

namespace cuda_driver {

// Opened once per process; never closed (the driver does not support unloading).
const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    d.lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d.lib) {
      const char* e = ::dlerror();
      d.why_not = std::string("cannot load libcuda.so.1 (") + (e ? e : "?") + ")";
      return d;
    }
    const bool ok =
        sym(d.lib, "cuInit", &d.init) && sym(d.lib, "cuDeviceGetCount", &d.device_count) &&
        sym(d.lib, "cuDeviceGet", &d.device_get) && sym(d.lib, "cuDeviceGetAttribute", &d.attribute) &&
        sym(d.lib, "cuDeviceGetName", &d.device_name) &&
        sym(d.lib, "cuDevicePrimaryCtxRetain", &d.ctx_retain) &&
        sym(d.lib, "cuDevicePrimaryCtxRelease_v2", &d.ctx_release) &&
        sym(d.lib, "cuCtxSetCurrent", &d.ctx_set) &&
        sym(d.lib, "cuModuleLoadData", &d.module_load) && sym(d.lib, "cuModuleUnload", &d.module_unload) &&
        sym(d.lib, "cuModuleGetFunction", &d.get_function) &&
        sym(d.lib, "cuFuncSetAttribute", &d.func_set_attribute) &&
        sym(d.lib, "cuLaunchKernel", &d.launch) && sym(d.lib, "cuMemAlloc_v2", &d.mem_alloc) &&
        sym(d.lib, "cuMemFree_v2", &d.mem_free) && sym(d.lib, "cuStreamCreate", &d.stream_create) &&
        sym(d.lib, "cuStreamDestroy_v2", &d.stream_destroy) &&
        sym(d.lib, "cuStreamSynchronize", &d.stream_sync) && sym(d.lib, "cuMemHostAlloc", &d.host_alloc) &&
        sym(d.lib, "cuMemHostGetDevicePointer_v2", &d.host_device_pointer) &&
        sym(d.lib, "cuMemFreeHost", &d.host_free) && sym(d.lib, "cuMemcpyHtoDAsync_v2", &d.htod_async) &&
        sym(d.lib, "cuMemcpy2DAsync_v2", &d.copy_2d_async) && sym(d.lib, "cuGetErrorString", &d.error_string) &&
        sym(d.lib, "cuMemcpyHtoD_v2", &d.htod) && sym(d.lib, "cuMemcpyDtoH_v2", &d.dtoh);
    if (!ok) {
      d.why_not = "libcuda.so.1 lacks a driver API entry point";
      return d;
    }
    if (CUresult r = d.init(0); r != CUDA_SUCCESS) {
      d.why_not = "cuInit failed (error " + std::to_string(int(r)) + ")";
      return d;
    }
    if (CUresult r = d.device_count(&d.devices); r != CUDA_SUCCESS || d.devices <= 0) {
      d.why_not = r != CUDA_SUCCESS ? "cuDeviceGetCount failed" : "no CUDA device";
      d.devices = 0;
    }
    return d;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  driver().error_string(r, &s);
  fail(Status::internal, std::string("cuda driver: ") + what + ": " + (s ? s : "unknown error"));
}

// The device's own arch when the generator supports it, else the newest
// supported arch of the same major version below it (CUBIN runs on later
// minor versions of its major version, e.g. sm_100 code on an sm_103 part).
std::string native_arch_or_compatible(int major, int minor) {
  const std::string native = "sm_" + std::to_string(major * 10 + minor);
  std::string best;
  int best_minor = -1;
  for (const auto& a : cuda::supported_archs()) {
    if (a == native) return a;
    const int v = std::stoi(a.substr(3));
    if (v / 10 == major && v % 10 <= minor && v % 10 > best_minor) {
      best = a;
      best_minor = v % 10;
    }
  }
  if (best.empty())
    fail(Status::unsupported, "the GPU is " + native + "; the CUDA generator has no compatible arch");
  return best;
}

}  // namespace cuda_driver

namespace {

using cuda_driver::check;
using cuda_driver::Driver;
using cuda_driver::driver;
using cuda_driver::native_arch_or_compatible;

// The embedded module (a deployable library's CUBIN + PTX) named `name` for
// `arch`, or nullptr.
const embedded::GpuModule* find_embedded_module(const std::string& name, const std::string& arch) {
  const embedded::Payload* p = embedded::payload();
  if (!p || p->abi_version != embedded::kAbiVersion) return nullptr;
  for (int i = 0; i < p->n_gpu_modules; ++i)
    if (name == p->gpu_modules[i].name && arch == p->gpu_modules[i].arch) return &p->gpu_modules[i];
  return nullptr;
}

// The arch of the embedded modules this device runs, best first: the same
// major version at or below its minor (CUBIN runs), else any lower arch (the
// driver compiles the PTX). "" when nothing embedded fits. *ptx_only says
// which.
std::string embedded_arch_for(int major, int minor, bool* ptx_only) {
  const embedded::Payload* p = embedded::payload();
  if (!p || p->abi_version != embedded::kAbiVersion) return {};
  const int device = major * 10 + minor;
  int best_cubin = -1, best_ptx = -1;
  std::string cubin_arch, ptx_arch;
  for (int i = 0; i < p->n_gpu_modules; ++i) {
    const std::string a = p->gpu_modules[i].arch;
    if (a.rfind("sm_", 0) != 0) continue;
    const int v = std::atoi(a.c_str() + 3);
    if (v / 10 == major && v % 10 <= minor && v > best_cubin) best_cubin = v, cubin_arch = a;
    if (v <= device && v > best_ptx) best_ptx = v, ptx_arch = a;
  }
  *ptx_only = cubin_arch.empty();
  return cubin_arch.empty() ? ptx_arch : cubin_arch;
}

// A kernel module loaded on a device, shared by every stream of the same
// kernels (a runtime opens one per layer of every sequence: loading it each
// time would repeat the load and keep a copy of the code per stream on the
// GPU). Holds the device's primary context while loaded.
struct LoadedModule {
  CUdevice device = 0;
  CUcontext ctx = nullptr;
  CUmodule module = nullptr;
  CUfunction partial = nullptr, merge = nullptr;
  unsigned smem = 0, threads = 0, merge_threads = 0;
  LoadedModule() = default;
  LoadedModule(const LoadedModule&) = delete;
  LoadedModule& operator=(const LoadedModule&) = delete;
  ~LoadedModule() {
    const Driver& d = driver();
    if (module) {
      d.ctx_set(ctx);
      d.module_unload(module);
    }
    if (ctx) d.ctx_release(device);
  }
};

// The module of `ir` on `device`: the one already loaded, else compiled (or
// read from the NVRTC disk cache) and loaded.
std::shared_ptr<const LoadedModule> load_module(CUdevice device, const cuda::KernelModule& ir, const std::string& arch,
                                                const std::string& cache_dir, bool ptx_only) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const LoadedModule>> loaded;
  const std::string key = std::to_string(device) + " " + ir.name;  // the name spells every parameter
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<const LoadedModule> m = loaded[key].lock()) return m;
  const Driver& d = driver();
  auto m = std::make_shared<LoadedModule>();  // releases whatever a failure below leaves held
  m->device = device;
  check(d.ctx_retain(&m->ctx, device), "cuDevicePrimaryCtxRetain");
  check(d.ctx_set(m->ctx), "cuCtxSetCurrent");
  // A deployable library's own module first (its CUBIN, else its PTX through
  // the driver), then the NVRTC disk cache or a compile.
  const embedded::GpuModule* e = find_embedded_module(ir.name, arch);
  if (e && !ptx_only && d.module_load(&m->module, e->cubin) != CUDA_SUCCESS) m->module = nullptr;
  if (e && !m->module) check(d.module_load(&m->module, e->ptx), "cuModuleLoadData (embedded PTX)");
  if (!m->module) {
    cuda::KernelCache cache(cache_dir);
    cuda::CompileOptions co;
    co.arch = arch;
    const cuda::CompiledModule compiled = cache.get_or_compile(ir.name, cuda::print_cuda(ir), co);
    check(d.module_load(&m->module, ptx_only ? static_cast<const void*>(compiled.ptx.c_str())
                                             : static_cast<const void*>(compiled.cubin.data())),
          "cuModuleLoadData");
  }
  for (const auto& k : ir.kernels) {
    CUfunction f;
    check(d.get_function(&f, m->module, k.name.c_str()), "cuModuleGetFunction");
    if (k.role == cuda::KernelRole::partial) {
      m->partial = f;
      m->smem = unsigned(k.shared_bytes);
      m->threads = unsigned(k.block_threads);
      check(d.func_set_attribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(m->smem)),
            "cuFuncSetAttribute");
    } else {
      m->merge = f;
      m->merge_threads = unsigned(k.block_threads);
    }
  }
  loaded[key] = m;
  return m;
}

class DriverGpuAttention final : public GpuAttention {
 public:
  DriverGpuAttention(const KernelSpec& spec, const GpuAttentionOptions& o) : spec_(spec) {
    const Driver& d = driver();
    check(d.device_get(&device_, o.device), "cuDeviceGet");
    char name[256] = {};
    d.device_name(name, sizeof name - 1, device_);
    name_ = name;
    std::string arch = o.arch;
    bool ptx_only = false;
    if (arch.empty()) {
      int major = 0, minor = 0;
      d.attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_);
      d.attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_);
      arch = embedded_arch_for(major, minor, &ptx_only);
      if (arch.empty()) arch = native_arch_or_compatible(major, minor);
    }
    ModelLayout model;
    model.head_dim = spec.head_dim;
    model.num_kv_heads = 1;
    model.num_q_heads = spec.group_size;
    model.kv_dtype = spec.kv_dtype;
    ConcretePlan plan;
    plan.kernel = o.knobs;
    cuda::LowerOptions lo;
    lo.arch = arch;
    module_ir_ = cuda::lower_decode_attention(model, plan, lo);
    // The context only now: a spec the generator rejects (thrown above, e.g.
    // head_dim 16, which callers answer with the CPU kernels) retains nothing.
    loaded_ = load_module(device_, module_ir_, arch, o.cache_dir, ptx_only);
    ctx_ = loaded_->ctx;
    partial_ = loaded_->partial;
    merge_ = loaded_->merge;
    smem_ = loaded_->smem;
    threads_ = loaded_->threads;
    merge_threads_ = loaded_->merge_threads;
    // Its own stream: the step's copies and launches queue there and the
    // host waits once per step, in finish_partial_attention.
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");
    check(d.stream_create(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  }

  ~DriverGpuAttention() override {  // loaded_, released after this, unloads the module when last
    const Driver& d = driver();
    d.ctx_set(ctx_);
    if (stream_) d.stream_sync(stream_);
    free_buffers();
    if (stream_) d.stream_destroy(stream_);
  }

  using GpuAttention::upload_static_set;
  const KernelSpec& spec() const override { return spec_; }
  std::string device_name() const override { return name_; }
  std::string kernel_name() const override { return module_ir_.name; }

  void upload_static_set(int kv_heads, const RowsView* keys, const RowsView* values,
                         int64_t capacity_rows) override {
    if (kv_heads <= 0) fail(Status::invalid_argument, "GpuAttention: kv_heads must be positive");
    const int64_t rows = keys[0].rows;
    if (capacity_rows < rows)
      fail(Status::invalid_argument, "GpuAttention::upload_static_set: capacity " + std::to_string(capacity_rows) +
                                         " rows is below the " + std::to_string(rows) + " rows uploaded");
    for (int h = 0; h < kv_heads; ++h)
      if (keys[h].rows != rows || values[h].rows != rows || keys[h].dim != spec_.head_dim ||
          values[h].dim != spec_.head_dim || keys[h].dtype != spec_.kv_dtype ||
          values[h].dtype != spec_.kv_dtype)
        fail(Status::invalid_argument,
             "GpuAttention::upload_static_set: head " + std::to_string(h) +
                 " does not match the spec (same rows for all heads, head_dim " +
                 std::to_string(spec_.head_dim) + ", dtype " + dtype_name(spec_.kv_dtype) + ")");
    const Driver& d = driver();
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");
    wait();  // nothing of the old set may still be in flight
    begun_ = false;
    // Buffers are kept when the shape is unchanged (a re-upload of the same
    // sequence); otherwise reallocated.
    if (kv_heads != heads_ || capacity_rows != capacity_) {
      free_buffers();
      heads_ = 0;
      const size_t kv_bytes = std::max<size_t>(1, size_t(kv_heads) * size_t(capacity_rows) * row_bytes());
      const size_t G = size_t(spec_.group_size), D = size_t(spec_.head_dim);
      const size_t splits = size_t(module_ir_.params.splits);
      // Values right after keys: row r of every head, keys then values, is
      // one strided run (pitch capacity rows), so a step's rows go in one copy.
      check(d.mem_alloc(&k_, 2 * kv_bytes), "cuMemAlloc");
      v_ = k_ + kv_bytes;
      if (merge_) {
        check(d.mem_alloc(&o_ws_, size_t(kv_heads) * splits * G * D * 4), "cuMemAlloc");
        check(d.mem_alloc(&lse_ws_, size_t(kv_heads) * splits * G * 4), "cuMemAlloc");
      }
      // Page-locked and mapped: the kernels read the queries and write the
      // results across the bus themselves, so a step needs no copy for them.
      void* host = nullptr;
      check(d.host_alloc(&host, query_bytes(kv_heads) + result_bytes(kv_heads) + 2 * size_t(kv_heads) * row_bytes(),
                         CU_MEMHOSTALLOC_DEVICEMAP),
            "cuMemHostAlloc");
      host_ = static_cast<uint8_t*>(host);
      CUdeviceptr mapped = 0;
      check(d.host_device_pointer(&mapped, host, 0), "cuMemHostGetDevicePointer");
      q_ = mapped;
      o_ = mapped + query_bytes(kv_heads);
      lse_ = o_ + size_t(kv_heads) * G * D * 4;
      heads_ = kv_heads;
      capacity_ = capacity_rows;
    }
    rows_ = 0;  // a failed copy leaves an empty set, never a half-written one
    for (int h = 0; h < kv_heads; ++h) {
      if (rows == 0) continue;
      const size_t off = size_t(h) * size_t(capacity_) * row_bytes();
      // From pageable memory: staged by the driver, ordered on the stream.
      check(d.htod_async(k_ + off, keys[h].data, size_t(rows) * row_bytes(), stream_), "cuMemcpyHtoDAsync");
      check(d.htod_async(v_ + off, values[h].data, size_t(rows) * row_bytes(), stream_), "cuMemcpyHtoDAsync");
    }
    rows_in_flight_ = true;
    wait();
    rows_ = rows;
  }

  void update_static_row(int64_t row, const void* const* keys, const void* const* values) override {
    if (!heads_) fail(Status::invalid_argument, "GpuAttention::update_static_row: no static set uploaded");
    if (row < 0 || row > rows_ || row >= capacity_)
      fail(Status::invalid_argument, "GpuAttention::update_static_row: row " + std::to_string(row) +
                                         " is outside the set (" + std::to_string(rows_) + " rows, capacity " +
                                         std::to_string(capacity_) + ")");
    const Driver& d = driver();
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");
    if (rows_in_flight_) wait();  // the staging rows of the last update are still being read
    // The heads' rows are packed in page-locked memory, keys then values,
    // and one strided copy puts row `row` of every head in place (heads, then
    // the values' heads, are capacity_ rows apart). Queued: the next
    // attention on the stream sees it.
    uint8_t* staging = host_ + query_bytes(heads_) + result_bytes(heads_);
    for (int h = 0; h < heads_; ++h) {
      std::memcpy(staging + size_t(h) * row_bytes(), keys[h], row_bytes());
      std::memcpy(staging + size_t(heads_ + h) * row_bytes(), values[h], row_bytes());
    }
    CUDA_MEMCPY2D c{};
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcHost = staging;
    c.srcPitch = row_bytes();
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c.dstDevice = k_ + size_t(row) * row_bytes();
    c.dstPitch = size_t(capacity_) * row_bytes();
    c.WidthInBytes = row_bytes();
    c.Height = 2 * size_t(heads_);
    rows_in_flight_ = true;
    check(d.copy_2d_async(&c, stream_), "cuMemcpy2DAsync");
    if (row == rows_) ++rows_;
  }

  int64_t rows() const override { return rows_; }

  void partial_attention(const float* queries, float* out, float* lse) override {
    begin_partial_attention(queries);
    finish_partial_attention(out, lse);
  }

  // Queues the kernels on the stream; they read the queries from and write
  // the results to mapped host memory. One wait per step, in finish.
  void begin_partial_attention(const float* queries) override {
    if (!heads_) fail(Status::invalid_argument, "GpuAttention::partial_attention: no static set uploaded");
    const Driver& d = driver();
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");
    if (results_in_flight_) wait();  // a begin without its finish: its buffers are reused now
    begun_ = false;
    std::memcpy(host_, queries, query_bytes(heads_));
    results_in_flight_ = true;
    const CUdeviceptr page_table = 0;
    long long head_stride = capacity_, window_begin = 0;
    int n_sinks = int(rows_), n_window = 0;
    CUdeviceptr o_dst = merge_ ? o_ws_ : o_, lse_dst = merge_ ? lse_ws_ : lse_;
    void* args[] = {&q_, &k_, &v_, const_cast<CUdeviceptr*>(&page_table), &head_stride, &n_sinks,
                    &n_window, &window_begin, &o_dst, &lse_dst};
    check(d.launch(partial_, unsigned(module_ir_.params.splits), unsigned(heads_),
                   unsigned(module_ir_.mapping.group_blocks), threads_, 1, 1, smem_, stream_, args, nullptr),
          "cuLaunchKernel(partial)");
    if (merge_) {
      void* margs[] = {&o_ws_, &lse_ws_, &o_, &lse_};
      check(d.launch(merge_, 1, unsigned(heads_), 1, merge_threads_, 1, 1, 0, stream_, margs, nullptr),
            "cuLaunchKernel(merge)");
    }
    begun_ = true;
  }

  void finish_partial_attention(float* out, float* lse) override {
    if (!begun_) fail(Status::invalid_argument, "GpuAttention::finish_partial_attention without a begin");
    begun_ = false;
    const Driver& d = driver();
    check(d.ctx_set(ctx_), "cuCtxSetCurrent");
    wait();
    const size_t out_bytes = size_t(heads_) * size_t(spec_.group_size) * size_t(spec_.head_dim) * 4;
    const uint8_t* results = host_ + query_bytes(heads_);
    std::memcpy(out, results, out_bytes);
    std::memcpy(lse, results + out_bytes, result_bytes(heads_) - out_bytes);
  }

 private:
  KernelSpec spec_;
  cuda::KernelModule module_ir_;
  CUdevice device_ = 0;
  std::shared_ptr<const LoadedModule> loaded_;
  CUcontext ctx_ = nullptr;  // loaded_'s, and its functions below
  CUfunction partial_ = nullptr, merge_ = nullptr;
  unsigned smem_ = 0, threads_ = 0, merge_threads_ = 0;
  std::string name_;
  size_t row_bytes() const { return size_t(spec_.head_dim) * 2; }  // fp16 / bf16 rows
  size_t query_bytes(int heads) const { return size_t(heads) * size_t(spec_.group_size) * size_t(spec_.head_dim) * 4; }
  size_t result_bytes(int heads) const {  // out, then lse
    return size_t(heads) * size_t(spec_.group_size) * (size_t(spec_.head_dim) + 1) * 4;
  }
  // Waits for everything queued on the stream.
  void wait() {
    if (!rows_in_flight_ && !results_in_flight_) return;
    rows_in_flight_ = results_in_flight_ = false;
    check(driver().stream_sync(stream_), "cuStreamSynchronize");
  }
  void free_buffers() {
    const Driver& d = driver();
    for (CUdeviceptr p : {k_, o_ws_, lse_ws_})  // v_ lies in k_'s block; q_, o_, lse_ in host_
      if (p) d.mem_free(p);
    k_ = v_ = q_ = o_ = lse_ = o_ws_ = lse_ws_ = 0;
    if (host_) d.host_free(host_);
    host_ = nullptr;
  }

  int heads_ = 0;
  int64_t rows_ = 0, capacity_ = 0;
  CUstream stream_ = nullptr;
  // Page-locked: the queries, then the results (out, lse), then the staging
  // rows of update_static_row (keys of every head, then values).
  uint8_t* host_ = nullptr;
  bool begun_ = false;              // a begin_partial_attention awaits its finish
  bool rows_in_flight_ = false;     // queued copies still read the staging rows
  bool results_in_flight_ = false;  // queued work still uses the query / result buffers
  CUdeviceptr k_ = 0, v_ = 0, o_ws_ = 0, lse_ws_ = 0;
  CUdeviceptr q_ = 0, o_ = 0, lse_ = 0;  // host_'s queries and results, as the GPU addresses them
};

}  // namespace

int static_set_splits(int64_t rows, int kv_heads) {
  constexpr int64_t kRowsPerBlock = 256, kBlocks = 264;  // 2 x the H100's 132 SMs
  const int64_t by_rows = (std::max<int64_t>(rows, 1) + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t by_blocks = (kBlocks + std::max(kv_heads, 1) - 1) / std::max(kv_heads, 1);
  return int(std::clamp<int64_t>(std::min(by_rows, by_blocks), 4, 64));
}

bool gpu_present(std::string* why_not) {
  const Driver& d = driver();
  if (why_not) *why_not = d.why_not;
  return d.why_not.empty() && d.devices > 0;
}

std::unique_ptr<GpuAttention> open_gpu_attention(const KernelSpec& spec,
                                                 const GpuAttentionOptions& options,
                                                 std::string* why_not) {
  if (!gpu_present(why_not)) return nullptr;
  if (options.device < 0 || options.device >= driver().devices)
    fail(Status::invalid_argument, "open_gpu_attention: device " + std::to_string(options.device) +
                                       " does not exist (" + std::to_string(driver().devices) +
                                       " present)");
  return std::make_unique<DriverGpuAttention>(spec, options);
}

}  // namespace rattn
