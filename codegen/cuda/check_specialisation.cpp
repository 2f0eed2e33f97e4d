// Pass 1: every diagnostic about what is being specialised, before any work.
#include <algorithm>
#include <string>

#include "codegen/cuda/passes.h"
#include "core/error.h"

namespace rattn::cuda {

namespace {

[[noreturn]] void bad(const std::string& msg) {
  fail(Status::invalid_argument, "cuda codegen: error: " + msg);
}

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

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
  if (p.group_size < 1 || p.group_size > 8)
    bad("GQA group size " + std::to_string(p.group_size) +
        " is not supported (expected 1..8 query heads per KV head)");
  if (p.kv_dtype != DType::f16 && p.kv_dtype != DType::bf16)
    bad(std::string("KV dtype ") + dtype_name(p.kv_dtype) + " is not supported (expected f16 or bf16)");
  const auto& archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), p.arch) == archs.end())
    bad("unknown GPU arch '" + p.arch + "' (expected one of " + join(archs) + ")");
  if (p.warps != 1 && p.warps != 2 && p.warps != 4 && p.warps != 8)
    bad("cuda.warps=" + std::to_string(p.warps) + " (expected 1, 2, 4 or 8)");
  if (p.vec != 2 && p.vec != 4 && p.vec != 8)
    bad("cuda.vec=" + std::to_string(p.vec) + " (expected 2, 4 or 8 elements per load)");
  if (p.splits < 1 || p.splits > 64)
    bad("cuda.splits=" + std::to_string(p.splits) + " (expected 1..64)");
  if (p.stages < 1 || p.stages > 4)
    bad("cuda.stages=" + std::to_string(p.stages) + " (expected 1..4)");
  if (!is_pow2(p.tile) || p.tile < 8 || p.tile > 256)
    bad("cuda.tile=" + std::to_string(p.tile) + " (expected a power of two in 8..256)");
  if (p.layout == KvLayout::paged && (!is_pow2(p.page_size) || p.page_size > 1024))
    bad("page size " + std::to_string(p.page_size) + " (expected a power of two up to 1024)");
  m.passes_run.push_back("check_specialisation");
  return m;
}

}  // namespace rattn::cuda
