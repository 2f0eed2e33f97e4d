#pragma once
// The layout of what a deployable library (`rattn emit --target library`)
// embeds: the plan, ahead-of-time Halide kernel sets and GPU modules. The
// emitting tool compiles a generated .cpp against this header (copied next
// to the runtime archive at build time), so it includes nothing of rattn.
// Bump kAbiVersion on any change of these structs.
#include <cstddef>

namespace rattn::embedded {

inline constexpr int kAbiVersion = 1;

// Halide's generic entry point NAME_argv(void** args); 0 on success.
using KernelEntry = int (*)(void**);

struct Kernel {
  const char* name;  // halide_kernel_name() of its config (not the symbol)
  KernelEntry entry;
};

// Every kernel of the plan compiled for one Halide target.
struct KernelSet {
  const char* label;   // "host" or "baseline"
  const char* target;  // Halide target string, e.g. "x86-64-linux-avx-avx2-f16c-fma-sse41"
  int vector_width;    // the target's natural fp32 vector width (resolves halide.vector = 0)
  const Kernel* kernels;
  int n_kernels;
};

// One CUDA module (print_cuda text compiled by NVRTC at emit time).
struct GpuModule {
  const char* name;  // the module URI (kernel symbol prefix)
  const char* arch;  // e.g. "sm_90"
  const unsigned char* cubin;
  std::size_t cubin_size;
  const char* ptx;  // NUL-terminated
  std::size_t ptx_size;
};

struct Payload {
  int abi_version;
  const char* model;      // the sanitised model name
  const char* plan_text;  // the .ra text, NUL-terminated
  const KernelSet* kernel_sets;  // best first: host, then baseline
  int n_kernel_sets;
  const GpuModule* gpu_modules;
  int n_gpu_modules;
};

// The payload of this library: nullptr in plain librattn (a weak default),
// the generated one in an emitted library.
const Payload* payload();

}  // namespace rattn::embedded
