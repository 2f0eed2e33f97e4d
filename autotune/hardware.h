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

// rattn's static-set kernel as measured on Hopper (docs/autotune.md, "The
// GPU time model"). The kernel takes the slowest of three limits: one
// block's walk over its rows / splits rows (latency-bound: a fixed cost per
// row, one per multiply of the block's query heads (the group, or its share
// of at most 8 heads for a larger group) with head_dim and one per byte of
// its K and V, less with more warps); the whole grid's work spread
// over the SMs (per row and KV head: a fixed cost and one per query head x
// head_dim multiply); and the grid's bytes at kStaticSetBandwidthShare of the
// datasheet bandwidth. Every split adds to the combine (its partial output of
// head_dim x group values) and every block a cost per query head it serves.
// Fitted to 744 timings of the tuner's own loop on four H100 machines (10
// shapes: 1-32 KV heads, groups 1-8, head_dim 128 and 256, 1-64 splits, 4 and
// 8 warps): median error 6%, p90 13%; each shape left out of the fit and
// predicted: median 3-11%. Other GPUs are assumed to run at Hopper's per-SM
// and per-block rates.
inline constexpr double kStaticSetRowNs = 12.0;
inline constexpr double kStaticSetRowPerQueryDimNs = 0.04;  // per query head x head_dim element
inline constexpr double kStaticSetByteNs = 0.022;
inline constexpr double kStaticSetWarpsExponent = 0.25;       // walk x (warps / 4)^-0.25
inline constexpr double kStaticSetSmRowNs = 9.7;              // per row and KV head, on one SM
inline constexpr double kStaticSetSmRowPerQueryDimNs = 0.06;  // ... and per query head x head_dim element
inline constexpr double kStaticSetCombineNs = 0.66;           // per split and head_dim x group value
inline constexpr double kStaticSetBlockQueryUs = 0.013;       // per block (split x KV head) and query head of its group
inline constexpr double kStaticSetBandwidthShare = 0.83;
inline constexpr double kLinkEfficiency = 0.8;

// One layer's static set on the GPU for one decode step.
struct StaticSetWork {
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int kv_bytes = 2;       // per element of the stored K/V
  int64_t rows = 0;       // sinks + window
  int splits = 0;         // cuda.splits; 0: the runtime's choice (static_set_splits)
  int warps = 4;          // cuda.warps (the generator's default 4)
};

// One layer of `model` with a static set of `rows` rows.
StaticSetWork static_set_work(const ModelLayout& model, int64_t rows, int splits = 0, int warps = 4);

struct GpuStepPrediction {
  double kernel_us = 0;    // launch + the grid reading K and V of the static set + the split combine
  double transfer_us = 0;  // q and the new K/V row in, (o, lse) out
  int splits = 0;          // the split count predicted for
  double total_us() const { return kernel_us + transfer_us; }
};

// The predicted time of one layer's static-set attention on `gpu` in one
// decode step: one launch, the kernel (the slowest of one block's walk over
// rows / splits rows, the grid's work over the SMs and its bytes at
// kStaticSetBandwidthShare of the datasheet bandwidth, plus the splits'
// combine and the blocks' own cost), and three transfers (the new K/V row and q in, o and lse out),
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
