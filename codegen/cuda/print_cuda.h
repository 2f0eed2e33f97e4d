#pragma once
// Kernel IR -> CUDA C++ text that NVRTC compiles (no headers needed) and that
// tests/codegen/cuda/simt_emu.h compiles on the host unchanged.
//
// Partial kernel `<uri>_partial`, grid (splits, num_kv_heads), block
// warps*32 threads, dynamic shared memory KernelDef::shared_bytes:
//   (const float* q,               [kv_heads][group][head_dim] fp32
//    const unsigned short* k_cache, const unsigned short* v_cache,   fp16/bf16 bits
//        contiguous: row (head * head_stride + pos); paged: row
//        page_table[head * head_stride + pos / page] * page + pos % page
//    const int* page_table,         paged only (may be null when contiguous)
//    long long head_stride, int n_sinks, int n_window, long long window_begin,
//    float* o_out, float* lse_out)
// The static set is positions [0, n_sinks) and [window_begin, window_begin +
// n_window). With splits == 1, o_out/lse_out are [kv_heads][group][head_dim] and
// [kv_heads][group]; otherwise they are the workspace [kv_heads][splits][group]
// (x head_dim) and the merge kernel `<uri>_merge` (grid (1, num_kv_heads),
// block 128) takes (o_ws, lse_ws, o_out, lse_out). lse is in NATURAL log.
#include <string>

#include "codegen/cuda/kernel_ir.h"

namespace rattn::cuda {

std::string print_cuda(const KernelModule& m);

}  // namespace rattn::cuda
