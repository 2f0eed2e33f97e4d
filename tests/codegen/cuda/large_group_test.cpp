// GQA groups above 8 query heads per KV head: the group is split over
// grid.z into blocks of at most 8 heads, so every knob combination fits
// exactly where it fits for a group of at most 8; NVRTC builds of group 16.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "codegen/cuda/lower.h"
#include "codegen/cuda/model_kernels.h"
#include "codegen/cuda/nvrtc_compiler.h"
#include "core/error.h"

namespace rattn::cuda {
namespace {

DecodeAttentionParams params(int head_dim, int group, const std::string& arch = "sm_90") {
  DecodeAttentionParams p;
  p.head_dim = head_dim;
  p.group_size = group;
  p.arch = arch;
  return p;
}

bool lowers(const DecodeAttentionParams& p, std::string* why = nullptr) {
  try {
    lower_decode_attention(p);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

TEST(CudaLargeGroups, GroupIsSplitOverGridZInBlocksOfAtMost8Heads) {
  // group -> heads per block: the largest divisor up to 8.
  const std::map<int, int> expected = {{1, 1},  {5, 5},  {8, 8},  {9, 3},  {11, 1}, {12, 6},
                                       {16, 8}, {24, 8}, {32, 8}, {40, 8}, {48, 8}, {64, 8}};
  for (const auto& [group, heads] : expected) {
    SCOPED_TRACE("group " + std::to_string(group));
    const KernelModule m = lower_decode_attention(params(128, group));
    EXPECT_EQ(m.mapping.heads_per_block, heads);
    EXPECT_EQ(m.mapping.group_blocks, group / heads);
    const KernelDef* k = find_kernel(m, KernelRole::partial);
    EXPECT_EQ(k->grid_z, std::to_string(group / heads));
    // The merge kernel combines the whole group per KV head.
    EXPECT_EQ(find_kernel(m, KernelRole::merge)->grid_z, "1");
    // The warp merge holds only the block's heads: 4 warps x heads x (128 + 2)
    // floats, below the K/V tiles (2 stages x 32 rows x 128 x 2 bytes x 2).
    EXPECT_EQ(k->shared_bytes, std::max<int64_t>(2 * 32 * 128 * 2 * 2, 4 * heads * (128 + 2) * 4));
  }
  std::string why;
  EXPECT_FALSE(lowers(params(128, 65), &why));
  EXPECT_NE(why.find("GQA group size 65 is not supported (expected 1..64 query heads per KV head)"), std::string::npos)
      << why;
}

// The defaults fit groups 16 and 32 at every head dim, dtype and arch (the
// warp merge of 16 heads of 256 would not fit sm_75's 64 KiB in one block).
TEST(CudaLargeGroups, DefaultsFitLargeGroupsEverywhere) {
  for (const std::string& arch : supported_archs())
    for (int d : {64, 128, 256})
      for (DType t : {DType::f16, DType::bf16})
        for (int group : {12, 16, 32}) {
          DecodeAttentionParams p = params(d, group, arch);
          p.kv_dtype = t;
          std::string why;
          EXPECT_TRUE(lowers(p, &why)) << arch << " d" << d << " group " << group << ": " << why;
        }
}

// Every legal (warps, tile, vec, stages) lowers at group 16 exactly when it
// lowers at group 8, with the same reason when it does not.
TEST(CudaLargeGroups, EveryKnobCombinationAtGroup16FitsAsAtGroup8) {
  int built = 0, refused = 0;
  for (const std::string arch : {"sm_75", "sm_86", "sm_80", "sm_90"})
    for (int d : {64, 128, 256})
      for (int warps : {1, 2, 4, 8})
        for (int tile = 8; tile <= 256; tile *= 2)
          for (int vec : {2, 4, 8})
            for (int stages : {1, 2, 4}) {
              DecodeAttentionParams p = params(d, 8, arch);
              p.warps = warps, p.tile = tile, p.vec = vec, p.stages = stages, p.splits = 3;
              std::string why8, why16;
              const bool ok8 = lowers(p, &why8);
              p.group_size = 16;
              const bool ok16 = lowers(p, &why16);
              EXPECT_EQ(ok16, ok8) << module_uri(p) << ": " << why16 << why8;
              if (!ok16) {
                EXPECT_NE(why16.find("; "), std::string::npos) << why16;  // names the knob to change
                EXPECT_EQ(why16.find("group size 8"), std::string::npos) << why16;
              }
              (ok16 ? built : refused)++;
            }
  EXPECT_GT(built, 0);
  EXPECT_GT(refused, 0);
}

TEST(CudaLargeGroups, EmittedTextIndexesTheBlocksHeadsWithinTheGroup) {
  const GeneratedModule g = generate_module(params(256, 16));
  for (const char* want : {"constexpr int D = 256, G = 16,", "constexpr int HG = 8;",
                           "const int g0 = blockIdx.z * HG;", "float qr[HG][CHUNKS * VEC];",
                           "q[((long long)head * G + g0 + g) * D", "const int g = g0 + h;",
                           "const long long at = ((long long)head * SPLITS + split) * G + g;",
                           "for (int i = threadIdx.x; i < G * D; i += blockDim.x) {"})
    EXPECT_NE(g.source.find(want), std::string::npos) << want;
}

TEST(CudaLargeGroups, Group16CompilesWithNvrtcForSm80AndSm90) {
  for (int d : {128, 256})
    for (const std::string arch : {"sm_80", "sm_90"}) {
      DecodeAttentionParams p = params(d, 16, arch);
      p.kv_dtype = d == 128 ? DType::f16 : DType::bf16;
      const GeneratedModule g = generate_module(p);
      CompileOptions o;
      o.arch = arch;
      const CompiledModule c = nvrtc_compile(g.module.name, g.source, o);
      EXPECT_EQ(c.cubin.compare(0, 4, "\x7f" "ELF"), 0) << g.module.name;
      EXPECT_NE(c.ptx.find(".entry " + g.module.name + "_partial"), std::string::npos) << g.module.name;
      EXPECT_NE(c.ptx.find(".entry " + g.module.name + "_merge"), std::string::npos) << g.module.name;
      EXPECT_NE(c.ptx.find(".target " + arch), std::string::npos) << g.module.name;
      EXPECT_NE(c.ptx.find("cp.async"), std::string::npos) << g.module.name;
    }
}

}  // namespace
}  // namespace rattn::cuda
