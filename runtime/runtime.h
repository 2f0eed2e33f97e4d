#pragma once
// The C++ core behind include/rattn.h: a Runtime (model layout, concrete plan,
// CPU kernels, worker threads; shared by sequences) and Sequences (per layer:
// the static set, the CPU store of offloaded K/V, and one index per query head).
//
// Data flow of one layer (see docs/runtime.md):
//   prefill: tokens [0, sinks) and the last `window` tokens -> static set;
//            the rest -> CPU store (one RowStore per KV head, shared by the
//            group's query heads); one index per query head over that store,
//            trained with the head's prefill queries, built in parallel.
//   decode:  append the new token to the static set; the token leaving the
//            window moves to the CPU store as a pending token (attended
//            exactly); once `insert_batch` tokens are pending they are
//            inserted into each index of their group with their own queries.
//            Then, in one parallel loop: per KV head, exact attention of the
//            whole query group over the static set (+ pending tokens) in one
//            kernel call; per query head, index search + attention over the
//            top-k. Partials are merged by natural-log log-sum-exp.
//            With plan.tail_samples > 0, per KV head a strided sample of the
//            offloaded tokens (pending excluded) is drawn once per step; each
//            query head attends to it less its own top-k, weights scaled to
//            stand for every unretrieved token (an estimate of the tail the
//            top-k leaves out), merged like the other partials.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "dsl/ir.h"
#include "kernels/cpu_kernels.h"
#include "kernels/kv_store.h"
#include "runtime/index/key_index.h"
#include "runtime/kernel_choice.h"
#include "runtime/thread_pool.h"

namespace rattn {

enum class IndexChoice : int { projected_graph = 0, exact = 1 };

struct RuntimeConfig {
  ModelLayout layout;
  ConcretePlan plan;
  DType kv_storage = DType::f16;
  IndexChoice index = IndexChoice::projected_graph;
  KernelPreference kernels = KernelPreference::automatic;
  // Tokens leaving the window enter their heads' indexes (false: they stay in
  // the CPU store unsearchable, as in the paper, which has no index update).
  bool insert_evicted = true;
  // Tokens leaving the window are inserted into the indexes in batches of
  // this many; until then they are pending and attended exactly (besides
  // the top-k). 1 = insert every step. Layers are
  // staggered (each inserts at its own token positions). 16: a batch's
  // inserts cost 0.53-0.86x as much per token as one at a time, with the same
  // recall (docs/performance.md, "The decode step").
  int insert_batch = 16;
  int threads = 0;  // 0 = hardware threads
  uint64_t seed = 1;
  // Static-set attention on the GPU when one is present (else, or when
  // false, the CPU kernels).
  bool use_gpu = true;
  // Index searches per work item of the decode step: that many query heads
  // of one GQA group are searched together (search_many(), which may overlap
  // their memory latency on one thread). 0 = automatic: the largest divisor
  // of the group that still gives every thread an item (searches_per_item()).
  int searches_per_item = 0;
  // With plan.traversal_codes: the query heads of a GQA group search one set
  // of 8-bit key codes per KV head (their keys are the same), updated by the
  // decode step before its searches, instead of one set per index (4x the
  // memory traffic at group 4). false: each index keeps its own (A/B only).
  bool share_traversal_codes = true;
  // Tests only: opens the static-set stream in place of the CUDA backend (a
  // stand-in that keeps its own copy of the set), so that the GPU path's
  // bookkeeping - full upload at prefill/load, one row per step - runs on a
  // machine without a GPU. Empty: the CUDA backend when a GPU is present.
  std::function<std::unique_ptr<GpuAttention>(const KernelSpec&)> gpu_factory;
};

// The automatic choice of RuntimeConfig::searches_per_item: the largest
// divisor s of `group` with kv_heads * group / s >= threads. Interleaved
// searches overlap memory latency only within one thread, while separate
// items spread over threads; so group as much as the thread count allows.
int searches_per_item(int group, int kv_heads, int threads);

// Where a decode step's time goes, summed over the steps since
// Sequence::set_profiling(true) and over threads (with one thread the parts
// add up to the step's wall time, less clock overhead).
struct DecodeProfile {
  int64_t steps = 0;
  double total_ms = 0;     // wall time of the whole decode() calls
  double prepare_ms = 0;   // conversion, ring update, eviction to the CPU store, GPU row upload
  double insert_ms = 0;    // index insertions (every query head)
  double search_ms = 0;    // index searches
  double retrieved_attention_ms = 0;  // partial attention over the top-k
  double static_ms = 0;    // static set (CPU kernels, or waiting for the GPU) + pending tokens
  double merge_ms = 0;     // log-sum-exp merges after the parallel loop
  double tail_ms = 0;      // tail estimate (plan.tail_samples): drawing the samples + their partials
  // What the step's parts touched, summed over the steps (bench decode's
  // roofline turns them into bytes, docs/performance.md):
  int64_t static_rows = 0;         // K/V rows the CPU kernels attended for the static set and pending tokens, per KV head
  int64_t keys_scored = 0;         // keys the searches scored, every query head
  int64_t retrieved_rows = 0;      // top-k rows the retrieved attention read (keys and values), every query head
  int64_t merged_partials = 0;     // (query head, partial) pairs merged into the output
  int64_t inserted = 0;            // rows inserted into an index, once per index (a shared graph: once per group)
  int64_t insert_keys_scored = -1; // keys those insertions scored (projected graphs; -1: not counted)
};

// Checks a config (positive head counts, group divisibility, plan ranges);
// throws Error(invalid_argument) naming the bad field.
void validate_config(const RuntimeConfig& config);

struct MemoryStats {
  uint64_t static_set_bytes = 0;
  uint64_t cpu_kv_bytes = 0;
  uint64_t index_bytes = 0;
  uint64_t query_ring_bytes = 0;
  uint64_t scratch_bytes = 0;
  int64_t cpu_tokens = 0;
  int64_t pending_tokens = 0;  // offloaded, not yet indexed (summed over layers and KV heads)
  bool static_set_on_gpu = false;  // static_set_bytes are (also) held in GPU memory
  uint64_t total() const {
    return static_set_bytes + cpu_kv_bytes + index_bytes + query_ring_bytes + scratch_bytes;
  }
};

class Runtime {
 public:
  explicit Runtime(RuntimeConfig config);
  const RuntimeConfig& config() const { return config_; }
  // config().plan.decode_search(layer), resolved once.
  const DecodeSearch& decode_search(int layer) const { return decode_searches_[size_t(layer)]; }
  // config().plan.layer_retrieval(layer), resolved once.
  const LayerRetrieval& layer_retrieval(int layer) const { return layer_retrievals_[size_t(layer)]; }
  // The largest tail_samples of any layer (0: no layer estimates its tail).
  int max_tail_samples() const;
  // Its SearchParams for k = 0 (the decode step sets k and lengthens the queue to it).
  const SearchParams& decode_search_params(int layer) const { return decode_search_params_[size_t(layer)]; }
  CpuKernels& kernels() const { return *kernels_; }
  const std::shared_ptr<CpuKernels>& shared_kernels() const { return kernels_; }
  const std::string& kernels_name() const { return kernels_name_; }
  ThreadPool& pool() const { return *pool_; }
  // Whether static-set attention runs on a GPU, and why not when it does not.
  bool gpu() const { return gpu_; }
  const std::string& gpu_status() const { return gpu_status_; }
  // A GPU static-set stream for one layer of one sequence, whose static set
  // holds up to `static_rows` rows per KV head; null without a GPU.
  std::unique_ptr<GpuAttention> open_gpu_stream(int64_t static_rows) const;
  // The GPU kernels' knobs: the plan's cuda.* ones, and a split count for
  // a static set of `static_rows` rows (static_set_splits) when the plan
  // names none. Sliding-window layers' sets differ from the global ones'.
  GpuAttentionOptions gpu_options(int64_t static_rows) const;

  // Gives a loaded graph index the plan's insert path (plan.insert_*; a
  // built one has it from build_index): the context decides how tokens are
  // inserted, not the file. No-op for an exact index.
  void apply_insert_params(KeyIndex& index) const;

  // Builds the index of one query head over `keys` with `threads` threads
  // (heads are built in parallel by the caller). Small stores get an exact index.
  // `layer`: its RoPE base turns the plan's shift_queries into rotated copies.
  std::unique_ptr<KeyIndex> build_index(int layer, const RowsView& keys, const float* train_queries,
                                        int64_t num_queries, uint64_t seed, int threads,
                                        const ProgressFn& progress) const;
  // refresh_projected_graph() with the layer's build parameters; no-op for
  // an exact index.
  void refresh_index(int layer, KeyIndex& index, const RowsView& keys, const float* queries, int64_t num_queries,
                     int threads) const;

 private:
  RuntimeConfig config_;
  std::vector<DecodeSearch> decode_searches_;        // per layer
  std::vector<LayerRetrieval> layer_retrievals_;     // per layer
  std::vector<SearchParams> decode_search_params_;  // per layer, k = 0
  std::shared_ptr<CpuKernels> kernels_;
  std::shared_ptr<CpuKernels> index_kernels_;  // null: the index's own inner products
  std::string kernels_name_;
  std::unique_ptr<ThreadPool> pool_;
  bool gpu_ = false;
  std::string gpu_status_;
};

struct GraphBuildParams;

namespace internal {
struct LayerState;
struct PromptChunks;
class ImageSink;  // where Sequence::write_image goes (runtime/sequence_file.cpp)
// The projected-graph build and insert parameters of `plan`, as the runtime
// builds its indexes (threads and seed left at their defaults); tools that
// build an index outside a runtime (rattn eval) use the same mapping.
GraphBuildParams graph_build_params(const ConcretePlan& plan);
// The same for one layer of `layout`: the RoPE (base, pairing) the
// RoPE-shifted training queries (plan.shift_queries) are rotated with.
GraphBuildParams graph_build_params(const ConcretePlan& plan, const ModelLayout& layout, int layer);
// The search parameters of a decode search `s` under `plan` for the best k:
// queue (at least k), traversal codes, patience, partial expansion; the
// seeds are the caller's. One definition for the decode step, `rattn tune`
// and `rattn eval`, so that what they measure is what decode runs.
SearchParams decode_search_params(const ConcretePlan& plan, const DecodeSearch& s, int k);

// The tail sample of one decode step (plan.tail_samples): min(samples, rows)
// distinct rows of [0, rows), ascending. A strided sample with a random
// offset: row floor(u + i * rows / samples), u uniform in [0, rows / samples),
// so every row is drawn with probability samples / rows; every row when
// samples >= rows. u depends only on (seed, layer, kv_head, position), so
// runs are reproducible and no RNG state is shared. The decode step passes
// RuntimeConfig::seed, the layer, the KV head and the new token's position
// (the tokens the layer held before the step).
void draw_tail_sample(uint64_t seed, int layer, int kv_head, int64_t position, int64_t rows, int64_t samples,
                      std::vector<int32_t>& ids);

// Tail estimate of a query head: `sample` (ascending rows of the `rows`
// offloaded tokens) less the head's top-k ids gives S'. A row of S' that
// scores above the weakest retrieved score (unscaled inner products; no
// scores: none) is one the search missed: it counts once, like a retrieved
// row, instead of standing for (rows - |retrieved|) / |S'| others - one such
// hit scaled ~30x (4K samples of 128K rows) would otherwise swing the output
// (real Gemma-3 layers at 32K: perplexity +4% with 1024 samples at recall
// 0.4-0.9). The other rows B (all weaker than the top-k) are scaled to stand
// for the unretrieved rows not seen above: out/lse = LSE merge of the partial
// over the rows above and the partial over B with lse shifted by
// log((rows - |retrieved| - |above|) / |B|) (natural log). Nothing left gives
// out = 0, lse = -inf.
//
// It runs for `heads` query heads sharing one sample (a KV head's group;
// `heads` is 1 or the kernels' group size), in pieces: tail_piece takes the
// sample's rows [0, n) of one piece (a slice of the ascending sample) and
// hits[g] (head g's top-k); tail_finish merges the pieces of the whole sample
// into out [heads, d] and lse [heads]. The group's K/V rows are read once:
// one gathered_dot and one partial_attention of all heads over the rows below
// every head's top-k, plus small per-head partials over the rest. The pieces
// let several threads share one group's sample; the result does not depend
// on how the sample is cut, up to float rounding.
struct TailPiece;  // runtime/layer_state.h
struct TailHits;  // runtime/layer_state.h: one head's top-k ids, scores (may be null) and count
void tail_piece(CpuKernels& kernels, const float* queries, int heads, const RowsView& keys, const RowsView& values,
                const int32_t* sample, int n, const TailHits* hits, TailPiece& piece);
void tail_finish(const TailPiece* pieces, int n_pieces, int heads, int d, int64_t rows, const TailHits* hits,
                 float* out, float* lse);
}

class Sequence {
 public:
  explicit Sequence(std::shared_ptr<const Runtime> runtime);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  const Runtime& runtime() const { return *runtime_; }

  // q: [Hq, n, d], k/v: [Hkv, n, d] in `dtype`. Once per layer.
  void prefill(int layer, int64_t n, const void* q, const void* k, const void* v, DType dtype,
               const ProgressFn& progress = nullptr);
  // The same prompt in chunks, as an engine computes it (a micro-batch of
  // tokens through every layer at a time): chunk i's q [Hq, n_i, d] and
  // k/v [Hkv, n_i, d], all in one dtype, are kept until prefill_end(), which
  // runs prefill() over their concatenation (the same result, bit for bit).
  void prefill_chunk(int layer, int64_t n, const void* q, const void* k, const void* v, DType dtype);
  void prefill_end(int layer, const ProgressFn& progress = nullptr);
  // prefill_end() on a background thread, so that an engine computes its
  // next layers while this layer's store and indexes build (the same result,
  // bit for bit). Returns once the call is checked and the build started.
  // Until prefill_wait() the layer is refused by every call and reads as not
  // prefilled; save, clone, memory and refresh are refused for the sequence.
  void prefill_end_async(int layer, const ProgressFn& progress = nullptr);
  // Waits for every prefill_end_async() build. Each layer that built is
  // prefilled; a layer whose build failed is as before its first chunk, and
  // the first failure (in start order) is rethrown once all have finished.
  // Nothing to wait for: returns at once.
  void prefill_wait();
  int builds_in_flight() const { return int(builds_.size()); }
  // q: [Hq, d], k/v: [Hkv, d]; out [Hq, d] fp32, lse [Hq] (natural log) or null.
  void decode(int layer, const void* q, const void* k, const void* v, DType dtype, float* out,
              float* lse);
  // One decode step of `n` distinct sequences of one runtime, the same layer:
  // their work items share one parallel loop (threads one sequence's few
  // items leave idle take another's; every GPU static set is queued before
  // any CPU work). Each sequence's out/lse equal its own decode() call's.
  // Arrays of n; lse, or an entry of it, may be null. Every argument is
  // checked before any sequence changes.
  static void decode_batch(Sequence* const* seqs, int n, int layer, const void* const* q, const void* const* k,
                           const void* const* v, DType dtype, float* const* out, float* const* lse);
  // Decode-step time breakdown (benchmarks): set_profiling(true) clears and
  // starts it; a few clock reads per work item when on, nothing when off.
  void set_profiling(bool on);
  DecodeProfile profile() const;
  int64_t tokens(int layer) const;
  bool prefilled(int layer) const;
  MemoryStats memory() const;
  // Refreshes every index with the queries its inserted tokens kept
  // (plan.refresh_sample; refresh_projected_graph: exact top-Nq lists over
  // the offloaded keys, RoPE-shifted copies per plan.shift_queries, the
  // build's repair pass), then forgets them. Costly (an exact GEMM per kept
  // query and copy): for idle time, never concurrently with decode() of this
  // sequence. Returns the kept queries used, summed over query heads.
  int64_t refresh_indexes();

  // Versioned, checksummed image of every prefilled layer (runtime/sequence_file.cpp).
  void save(const std::string& path) const;
  static std::unique_ptr<Sequence> load(std::shared_ptr<const Runtime> runtime,
                                        const std::string& path);
  // An independent copy on the same runtime (the image save writes, through
  // memory): it decodes as this sequence would, and the two then diverge
  // with their own tokens (parallel sampling, beam search).
  std::unique_ptr<Sequence> clone() const;

 private:
  internal::LayerState& layer_state(int layer, const char* what);
  // layer_state() of a layer that holds a non-empty chunked prompt.
  internal::LayerState& layer_with_chunks(int layer, const char* what);
  void check_savable(const char* what) const;  // no chunked prefill or background build in progress
  void check_no_builds(const char* what) const;  // no prefill_end_async() build in flight
  // A layer as before any prefill (construction, a failed prefill).
  std::unique_ptr<internal::LayerState> fresh_layer(int layer) const;
  // prefill_heads() over a chunked prompt; a failure resets the layer.
  void prefill_chunks(int layer, const internal::PromptChunks& pc, const ProgressFn& progress);
  // prefill() after its checks, on each head's rows: q[h] [n, d] per query
  // head, k[h] and v[h] per KV head (the packed prompt, or a prompt's chunks).
  void prefill_heads(int layer, int64_t n, const void* const* q, const void* const* k, const void* const* v,
                     DType dtype, const ProgressFn& progress);
  void write_image(internal::ImageSink& sink) const;
  static std::unique_ptr<Sequence> load_image(std::shared_ptr<const Runtime> runtime, std::string_view image,
                                              const std::string& name);
  // A decode step in three parts, so that decode_batch() can run several
  // sequences' items in one loop: the checks (nothing changes), the work
  // before the loop (the step's state, in step_), one work item, the merges.
  struct PendingStep;
  void check_decode(int layer, const void* q, const void* k, const void* v, DType dtype, const float* out);
  void begin_decode(int layer, const void* q, const void* k, const void* v, DType dtype, float* out, float* lse);
  void run_decode_item(int64_t item);
  void run_tail_item(int64_t item);  // one piece of a KV head's tail estimate, after the searches
  void end_decode();

  std::shared_ptr<const Runtime> runtime_;
  std::vector<std::unique_ptr<internal::LayerState>> layers_;
  // Decode-step scratch, sized once: queries as fp32, one K/V row, and the
  // pending tokens' partial result [Hq, d] + [Hq].
  std::vector<float> q_f32_;
  std::vector<float> lse_scratch_;
  std::vector<float> row_f32_;
  std::vector<float> pending_out_;
  std::vector<float> pending_lse_;
  std::vector<internal::TailPiece> tail_pieces_;  // [KV head, piece] of the step's tail estimate
  std::vector<float> tail_out_, tail_lse_;  // tail estimates [Hq, d] + [Hq] (plan.tail_samples)
  std::vector<const void*> gpu_key_rows_, gpu_value_rows_;  // the new token's rows, per KV head
  std::vector<SearchJob> search_jobs_;                     // one per query head
  bool profiling_ = false;
  std::unique_ptr<std::atomic<int64_t>[]> profile_ns_;  // DecodeProfile's parts, in ns
  std::unique_ptr<PendingStep> step_;                   // the decode step in progress
  struct Build;                                         // one prefill_end_async() in flight
  std::vector<std::unique_ptr<Build>> builds_;          // in start order
};

}  // namespace rattn
