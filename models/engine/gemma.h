#pragma once
// Gemma-3 forward pass over GGUF weights: batched prefill (chunks of tokens
// through matrix products, blockwise attention) and single-token decode with a
// KV cache. Every hyper-parameter is read from the file's `gemma3.*` metadata.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/engine/gguf.h"
#include "models/engine/tokenizer.h"

namespace rattn::engine {

struct GemmaConfig {
  int n_layer = 0, d_model = 0, n_head = 0, n_kv_head = 0, head_dim = 0, d_ff = 0;
  int64_t vocab = 0, context = 0;
  int window = 0;          // sliding-window length (keys a query may see, itself included)
  int global_every = 6;    // layers (i+1) % global_every == 0 are global
  float eps = 1e-6f;
  float rope_base_global = 1e6f, rope_base_local = 1e4f;
  float attn_scale = 0.0625f;
  bool norm_plus_one = false;  // true: the runtime multiplies by (1 + w)
  bool is_global(int layer) const { return (layer + 1) % global_every == 0; }
  std::vector<int> global_layers() const;
};

// Decode-time attention of the global layers, pluggable: the engine computes
// dense attention itself when no backend is set. q: [n_head, d] (post-RoPE),
// k, v: [n_kv_head, d] of the new token at position `pos` (already in the
// engine's cache); out: [n_head, d].
class GlobalAttentionBackend {
 public:
  virtual ~GlobalAttentionBackend() = default;
  virtual void decode(int layer, int64_t pos, const float* q, const float* k, const float* v, float* out) = 0;
};

// Receives the post-RoPE queries [n, n_head, d], keys and values
// [n, n_kv_head, d] of each global layer for prefill tokens [pos0, pos0 + n).
using GlobalQkvHook = std::function<void(int layer, int64_t pos0, int64_t n, const float* q,
                                         const float* k, const float* v)>;

struct LayerWeights {
  std::vector<float> wq, wk, wv, wo, gate, up, down;  // [out, in] rows
  std::vector<float> attn_norm, post_attn_norm, ffn_norm, post_ffw_norm, q_norm, k_norm;
};

class GemmaModel {
 public:
  // Loads the model: dequantises layer weights to f32 once; the embedding
  // table stays quantised (rows are dequantised on demand).
  static std::unique_ptr<GemmaModel> load(const std::string& gguf_path);
  const GemmaConfig& config() const { return cfg_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const GgufFile& file() const { return *file_; }
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  const std::vector<float>& output_norm() const { return output_norm_; }
  // Embedding rows (dequantised, not yet scaled by sqrt(d_model)).
  void embedding_rows(const int32_t* ids, int64_t n, float* out) const;
  // logits[n, vocab] = x[n, d_model] x E^T (tied head), blockwise over the vocabulary.
  void output_head(const float* x, int64_t n, float* logits) const;

 private:
  GemmaModel() = default;
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  GemmaConfig cfg_;
  std::vector<LayerWeights> layers_;
  std::vector<float> output_norm_;
  const GgufTensor* embd_ = nullptr;
};

// One sequence: its KV cache and the forward pass.
class GemmaSequence {
 public:
  GemmaSequence(const GemmaModel& model, int64_t max_tokens);
  int64_t length() const { return len_; }
  // Truncates the cache to the first n tokens (to branch from a shared prefix).
  void truncate(int64_t n);
  // Runs tokens through the model at positions [length(), length() + n) in
  // chunks of `chunk`; returns the final-normed hidden states of the rows
  // listed in `keep_rows` (indices into tokens) as [keep_rows.size(), d_model].
  // With `layer_done` set, every token goes through a layer before the next
  // layer (the same result, bit for bit) and layer_done(L) runs once layer L
  // is complete (its cache and its hook calls), e.g. to start that layer's
  // index build while the later layers compute.
  std::vector<float> prefill(const std::vector<int32_t>& tokens, const std::vector<int64_t>& keep_rows,
                             int64_t chunk = 512, const GlobalQkvHook& hook = nullptr,
                             const std::function<void(int64_t done)>& progress = nullptr,
                             const std::function<void(int layer)>& layer_done = nullptr);
  // One token; global layers go through `backend` when set. Returns logits [vocab].
  std::vector<float> decode(int32_t token, GlobalAttentionBackend* backend = nullptr);
  // Dense attention over this sequence's cache for layer `layer`, one query
  // position `pos` (keys [lo, pos]): the full-attention reference.
  void dense_attention_one(int layer, int64_t pos, const float* q, float* out) const;
  const float* keys(int layer) const { return k_[size_t(layer)].data(); }
  const float* values(int layer) const { return v_[size_t(layer)].data(); }

 private:
  struct ChunkScratch;
  // The scaled embeddings [n, d_model] of n tokens to append; throws when they
  // would exceed the capacity.
  std::vector<float> embed_next(const int32_t* tokens, int64_t n) const;
  void forward_chunk(const int32_t* tokens, int64_t n, float* x_out, const GlobalQkvHook& hook,
                     GlobalAttentionBackend* backend);
  // Layer li on n hidden states xs [n, d_model] at positions [pos0, pos0 + n), in place.
  void layer_forward(int li, int64_t pos0, int64_t n, float* xs, ChunkScratch& sc, const GlobalQkvHook& hook,
                     GlobalAttentionBackend* backend);
  const GemmaModel& m_;
  int64_t cap_, len_ = 0;
  std::vector<std::vector<float>> k_, v_;  // per layer [cap, n_kv_head, d]
};

namespace internal {
// y = x * w / rms(x) over rows of length n (w already includes any +1).
void rms_norm_rows(const float* x, const float* w, float* y, int64_t rows, int n, float eps);
// Rotate-half ("NEOX") RoPE on `rows` vectors of dimension d at positions pos0 + r / heads_per_pos.
void rope_neox(float* x, int64_t n_pos, int heads, int d, int64_t pos0, float base);
float gelu_tanh(float x);
// Causal attention for queries at positions [q0, q0 + nq) of one GQA group
// (`heads` query heads sharing one KV head). q: [nq, heads, d] with row stride
// q_stride per position; keys/values [pos, d] with row stride kv_stride;
// out [nq, heads, d] with row stride out_stride. A key j is visible to the
// query at p if j <= p and (window <= 0 or p - j < window).
void causal_attention(const float* q, int64_t q_stride, int64_t nq, int heads, int d, int64_t q0,
                      const float* k, const float* v, int64_t kv_stride, int window, float scale,
                      float* out, int64_t out_stride);
}  // namespace internal

}  // namespace rattn::engine
