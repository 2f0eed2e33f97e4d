#include "autotune/hardware.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <thread>

#include "codegen/cuda/gpu_backend.h"
#include "codegen/cuda/passes.h"
#include "codegen/halide/halide_kernels.h"
#include "core/atomic_file.h"
#include "core/cpu_info.h"
#include "core/error.h"

namespace rattn {

namespace {
// A launch and one small transfer with its synchronisation over PCIe:
// fitted with the kernel terms to the H100 timings in docs/autotune.md (a
// step's fixed cost about 20 us). The NVLink-C2C latency is assumed, not
// measured.
constexpr double kLaunchUs = 4.0, kPcieLatencyUs = 5.1, kC2cLatencyUs = 2.0;
}  // namespace

const std::vector<GpuSpec>& gpu_specs() {
  static const std::vector<GpuSpec> table = {
      {"A100 PCIe 40GB", "a100-40gb", "sm_80", 40, 1555, 108, 1.41, "PCIe 4.0 x16", 32, kPcieLatencyUs, kLaunchUs,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): 1,555 GB/s HBM2, 108 SMs, PCIe Gen4 64 GB/s bidirectional"},
      {"RTX 3090", "rtx3090", "sm_86", 24, 936, 82, 1.695, "PCIe 4.0 x16", 32, kPcieLatencyUs, kLaunchUs,
       "NVIDIA GeForce RTX 3090 specifications: 936 GB/s GDDR6X, 82 SMs, boost 1.70 GHz"},
      {"RTX 4090", "rtx4090", "sm_89", 24, 1008, 128, 2.52, "PCIe 4.0 x16", 32, kPcieLatencyUs, kLaunchUs,
       "NVIDIA Ada GPU architecture whitepaper: RTX 4090 1,008 GB/s GDDR6X, 128 SMs, boost 2.52 GHz"},
      {"H100 SXM5 80GB", "h100-sxm", "sm_90", 80, 3350, 132, 1.98, "PCIe 5.0 x16", 64, kPcieLatencyUs, kLaunchUs,
       "NVIDIA H100 Tensor Core GPU datasheet (2023): SXM 3.35 TB/s HBM3, 132 SMs, PCIe Gen5 128 GB/s bidirectional"},
      {"A100 SXM4 80GB", "a100-80gb", "sm_80", 80, 2039, 108, 1.41, "PCIe 4.0 x16", 32, kPcieLatencyUs, kLaunchUs,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB SXM 2,039 GB/s HBM2e"},
      {"L4", "l4", "sm_89", 24, 300, 58, 2.04, "PCIe 4.0 x16", 32, kPcieLatencyUs, kLaunchUs,
       "NVIDIA L4 datasheet: 300 GB/s GDDR6, 58 SMs"},
      {"H100 PCIe 80GB", "h100-pcie", "sm_90", 80, 2000, 114, 1.755, "PCIe 5.0 x16", 64, kPcieLatencyUs, kLaunchUs,
       "NVIDIA H100 Tensor Core GPU datasheet (2023): PCIe 2 TB/s HBM2e, 114 SMs"},
      {"H200 SXM 141GB", "h200", "sm_90", 141, 4800, 132, 1.98, "PCIe 5.0 x16", 64, kPcieLatencyUs, kLaunchUs,
       "NVIDIA H200 Tensor Core GPU datasheet (2024): 4.8 TB/s HBM3e, 141 GB"},
      {"GH200 96GB", "gh200", "sm_90", 96, 4000, 132, 1.98, "NVLink-C2C", 450, kC2cLatencyUs, kLaunchUs,
       "NVIDIA GH200 Grace Hopper Superchip datasheet: 4 TB/s HBM3, NVLink-C2C 900 GB/s bidirectional"},
  };
  return table;
}

const GpuSpec& find_gpu_spec(const std::string& what) {
  for (const GpuSpec& g : gpu_specs())
    if (g.arch == what) return g;  // the arch's representative comes first
  for (const GpuSpec& g : gpu_specs())
    if (g.key == what) return g;
  std::set<std::string> names;
  for (const GpuSpec& g : gpu_specs()) names.insert(g.arch), names.insert(g.key);
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  fail(Status::invalid_argument, "unknown GPU '" + what + "': the time model knows " + list);
}

const GpuSpec* gpu_spec_for_device(const std::string& device_name) {
  std::string name;
  for (char ch : device_name) name += char(std::tolower(static_cast<unsigned char>(ch)));
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  const char* key = nullptr;
  if (has("gh200")) key = "gh200";
  else if (has("h200")) key = "h200";
  else if (has("h100")) key = has("pcie") ? "h100-pcie" : "h100-sxm";
  else if (has("a100")) key = has("80gb") ? "a100-80gb" : "a100-40gb";
  else if (has("4090")) key = "rtx4090";
  else if (has("3090")) key = "rtx3090";
  else if (has(" l4")) key = "l4";
  if (!key) return nullptr;
  for (const GpuSpec& g : gpu_specs())
    if (g.key == key) return &g;
  return nullptr;
}

StaticSetWork static_set_work(const ModelLayout& model, int64_t rows, int splits, int warps) {
  return StaticSetWork{model.num_q_heads, model.num_kv_heads, model.head_dim, int(dtype_size(model.kv_dtype)), rows,
                       splits, warps};
}

GpuStepPrediction predict_static_set(const GpuSpec& gpu, const StaticSetWork& w) {
  GpuStepPrediction p;
  p.splits = w.splits > 0 ? w.splits : static_set_splits(w.rows, w.kv_heads);
  const double row_bytes = 2.0 * w.head_dim * w.kv_bytes;  // K and V of one row of one KV head
  const double block_rows = std::ceil(double(std::max<int64_t>(w.rows, 0)) / p.splits);
  const double group = w.kv_heads > 0 ? double(w.q_heads) / w.kv_heads : 1.0;
  // A block computes at most 8 query heads: a larger group is split over
  // grid.z into blocks that each walk the rows for their own heads.
  const double block_group = group == std::floor(group) ? cuda::heads_per_block(int(group)) : group;
  const double row_ns =
      kStaticSetRowNs + kStaticSetRowPerQueryDimNs * block_group * w.head_dim + kStaticSetByteNs * row_bytes;
  const double walk_us =
      block_rows * row_ns * 1e-3 * std::pow(std::max(w.warps, 1) / 4.0, -kStaticSetWarpsExponent);
  const double grid_us = double(w.rows) * w.kv_heads *
                         (kStaticSetSmRowNs + kStaticSetSmRowPerQueryDimNs * group * w.head_dim) * 1e-3 /
                         std::max(gpu.sms, 1);
  const double stream_us =
      double(w.rows) * w.kv_heads * row_bytes / (gpu.bandwidth_gbs * kStaticSetBandwidthShare * 1e3);
  p.kernel_us = gpu.launch_us + std::max({walk_us, grid_us, stream_us}) +
                kStaticSetCombineNs * 1e-3 * p.splits * w.head_dim * group +
                kStaticSetBlockQueryUs * p.splits * w.kv_heads * group;
  const double q_bytes = double(w.q_heads) * w.head_dim * 4;
  const double out_bytes = double(w.q_heads) * (w.head_dim + 1) * 4;
  p.transfer_us = 3 * gpu.link_latency_us +
                  (row_bytes * w.kv_heads + q_bytes + out_bytes) / (gpu.link_gbs * kLinkEfficiency * 1e3);
  return p;
}

std::string HardwareFingerprint::text() const {
  std::ostringstream os;
  os << "cpu " << cpu_model << "; isa " << isa << "; cores " << cores << "; gpu " << gpu << "; " << versions;
  return os.str();
}

std::string HardwareFingerprint::hash() const {
  const std::string t = text();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a64(t.data(), t.size())));
  return hex;
}

HardwareFingerprint host_fingerprint() {
  HardwareFingerprint f;
  f.cpu_model = cpu_model();
  const std::string flags = " " + cpu_info_field("flags") + " ";
  for (const char* isa : {"sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                          "avx512_fp16", "amx_tile"})
    if (flags.find(std::string(" ") + isa + " ") != std::string::npos) f.isa += (f.isa.empty() ? "" : " ") + std::string(isa);
  f.cores = int(std::thread::hardware_concurrency());
  std::string why;
  f.gpu = "none";
  if (gpu_present(&why)) {
    try {
      KernelSpec spec;
      if (auto g = open_gpu_attention(spec)) f.gpu = g->device_name();
    } catch (const Error&) {
      f.gpu = "present";
    }
  }
  // The Halide version and target, not the pipelines' source hash: that
  // keys the kernels' own records (plan_tuner.cpp), not the searches'.
  f.versions = "rattn 0.1.0; Halide " + halide_version() + " target " + halide_host_target() + "; compiler " +
               __VERSION__;
  return f;
}

}  // namespace rattn
