// rattn inside llama.cpp: the attention of the layers a rattn plan offloads
// (a Gemma-3 model's global layers) computed through include/rattn.h.
//
// Switched on by the environment: RATTN_PLAN=FILE.ra. Then
//   - prefill (a batch of several tokens starting at position 0, or continuing
//     a prompt before its first decode step): llama.cpp's own attention, and
//     each offloaded layer's post-RoPE Q, K and V are handed to rattn in chunks;
//   - every later token of those layers is one rattn decode step (static set
//     + index top-k + merge); rattn inserts the token;
//   - sliding-window layers stay llama.cpp's.
// The library is loaded at run time (RATTN_LIBRARY, else librattn.so.1 on the
// loader's path, else the build's own copy), so that llama.cpp without
// RATTN_PLAN never needs it. Other variables: RATTN_THREADS (rattn's worker
// threads; default llama.cpp's), RATTN_PREFILL_TOKENS=N (a micro-batch
// holding any position >= N is decoded one token at a time through rattn,
// all of it: teacher-forced evaluation with llama-perplexity; N a multiple of
// the micro-batch size makes the switch exactly at position N),
// RATTN_QUERY_PRECISION=f16|f32 (queries rounded as llama.cpp's attention
// rounds them: the K cache's dtype by default). K/V are stored in the K
// cache's dtype: f32 for an f32 cache, else f16.
#pragma once

#include <cstdint>

#include "ggml.h"

struct ggml_tensor;
struct llama_model;
struct llama_cparams;
struct llm_graph_context;
class llm_graph_input_attn_kv_iswa;

// RATTN_PLAN is set.
bool rattn_llama_requested();

// Loads the library and the plan and checks them against the model and the
// context's parameters; throws std::runtime_error with a clear message.
// No-op without RATTN_PLAN.
// `cache_type`: llama.cpp's K cache dtype, which rattn's storage follows.
// `owner` (the llama_context) frees it.
void rattn_llama_context_init(const llama_model & model, const llama_cparams & cparams, ggml_type cache_type,
                              const void * owner);
void rattn_llama_context_free(const void * owner);

// Layer il's attention runs through rattn.
bool rattn_llama_offloads(int il);

// Layer il's attention output projected by wo (see the file comment for the
// two modes). q: [d, n_head, n_tokens] scaled by kq_scale for llama.cpp's
// attention; k, v: [d, n_head_kv, n_tokens]; pos: the positions input.
ggml_tensor * rattn_llama_build_attn(const llm_graph_context & g, llm_graph_input_attn_kv_iswa * inp,
                                     ggml_tensor * wo, ggml_tensor * wo_s, ggml_tensor * q, ggml_tensor * k,
                                     ggml_tensor * v, ggml_tensor * pos, float kq_scale, int il);

// KV-cache operations on sequence seq_id over positions [p0, p1) (negative:
// open). seq_rm returns false when it would remove tokens rattn holds (the
// caller then clears the sequence, which is supported); the others stop the
// program with a message where rattn cannot follow them.
bool rattn_llama_seq_rm(int32_t seq_id, int32_t p0, int32_t p1);
void rattn_llama_seq_cp(int32_t seq_src, int32_t seq_dst);
void rattn_llama_seq_add(int32_t seq_id, int32_t p0, int32_t p1, int32_t delta);
void rattn_llama_seq_div(int32_t seq_id, int32_t p0, int32_t p1, int d);

// Restoring a saved state (llama_state_set_data, llama_state_seq_set_data*,
// llama_state_seq_load_file) is refused: the saved state does not hold
// rattn's. Logs why and returns false.
bool rattn_llama_state_load_allowed();
