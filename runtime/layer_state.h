#pragma once
// Per-layer state of a Sequence; shared by sequence.cpp, prefill.cpp, decode.cpp
// and sequence_file.cpp.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "kernels/kv_store.h"
#include "runtime/index/distance.h"
#include "runtime/index/key_index.h"

namespace rattn {
struct RuntimeConfig;
}

namespace rattn::internal {

// Hits of a decoded token's own search kept for its insertion (the index's
// own-query insert search takes about this many).
inline constexpr int kInsertHints = 32;

// Bound on a query head's kept refresh queries (QueryHeadState::refresh_queries):
// 2 MiB per head at d = 128, so a model with 1024 query heads in global
// layers keeps at most 2 GiB while the engine does not refresh.
inline constexpr int64_t kMaxRefreshQueries = 4096;

// Every refresh_stride-th indexed row keeps its query for a refresh; 0: none.
inline int64_t refresh_stride(double refresh_sample) {
  return refresh_sample > 0 ? std::max<int64_t>(1, int64_t(1.0 / refresh_sample + 0.5)) : 0;
}

// One KV head: the static set (GPU memory when there is a GPU, host memory
// here) and the CPU store of offloaded tokens.
struct KvHeadState {
  // Rows [0, sinks) hold the sinks, rows [sinks, sinks + window) the window
  // ring. Attention is order-independent, so the static set is always the
  // contiguous rows [0, sinks_filled + window_filled).
  std::vector<uint8_t> static_keys, static_values;
  RowStore cpu_keys, cpu_values;
  // The group's shared traversal codes of cpu_keys (null: none, e.g.
  // plan.traversal_codes off); they cover at least every indexed row.
  std::shared_ptr<SharedTraversalCodes> codes;
  // This step's tail sample (plan.tail_samples; draw_tail_sample), drawn
  // before the parallel loop and read by the group's query heads.
  std::vector<int32_t> tail_sample;
};

// One head's top-k for its tail estimate (scores may be null).
struct TailHits {
  const int32_t* ids = nullptr;
  const float* scores = nullptr;
  int n = 0;
};

// A KV head's tail sample is cut into pieces of at least this many rows.
inline constexpr int64_t kTailPieceRows = 1024;

// A tail piece is scored in chunks of about this many bytes of K/V rows,
// which stay in L2 between the chunk's two passes.
inline constexpr int64_t kTailChunkBytes = 512 * 1024;

// One piece of a KV head's tail estimate (internal::tail_piece): its
// results per query head of the group, and reused buffers.
struct TailPiece {
  std::vector<float> below_out, below_lse;  // [G, d], [G]: partial over the rows below, unscaled
  std::vector<float> above_out, above_lse;  // [G, d], [G]: partial over the rows above the head's top-k
  std::vector<int64_t> n_below, n_above;    // [G]
  std::vector<uint8_t> mark;                // [G, n]: below, retrieved or above, per head and sampled row
  std::vector<float> dots;                  // [G, chunk]
  std::vector<float> chunk_out, chunk_lse;  // [G, d], [G]
  std::vector<float> weakest;               // [G]: each head's weakest top-k score
  std::vector<int32_t> common;              // a chunk's rows below every head's top-k
  std::vector<std::vector<int32_t>> extra, above;  // [G]: each head's other rows below, and above
  std::vector<TailHits> hits;               // [G]: the group's top-k (the step's decode loop fills it)

  size_t memory_bytes() const {
    size_t b = (below_out.capacity() + below_lse.capacity() + above_out.capacity() + above_lse.capacity() +
                dots.capacity() + chunk_out.capacity() + chunk_lse.capacity() + weakest.capacity()) *
                   sizeof(float) +
               (n_below.capacity() + n_above.capacity()) * sizeof(int64_t) + mark.capacity() +
               common.capacity() * sizeof(int32_t) + hits.capacity() * sizeof(TailHits);
    for (const std::vector<int32_t>& l : extra) b += l.capacity() * sizeof(int32_t);
    for (const std::vector<int32_t>& l : above) b += l.capacity() * sizeof(int32_t);
    return b;
  }
};

// One query head (global layers only).
struct QueryHeadState {
  std::vector<float> window_queries;  // [window, d], ring slots as the KV ring
  // Null when retrieval is off (top_k == 0). With plan shared_graph the
  // query heads of a group hold the same index (LayerState::shares_index).
  std::shared_ptr<KeyIndex> index;
  std::unique_ptr<SearchScratch> scratch;
  SearchResult found;
  std::vector<int32_t> seed_ids;  // the previous step's results (swapped out of `found`), seeding this step's search
  // Queries of the pending tokens (LayerState::pending rows, oldest first):
  // each is inserted with its own query when the batch is inserted.
  std::vector<float> pending_queries;
  // Each kept query's best hits from its own decode-step search
  // ([window, kInsertHints] ids + a count per slot; 0 where the token was not
  // decoded here, e.g. prefill or a loaded file): its insertion reuses them
  // instead of searching again. Pending tokens carry theirs along.
  std::vector<int32_t> window_hints, window_hint_count;
  std::vector<int32_t> pending_hints, pending_hint_count;
  // No token has hits yet (after prefill or a load: hits are not saved).
  void clear_hints(int64_t window, int64_t pending) {
    window_hints.assign(size_t(window) * size_t(kInsertHints), 0);
    window_hint_count.assign(size_t(window), 0);
    pending_hints.assign(size_t(pending) * size_t(kInsertHints), 0);
    pending_hint_count.assign(size_t(pending), 0);
  }
  // Queries of inserted tokens kept for Sequence::refresh_indexes() (every
  // refresh stride-th indexed row, plan.refresh_sample; at most
  // kMaxRefreshQueries rows, the newest). Not saved.
  std::vector<float> refresh_queries;
  std::vector<float> retrieved_out;  // [d] partial result of the retrieved tokens
  float retrieved_lse = 0;
};

// A prompt handed over in chunks (Sequence::prefill_chunk) until
// prefill_end: each head's rows as given, in the chunks' dtype.
struct PromptChunks {
  DType dtype = DType::f32;
  int64_t tokens = 0;
  std::vector<std::vector<uint8_t>> q, k, v;  // [head] -> rows
};

struct LayerState {
  bool global = true;
  bool prefilled = false;
  int64_t sinks = 0;   // capacity
  int64_t window = 0;  // capacity
  int64_t tokens = 0;
  int64_t sinks_filled = 0;
  int64_t window_filled = 0;
  int64_t ring_head = 0;  // oldest window slot once the window is full
  // The last `pending` rows of every CPU store left the window but are not
  // in the indexes yet; decode attends to them exactly (like the static set)
  // until they are inserted as a batch (RuntimeConfig::insert_batch).
  int64_t pending = 0;
  std::vector<KvHeadState> kv;
  std::vector<QueryHeadState> q;  // empty for local layers
  // Static-set attention on the GPU (one stream per layer of a sequence);
  // null without a GPU: the CPU kernels run it.
  std::unique_ptr<GpuAttention> gpu;
  std::unique_ptr<PromptChunks> chunks;  // null: no chunked prefill in progress
  // A prefill_end_async() build runs on this layer. Read and written by the
  // sequence's caller thread only; the build thread never touches it.
  bool building = false;

  int64_t static_rows() const { return sinks_filled + window_filled; }
  int group() const { return kv.empty() ? 0 : int(q.size() / kv.size()); }
  // Whether query head h uses the index of its group's first head (one
  // graph per KV head: insert once per group, count and save it once).
  bool shares_index(size_t h) const {
    if (group() < 2 || h >= q.size()) return false;
    const size_t first = h / size_t(group()) * size_t(group());
    return h != first && q[h].index && q[h].index == q[first].index;
  }
  int64_t static_capacity() const { return sinks + window; }  // rows the static set holds when full
};

// Copies the static set of every KV head to the layer's GPU stream (when it
// has one), with room for sinks + window rows per head: after prefill and
// load. Decode steps then update one row per head in place.
void upload_static_set_to_gpu(LayerState& st, int head_dim, DType kv_storage);

// Gives each KV head of a global layer one set of traversal codes of its
// indexed rows (the CPU store less the pending tokens) and attaches it to
// its group's indexes, when the plan walks codes and the config shares them:
// after prefill and load (codes are never saved).
void share_traversal_codes(LayerState& st, const RuntimeConfig& config);

}  // namespace rattn::internal
