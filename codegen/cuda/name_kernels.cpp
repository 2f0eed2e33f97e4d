// Pass 6: names. The URI spells out every specialisation; it is the cache key
// prefix, the cache folder and the symbol prefix (FlashInfer-style).
#include <algorithm>
#include <string>

#include "codegen/cuda/passes.h"

namespace rattn::cuda {

std::string module_uri(const DecodeAttentionParams& p) {
  std::string arch = p.arch;
  arch.erase(std::remove(arch.begin(), arch.end(), '_'), arch.end());
  std::string s = "rattn_decode_hd" + std::to_string(p.head_dim) + "_g" +
                  std::to_string(p.group_size) + "_" + dtype_name(p.kv_dtype) + "_";
  s += p.layout == KvLayout::paged ? "paged" + std::to_string(p.page_size) : std::string("contig");
  s += "_t" + std::to_string(p.tile) + "_w" + std::to_string(p.warps) + "_s" +
       std::to_string(p.splits) + "_v" + std::to_string(p.vec) + "_st" + std::to_string(p.stages) +
       "_" + arch;
  return s;
}

KernelModule name_kernels(KernelModule m) {
  m.name = module_uri(m.params);
  for (auto& k : m.kernels) k.name = m.name + (k.role == KernelRole::partial ? "_partial" : "_merge");
  m.passes_run.push_back("name_kernels");
  return m;
}

}  // namespace rattn::cuda
