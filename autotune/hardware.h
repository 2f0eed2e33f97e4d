#pragma once
// The tuner's view of the hardware: a fingerprint of this machine (what the
// tuning database keys measurements by) and the GPU time model, built from a
// table of GPU specifications (docs/autotune.md, "The GPU time model").
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir.h"

namespace rattn {

struct GpuSpec {
  std::string name;       // e.g. "H100 SXM5 80GB"
  std::string key;        // what --gpu accepts besides the arch, e.g. "h100-sxm"
  std::string arch;       // "sm_90"
  double memory_gib = 0;
  double bandwidth_gbs = 0;   // device memory, GB/s (1e9 bytes)
  int sms = 0;
  double boost_ghz = 0;
  std::string link;           // host link, e.g. "PCIe 5.0 x16"
  double link_gbs = 0;        // one direction, GB/s
  double link_latency_us = 0; // one small transfer, including its synchronisation
  double launch_us = 0;       // one kernel launch
  std::string source;         // where the numbers come from
};

// Every GPU the model knows, one representative per arch first (what an
// arch alone selects), then other parts.
const std::vector<GpuSpec>& gpu_specs();
// `what` is an arch ("sm_90") or a key ("h100-sxm"); throws
// Error(invalid_argument) naming the accepted values otherwise.
const GpuSpec& find_gpu_spec(const std::string& what);

// The table's entry for a device name as the driver reports it (e.g.
// "NVIDIA H200"), or null.
const GpuSpec* gpu_spec_for_device(const std::string& device_name);

// Fractions of the datasheet figures reached: rattn's static-set kernel
// streaming K and V (measured on an H200: 7% of its 4.8 TB/s, about
// 340 GB/s, docs/autotune.md, "The GPU time model"), and the host link.
inline constexpr double kStaticSetKernelEfficiency = 0.07;
inline constexpr double kLinkEfficiency = 0.8;

// One layer's static set on the GPU for one decode step.
struct StaticSetWork {
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int kv_bytes = 2;       // per element of the stored K/V
  int64_t rows = 0;       // sinks + window
};

// One layer of `model` with a static set of `rows` rows.
StaticSetWork static_set_work(const ModelLayout& model, int64_t rows);

struct GpuStepPrediction {
  double kernel_us = 0;    // launch + reading K and V of the static set
  double transfer_us = 0;  // q and the new K/V row in, (o, lse) out
  double total_us() const { return kernel_us + transfer_us; }
};

// The predicted time of one layer's static-set attention on `gpu` in one
// decode step: one launch, the kernel streaming 2 * rows * kv_heads *
// head_dim * kv_bytes bytes at kStaticSetKernelEfficiency of the datasheet
// bandwidth, and three transfers (the new K/V row and q in, o and lse out),
// each one link latency plus its bytes.
GpuStepPrediction predict_static_set(const GpuSpec& gpu, const StaticSetWork& w);

// This machine, as far as timings depend on it.
struct HardwareFingerprint {
  std::string cpu_model;   // /proc/cpuinfo "model name"
  std::string isa;         // the vector ISA flags timings depend on, e.g. "avx2 avx512f fma f16c"
  int cores = 0;
  std::string gpu;         // the GPU present ("none" without one)
  std::string versions;    // rattn, Halide, compiler
  std::string text() const;  // one line, every field
  std::string hash() const;  // 16 hex digits of text()
};
HardwareFingerprint host_fingerprint();

}  // namespace rattn
