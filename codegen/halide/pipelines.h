#pragma once
// Internal: the Halide pipelines (define_X for the algorithm, schedule_X for
// its schedule) and their compilation to object files. Declared without
// Halide.h; defined in pipelines.cpp, the only translation unit that
// includes it.
//
// Calling convention of every compiled kernel `NAME` (Halide's `NAME_argv`,
// void** holding a halide_buffer_t* per buffer and an int32_t* per scalar).
// Buffers are Halide-ordered (innermost dimension first):
//   gathered_dot:      q[d, G] f32, k[d, rows] kv, ids[n] i32,
//                      -> scores[n, G] f32
//   partial_attention: q[d, G], k[d, rows], v[d, rows], ids[n], block (i32),
//                      -> out[d, G] f32, lse[G] f32
//   dense_attention:   q[d, G], k[d, n], v[d, n], block (i32),
//                      -> out[d, G], lse[G]
//   merge:             o_parts[d, H, P] f32, lse_parts[H, P] f32,
//                      -> out[d, H], lse[H] (lse = kEmptyLse when every part is empty)
// bf16 K/V are passed as uint16 buffers; fp16 as Halide float16.
// `block` is the number of tokens per block (1 <= block; blocks = ceil(n / block)).
#include <string>

#include "codegen/halide/halide_kernels.h"

namespace rattn::internal {

// Halide compiles with no-infs/no-NaNs fast math, so pipelines never produce
// -inf themselves: an empty merge yields this sentinel, mapped to -inf by the caller.
inline constexpr float kEmptyLse = -3.0e38f;

// Bumped whenever a pipeline or schedule changes meaning, so old cache
// entries are never reused.
inline constexpr int kPipelineVersion = 4;

// Compiles kernel `c` into `object_path` (and a C header if `header_path` is
// not empty; likewise the lowered statement and assembly) for a Halide target string ("host" = this CPU). Without the
// runtime when `with_runtime` is false (for static libraries holding several
// kernels plus one runtime). Thread-safe: calls into libHalide are
// serialised (one process-wide lock), since Halide 14 does not document
// concurrent compiles as safe. The C function is `function_name` ("" =
// halide_kernel_name(c)), so that several sets of one kernel can share a
// library. Throws rattn::Error(internal) with Halide's
// message on failure.
void compile_kernel_object(const HalideKernelConfig& c, const std::string& object_path,
                           const std::string& header_path, const std::string& target,
                           bool with_runtime, const std::string& stmt_path = "",
                           const std::string& asm_path = "", const std::string& function_name = "");
// The Halide runtime alone, for `target`.
void compile_runtime_object(const std::string& object_path, const std::string& target);
// Halide's host target string, e.g. "x86-64-linux-avx-avx2-f16c-fma-sse41".
std::string host_target_string();
// Natural fp32 vector width of the host target (8 with AVX2, 16 with AVX-512).
int host_vector_width();
// The same for a Halide target string ("host" = this CPU).
int target_vector_width(const std::string& target);

}  // namespace rattn::internal
