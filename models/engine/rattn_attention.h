#pragma once
// The engine's global-layer decode attention on rattn's public C API
// (include/rattn.h): static set (sinks + recent window) exactly, top-k
// retrieval over the offloaded tokens, natural-log LSE merge. Optionally
// measures, per decode step, the output error against dense attention over
// the engine's own cache and against the best any top-k retrieval could do
// (the same static set plus the exact top-k of the offloaded tokens).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/engine/gemma.h"
#include "rattn.h"

namespace rattn::engine {

struct RattnAttentionParams {
  std::string plan_path;  // a .ra plan whose layout is the model's ("" = explicit layout, runtime defaults)
  int sinks = -1, window = -1, top_k = -1, search_queue = -1;  // -1 keeps the plan's value
  int tail_samples = -1;  // sampled tail estimate (rattn_context_params.tail_samples); -1 keeps the plan's
  int search_seeds = -1;  // warm start of the decode searches (rattn_context_params.search_seeds); -1 keeps the plan's
  int insert_batch = -1;  // rattn_context_params.insert_batch; -1 keeps the runtime's default
  // Partial expansion of the decode searches (rattn_context_params); -1 keeps the plan's.
  int search_expand_first = -1, search_full_expand = -1;
  // The index build (rattn_context_params); -1 keeps the plan's.
  int graph_degree = -1, query_neighbors = -1;
  float build_sample = -1;
  // Per-layer decode searches (rattn_context_params.layer_search), by the
  // model's layer numbers; -1 fields keep the layer's value.
  std::vector<rattn_layer_search> layer_search;
  rattn_dtype kv_storage = RATTN_F16;
  rattn_index_kind index = RATTN_INDEX_GRAPH;
  rattn_kernels_kind kernels = RATTN_KERNELS_AUTO;
  int threads = 2;
  // A rattn_sequence_save file loaded instead of the prefill (its context
  // had the same layout, sinks, window and index build): "" prefills.
  std::string load_state;
};

// Global layers' post-RoPE prefill Q [H, T, d], K and V [HK, T, d], filled
// through the engine's prefill hook.
struct GlobalQkv {
  std::vector<int> layers;
  int H = 0, HK = 0, d = 0;
  int64_t T = 0;
  std::vector<std::vector<float>> q, k, v;
  void init(const GemmaConfig& c, int64_t tokens);
  size_t slot(int layer) const;
  GlobalQkvHook hook();
};

class RattnAttention : public GlobalAttentionBackend {
 public:
  // Hands the prompt (qkv) of every global layer to rattn. With `reference`
  // set, every decode step also computes the errors described above from
  // that sequence's cache (which must hold the same tokens).
  // With `overlap` set, nothing is handed over here: the engine calls
  // start_layer(L) once global layer L's prompt is complete in qkv (the
  // layer builds in the background) and finish_prefill() before decoding.
  RattnAttention(const GemmaConfig& cfg, const RattnAttentionParams& params, const GlobalQkv& qkv,
                 const GemmaSequence* reference, bool overlap = false);
  ~RattnAttention() override;
  RattnAttention(const RattnAttention&) = delete;
  RattnAttention& operator=(const RattnAttention&) = delete;

  // Hands global layer `layer`'s prompt to rattn and starts its build
  // (rattn_sequence_prefill_end_async); returns at once.
  void start_layer(int layer);
  // Waits for every started build (rattn_sequence_prefill_wait).
  void finish_prefill();
  // rattn_sequence_save: the prefilled state, for RattnAttentionParams::load_state.
  void save_state(const std::string& path) const;

  void decode(int layer, int64_t pos, const float* q, const float* k, const float* v, float* out) override;

  const rattn_context_info& info() const { return info_; }
  // Wall seconds spent in rattn_sequence_decode (rattn's whole step: static
  // set, retrieval, merge, insertion), summed over layers and steps.
  double decode_seconds() const { return decode_seconds_; }
  // The decode searches global layer `layer` (the model's number) runs with.
  rattn_layer_search layer_search(int layer) const;
  // What global layer `layer` retrieves per step: {top_k, tail_samples}.
  std::pair<int32_t, int32_t> layer_retrieval(int layer) const;
  const std::vector<int>& global_layers() const { return qkv_.layers; }
  // Per global layer (in qkv.layers order), one entry per decode step:
  // relative L2 error of rattn's output [H, d] against dense attention.
  const std::vector<std::vector<double>>& errors() const { return errors_; }
  // Same, for the static set plus the exact top-k offloaded tokens.
  const std::vector<std::vector<double>>& oracle_errors() const { return oracle_errors_; }
  // Decode queries per global layer, [steps, H, d] (unscaled, post-RoPE).
  const std::vector<std::vector<float>>& queries() const { return queries_; }
  // Layer ids handed to rattn (the model's own ids with a plan, else 0..n-1).
  int rattn_layer(size_t slot) const;

 private:
  std::vector<float> scaled_queries(size_t slot) const;  // qkv.q[slot] with the model's scale folded in
  // The context's number for global layer `layer` (the model's number):
  // itself with the model's layout, else its place among the global layers.
  int32_t context_layer(int layer) const;

  const GemmaConfig& cfg_;
  const GemmaSequence* reference_;
  const GlobalQkv& qkv_;
  bool model_layout_ = false;
  rattn_context* ctx_ = nullptr;
  rattn_sequence* seq_ = nullptr;
  rattn_context_info info_{};
  float q_scale_ = 1.0f;
  std::vector<std::vector<double>> errors_, oracle_errors_;
  double decode_seconds_ = 0;
  std::vector<std::vector<float>> queries_;
};

namespace internal {
// In float64, for `heads` query heads q [heads, d] sharing keys/values
// [pos + 1, d] (row stride `stride`), scores scale * <q, k_j>, j in [0, pos]:
// dense attention over every key (`full`, [heads, d]) and attention over the
// static set [0, sinks) u (pos - window, pos] plus each head's top_k
// offloaded keys by exact score (`oracle`, [heads, d]).
void attention_with_topk_oracle_f64(const float* q, int heads, int d, const float* k, const float* v,
                                    int64_t stride, int64_t pos, double scale, int64_t sinks, int64_t window,
                                    int64_t top_k, double* full, double* oracle);
}  // namespace internal

}  // namespace rattn::engine
