#pragma once
// The CUDA driver API opened with dlopen("libcuda.so.1") once per process
// (gpu_loader.cpp), shared by the static-set attention and the index
// build's kNN. Only inside codegen/cuda: cuda.h is included for types only.
#include <cuda.h>

#include <string>

namespace rattn::cuda_driver {

struct Driver {
  void* lib = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGetCount) device_count = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) attribute = nullptr;
  decltype(&::cuDeviceGetName) device_name = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) ctx_retain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) ctx_release = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set = nullptr;
  decltype(&::cuModuleLoadData) module_load = nullptr;
  decltype(&::cuModuleUnload) module_unload = nullptr;
  decltype(&::cuModuleGetFunction) get_function = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuLaunchKernel) launch = nullptr;
  decltype(&::cuMemAlloc) mem_alloc = nullptr;  // cuMemAlloc_v2
  decltype(&::cuMemFree) mem_free = nullptr;    // cuMemFree_v2
  decltype(&::cuStreamCreate) stream_create = nullptr;
  decltype(&::cuStreamDestroy) stream_destroy = nullptr;  // cuStreamDestroy_v2
  decltype(&::cuStreamSynchronize) stream_sync = nullptr;
  decltype(&::cuMemHostAlloc) host_alloc = nullptr;
  decltype(&::cuMemHostGetDevicePointer) host_device_pointer = nullptr;  // cuMemHostGetDevicePointer_v2
  decltype(&::cuMemFreeHost) host_free = nullptr;
  decltype(&::cuMemcpyHtoDAsync) htod_async = nullptr;  // cuMemcpyHtoDAsync_v2
  decltype(&::cuMemcpy2DAsync) copy_2d_async = nullptr;  // cuMemcpy2DAsync_v2
  decltype(&::cuGetErrorString) error_string = nullptr;
  decltype(&::cuMemcpyHtoD) htod = nullptr;  // cuMemcpyHtoD_v2
  decltype(&::cuMemcpyDtoH) dtoh = nullptr;  // cuMemcpyDtoH_v2
  std::string why_not;  // empty when usable
  int devices = 0;
};

// The driver; why_not is set (and devices 0) when there is no usable GPU.
const Driver& driver();

// Throws Error(internal) naming the call and the driver's message.
void check(CUresult r, const char* what);

// The device's own arch when the generator supports it, else the newest
// supported arch of the same major version below it; Error(unsupported)
// when none.
std::string native_arch_or_compatible(int major, int minor);

}  // namespace rattn::cuda_driver
