#include "tests/codegen/cuda/emu_registry.h"

namespace rattn::emu_test {

std::vector<cuda::DecodeAttentionParams> covered_specialisations() {
  using cuda::KvLayout;
  struct Row {
    int d, g;
    DType t;
    KvLayout l;
    int page, tile, warps, splits, vec, stages;
  };
  // Every group size 1..8 and 9, 12, 16, 32, head dims 64/128/256, f16 and
  // bf16, both layouts, and each thread mapping: lanes per token 8/16/32, 1-2
  // chunks per lane, pipelines of 1..4 stages, 1..16 splits (incl. non
  // powers of two).
  const Row rows[] = {
      {128, 4, DType::f16, KvLayout::contiguous, 16, 32, 4, 4, 8, 2},   // Llama-3-8B default
      {128, 1, DType::f16, KvLayout::contiguous, 16, 16, 2, 1, 8, 1},
      {128, 2, DType::bf16, KvLayout::paged, 16, 32, 4, 8, 4, 3},
      {128, 3, DType::f16, KvLayout::paged, 16, 64, 8, 2, 8, 2},
      {64, 5, DType::f16, KvLayout::contiguous, 16, 32, 4, 16, 8, 2},
      {64, 6, DType::bf16, KvLayout::paged, 8, 16, 1, 3, 2, 4},
      {256, 7, DType::f16, KvLayout::contiguous, 16, 32, 4, 2, 8, 2},
      {256, 8, DType::bf16, KvLayout::paged, 16, 16, 2, 4, 4, 2},
      {256, 4, DType::bf16, KvLayout::contiguous, 16, 32, 4, 4, 8, 2},  // Gemma-3 default
      {64, 8, DType::f16, KvLayout::contiguous, 16, 8, 1, 5, 4, 1},
      {128, 7, DType::bf16, KvLayout::contiguous, 16, 32, 2, 2, 2, 2},
      {128, 5, DType::f16, KvLayout::paged, 32, 32, 8, 1, 4, 1},
      // Groups above 8, split over grid.z: 16 (2 blocks of 8 heads) at
      // head_dim 128 and 256, 12 (2 of 6), 9 (3 of 3), 32 (4 of 8).
      {128, 16, DType::f16, KvLayout::contiguous, 16, 32, 4, 3, 8, 2},
      {256, 16, DType::bf16, KvLayout::paged, 16, 16, 2, 2, 8, 2},
      {128, 12, DType::bf16, KvLayout::contiguous, 16, 16, 2, 4, 4, 1},
      {256, 12, DType::f16, KvLayout::contiguous, 16, 32, 4, 2, 4, 3},
      {64, 9, DType::f16, KvLayout::paged, 8, 16, 1, 3, 2, 4},
      {256, 32, DType::bf16, KvLayout::contiguous, 16, 32, 4, 5, 8, 2},
  };
  std::vector<cuda::DecodeAttentionParams> out;
  for (const Row& r : rows) {
    cuda::DecodeAttentionParams p;
    p.head_dim = r.d;
    p.group_size = r.g;
    p.kv_dtype = r.t;
    p.layout = r.l;
    p.page_size = r.page;
    p.tile = r.tile;
    p.warps = r.warps;
    p.splits = r.splits;
    p.vec = r.vec;
    p.stages = r.stages;
    p.arch = "sm_90";
    out.push_back(p);
  }
  return out;
}

std::vector<cuda::KnnKernelParams> covered_knn_kernels() {
  // Head dims 32..256 and one not a multiple of 4 (keys read a float at a
  // time), k below, at and above a warp (one to four held entries per lane),
  // 2 to 8 warps, one to four rows per warp, 32- to 128-key tiles, and every
  // micro tile: 1 x 1, 1 x 2, 1 x 4, 2 x 4 and 4 x 4 scores per thread.
  struct Row {
    int d, k, tq, kt, threads;
  };
  const Row rows[] = {{64, 16, 8, 32, 64},   {128, 100, 16, 64, 128}, {256, 40, 8, 32, 256},
                      {32, 33, 16, 64, 64},  {36, 100, 8, 64, 128},   {33, 20, 16, 32, 256},
                      {128, 100, 64, 64, 256}, {64, 50, 8, 128, 128}};
  std::vector<cuda::KnnKernelParams> out;
  for (const Row& r : rows) {
    cuda::KnnKernelParams p;
    p.head_dim = r.d;
    p.k = r.k;
    p.tile_queries = r.tq;
    p.tile_keys = r.kt;
    p.threads = r.threads;
    out.push_back(p);
  }
  return out;
}

}  // namespace rattn::emu_test
