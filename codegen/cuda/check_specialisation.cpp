// Pass 1: every diagnostic about what is being specialised, before any work.
#include <algorithm>
#include <string>

#include "codegen/cuda/passes.h"
#include "core/error.h"
#include "dsl/kernel_knobs.h"

namespace rattn::cuda {

namespace {

[[noreturn]] void bad(const std::string& msg) {
  fail(Status::invalid_argument, "cuda codegen: error: " + msg);
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const std::vector<std::string>& supported_archs() {
  static const std::vector<std::string> archs = {"sm_75", "sm_80", "sm_86", "sm_87", "sm_89",
                                                 "sm_90", "sm_100", "sm_120"};
  return archs;
}

int64_t arch_shared_memory_limit(const std::string& arch) {
  // Opt-in maximum of dynamic shared memory per block (CUDA C Programming
  // Guide, compute capability table).
  if (arch == "sm_75") return 64 * 1024;
  if (arch == "sm_80" || arch == "sm_87") return 163 * 1024;
  if (arch == "sm_86" || arch == "sm_89" || arch == "sm_120") return 99 * 1024;
  if (arch == "sm_90" || arch == "sm_100") return 227 * 1024;
  return 0;
}

KernelModule check_specialisation(KernelModule m) {
  const auto& p = m.params;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    bad("head_dim " + std::to_string(p.head_dim) + " is not supported (expected 64, 128 or 256)");
  if (p.group_size < 1 || p.group_size > kMaxGroupSize)
    bad("GQA group size " + std::to_string(p.group_size) + " is not supported (expected 1.." +
        std::to_string(kMaxGroupSize) + " query heads per KV head)");
  if (p.kv_dtype != DType::f16 && p.kv_dtype != DType::bf16)
    bad(std::string("KV dtype ") + dtype_name(p.kv_dtype) + " is not supported (expected f16 or bf16)");
  const auto& archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), p.arch) == archs.end())
    bad("unknown GPU arch '" + p.arch + "' (expected one of " + join(archs) + ")");
  // The legal values are the DSL's table, so a plan `rattn inspect` accepts
  // is not refused here.
  auto knob = [](const char* key, int v) {
    const KernelKnob& k = *find_kernel_knob(key);
    if (!kernel_knob_allows(k, v)) bad(std::string(key) + "=" + std::to_string(v) + " (expected " + kernel_knob_legal(k) + ")");
  };
  knob("cuda.warps", p.warps);
  knob("cuda.vec", p.vec);
  knob("cuda.splits", p.splits);
  knob("cuda.stages", p.stages);
  knob("cuda.tile", p.tile);
  if (p.layout == KvLayout::paged && !kernel_knob_allows(*find_kernel_knob("cuda.page"), p.page_size))
    bad("page size " + std::to_string(p.page_size) + " (expected " + kernel_knob_legal(*find_kernel_knob("cuda.page")) + ")");
  m.passes_run.push_back("check_specialisation");
  return m;
}

}  // namespace rattn::cuda
