#pragma once
// Pieces the Sequence's translation units share (sequence.cpp, prefill.cpp,
// decode.cpp): row conversion and checks, the decode profile's parts, and
// the state of a decode step between begin_decode and end_decode.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "runtime/layer_state.h"
#include "runtime/runtime.h"

namespace rattn {
namespace internal {

// Converts n elements from `src_t` to `dst_t`; `tmp` holds at least n floats
// when a conversion through fp32 is needed.
inline void convert(DType src_t, const void* src, DType dst_t, void* dst, size_t n, float* tmp) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
  } else if (src_t == DType::f32) {
    from_f32(dst_t, static_cast<const float*>(src), dst, n);
  } else if (dst_t == DType::f32) {
    to_f32(src_t, src, static_cast<float*>(dst), n);
  } else {
    to_f32(src_t, src, tmp, n);
    from_f32(dst_t, tmp, dst, n);
  }
}

inline const uint8_t* offset_rows(const void* base, int64_t rows, int d, DType t) {
  return static_cast<const uint8_t*>(base) + size_t(rows) * size_t(d) * dtype_size(t);
}

// Refuses q [hq][n][d], k and v [hkv][n][d] (tokens first_token.. of
// `layer`) when a value is non-finite, beyond 2^40 or beyond the K/V storage
// dtype (core/finite.h; queries are kept in fp32), naming the call, layer,
// tensor, head, token and element. One scan per tensor; the message is built
// only for a refusal. Run before anything changes, so a refused call leaves
// the sequence as it was.
void check_qkv(const char* call, int layer, const RuntimeConfig& c, int64_t first_token, int64_t n, const void* q,
               const void* k, const void* v, DType dtype);

// DecodeProfile's parts, as indexes into Sequence::profile_ns_: times in ns,
// then counts; kInsertScoredBase holds the indexes' insert_keys_scored when
// profiling began.
enum ProfilePart : int {
  kTotal, kPrepare, kInsert, kSearch, kRetrievedAttention, kStatic, kMerge, kSteps, kTail,
  kStaticRows, kKeysScored, kRetrievedRows, kMergedPartials, kInserted, kInsertScoredBase
};
constexpr int kProfileParts = kInsertScoredBase + 1;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Everything a decode step's work items read, behind one pointer, from
// begin_decode to end_decode.
struct StepArgs {
  LayerState* st;
  CpuKernels* kernels;
  GpuAttention* gpu;
  int64_t gpu_row;  // the static-set slot the new token took
  const void* const* gpu_key_rows;
  const void* const* gpu_value_rows;
  const float* q;
  float* out;
  float* lse;
  float* pending_out;
  float* pending_lse;
  float* tail_out;  // null: no tail estimate this step
  float* tail_lse;
  SearchJob* jobs;
  std::atomic<int64_t>* profile_ns;  // null: not profiling
  int64_t n_static, top_k, pending_attended, pending_inserted, ring_slot, tail_rows;
  int d, group, retrieval_items, per_item;
  DType store_t;
  const SearchParams* search;  // the layer's decode search for k = 0 (Runtime::decode_search_params)
  int search_seeds;
  int64_t refresh_stride;  // 0: no refresh queries kept
  // Each group's query heads share one index (plan shared_graph): an item
  // holds the whole group and inserts each token once.
  bool shared_index;
};

}  // namespace internal

// One prefill_end_async() build: its chunks and thread, and how it ended.
struct Sequence::Build {
  int layer = 0;
  std::unique_ptr<internal::PromptChunks> chunks;
  std::thread thread;
  std::exception_ptr error;  // written by the thread, read after join
};

struct Sequence::PendingStep {
  internal::StepArgs args{};
  // Items of the parallel loop: [0, gpu_items) the GPU's, then
  // args.retrieval_items, then one per KV head.
  int64_t gpu_items = 0, items = 0;
  // Then a second loop (with retrieval and a tail estimate): tail_pieces
  // items per KV head, each a slice of its sample (Sequence::tail_pieces_).
  int64_t tail_items = 0;
  int tail_pieces = 0;
  bool retrieve = false, insert_now = false, tail = false, profiling = false;
  int hq = 0;
  int64_t t_start = 0, t_loop = 0, codes_ns = 0, tail_draw_ns = 0;
};

}  // namespace rattn
