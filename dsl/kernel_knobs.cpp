#include "dsl/kernel_knobs.h"

#include <cmath>

namespace rattn {

const std::vector<KernelKnob>& kernel_knobs() {
  // CUDA: the shapes the generated kernels are written for (map_threads,
  // plan_shared_memory). Halide: the ranges HalideSchedule::resolved keeps
  // (0 lets the generator choose).
  static const std::vector<KernelKnob> knobs = {
      {"cuda.tile", 8, 256, true},
      {"cuda.warps", 1, 8, true},
      {"cuda.splits", 1, 64},
      {"cuda.vec", 2, 8, true, "elements per load"},
      {"cuda.stages", 1, 4},
      {"cuda.page", 1, 1024, true},
      {"halide.vector", 0, 64, true, "fp32 lanes"},
      {"halide.split", 16, 1 << 20, false, "tokens per block"},
      {"halide.unroll", 0, 16},
      {"halide.dtile", 0, 256},
      {"halide.parallel", 0, 1},
      {"halide.stream_vector", 0, 64, true, "fp32 lanes"},
      {"halide.stream_split", 0, 1 << 20, false, "tokens per block"},
      {"halide.stream_mib", 0, 1 << 20, false, "MiB of K + V"},
  };
  return knobs;
}

const KernelKnob* find_kernel_knob(std::string_view key) {
  for (const auto& k : kernel_knobs())
    if (key == k.key) return &k;
  return nullptr;
}

bool kernel_knob_allows(const KernelKnob& k, double v) {
  if (!(v >= double(k.lo) && v <= double(k.hi)) || v != std::floor(v)) return false;
  const auto i = int64_t(v);
  return !k.pow2 || i == 0 || (i & (i - 1)) == 0;
}

std::string kernel_knob_legal(const KernelKnob& k) {
  std::string s;
  if (!k.pow2) {
    s = std::to_string(k.lo) + ".." + std::to_string(k.hi);
  } else {
    std::vector<int64_t> v;
    if (k.lo == 0) v.push_back(0);
    for (int64_t p = 1; p <= k.hi; p *= 2)
      if (p >= k.lo) v.push_back(p);
    if (v.size() <= 5) {
      for (size_t i = 0; i < v.size(); ++i)
        s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + std::to_string(v[i]);
    } else {
      s = (k.lo == 0 ? "0 or " : "") + std::string("a power of two in ") + std::to_string(k.lo == 0 ? 1 : k.lo) +
          ".." + std::to_string(k.hi);
    }
  }
  if (*k.unit) s += std::string(" ") + k.unit;
  return s;
}

std::string kernel_knob_names(std::string_view prefix) {
  std::string s;
  for (const auto& k : kernel_knobs())
    if (std::string_view(k.key).substr(0, prefix.size()) == prefix) s += (s.empty() ? "" : ", ") + std::string(k.key);
  return s;
}

}  // namespace rattn
