/* rattn.h - the C API of the rattn runtime (RetrievalAttention decoding).
 *
 * An inference engine embeds rattn like this:
 *   1. rattn_context_create(): a context from a plan (a .ra DSL file, DSL text,
 *      or an explicit head layout) - the model's attention layout plus the
 *      retrieval plan (sinks, window, top-k, index parameters).
 *   2. rattn_sequence_create(): one sequence per generation stream.
 *   3. rattn_sequence_prefill(): once per layer, the prompt's Q, K and V. The
 *      runtime keeps the static set (the first `sinks` tokens plus the last
 *      `window` tokens) for exact attention, moves every other token's K/V to
 *      the CPU store, and builds one index per query head (global layers).
 *   4. rattn_sequence_decode(): once per layer per generated token, with that
 *      token's q, k and v. The new k/v are appended first (the token attends to
 *      itself), the token that leaves the window moves to the CPU store and is
 *      inserted into every index of its group (in batches of insert_batch;
 *      until then it is attended exactly), then each query head attends to
 *      the static set exactly and to its top-k retrieved tokens, and the
 *      partial results are merged. The output is the attention output [Hq, d].
 *
 * Conventions
 *   - Every function that can fail returns rattn_status. On failure the
 *     message is available from rattn_context_last_error(ctx) on the same
 *     thread (or rattn_context_last_error(NULL) for calls without a context).
 *     No C++ exception ever crosses this API.
 *   - Layouts are dense, row-major (C order):
 *       prefill K, V: [n_kv_heads, n_tokens, head_dim]
 *       prefill Q:    [n_q_heads,  n_tokens, head_dim]
 *       decode  k, v: [n_kv_heads, head_dim]
 *       decode  q:    [n_q_heads,  head_dim]
 *       decode  out:  [n_q_heads,  head_dim] fp32;  lse: [n_q_heads] fp32
 *     Query head h belongs to KV head h / (n_q_heads / n_kv_heads) (GQA).
 *   - Inputs may be fp32, fp16 or bf16 (rattn_dtype); K/V are stored in the
 *     context's kv storage dtype. Arithmetic is fp32.
 *   - Scores are s_i = <q, k_i> / sqrt(head_dim). The log-sum-exp `lse`
 *     returned by decode uses the NATURAL logarithm:
 *     lse = ln(sum_i exp(s_i)). Never mix it with base-2 values.
 *   - Queries are expected after RoPE (as the attention kernel sees them).
 *   - Threads: a context may be shared by many threads. Different sequences
 *     may be used from different threads at once; one sequence must not be
 *     used by two threads at the same time.
 */
#ifndef RATTN_H
#define RATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version: bumped whenever a public struct's layout or a function's
 * signature changes. The library's soname is librattn.so.<RATTN_ABI_VERSION>
 * (CMake reads it from here); tests/runtime/abi_test.cpp pins the layout. */
#define RATTN_ABI_VERSION 1

#if defined(__GNUC__)
#define RATTN_API __attribute__((visibility("default")))
#else
#define RATTN_API
#endif

typedef enum rattn_status {
  RATTN_OK = 0,
  RATTN_INVALID_ARGUMENT = 1, /* bad argument, wrong shape, null pointer, wrong call order */
  RATTN_PARSE_ERROR = 2,      /* malformed plan (DSL) text */
  RATTN_IO_ERROR = 3,         /* a file could not be read or written */
  RATTN_CORRUPT_DATA = 4,     /* truncated file, bad checksum, bad magic, wrong version */
  RATTN_UNSUPPORTED = 5,      /* a valid request this build cannot serve */
  RATTN_NOT_FOUND = 6,
  RATTN_INTERNAL = 7,
  RATTN_OUT_OF_MEMORY = 8
} rattn_status;

/* A short English name of a status ("ok", "invalid argument", ...). Never NULL. */
RATTN_API const char* rattn_status_string(rattn_status status);

/* Version of the library, "major.minor.patch". */
RATTN_API const char* rattn_version(void);

typedef enum rattn_dtype { RATTN_F32 = 0, RATTN_F16 = 1, RATTN_BF16 = 2 } rattn_dtype;

typedef enum rattn_index_kind {
  RATTN_INDEX_GRAPH = 0, /* attention-aware projected graph (the default) */
  RATTN_INDEX_EXACT = 1  /* exact scan of every offloaded key (oracle, small contexts) */
} rattn_index_kind;

typedef enum rattn_kernels_kind {
  RATTN_KERNELS_AUTO = 0,      /* Halide-generated kernels (compiled for this CPU on first use,
                                  cached on disk), else the reference loops */
  RATTN_KERNELS_REFERENCE = 1, /* plain scalar loops: no compile at start, slow steps */
  RATTN_KERNELS_HALIDE = 2     /* Halide-generated kernels, or RATTN_UNSUPPORTED */
} rattn_kernels_kind;

typedef enum rattn_log_level {
  RATTN_LOG_DEBUG = 0,
  RATTN_LOG_INFO = 1,
  RATTN_LOG_WARN = 2,
  RATTN_LOG_ERROR = 3
} rattn_log_level;

/* Receives every log line (no trailing newline). May be called from worker
 * threads, one call at a time. NULL restores the default (stderr, WARN and up). */
typedef void (*rattn_log_callback)(rattn_log_level level, const char* text, void* user_data);
RATTN_API void rattn_log_set(rattn_log_callback callback, void* user_data);

/* Progress of long work (index builds in prefill), in [0, 1], non-decreasing
 * per call of rattn_sequence_prefill. Called one at a time, possibly from
 * worker threads; it must not call back into rattn. */
typedef void (*rattn_progress_callback)(float progress, void* user_data);

typedef struct rattn_context rattn_context;
typedef struct rattn_sequence rattn_sequence;

/* One global layer's decode searches (rattn_context_params.layer_search):
 * -1 keeps the value the layer has otherwise (its `layer N { ... }` block in
 * the plan, or the plan-wide one). Layers can trade recall for keys scored
 * differently (docs/runtime.md, "Per-layer decode searches"). */
typedef struct rattn_layer_search {
  int32_t layer;               /* a global layer */
  int32_t search_queue;        /* see rattn_context_params */
  int32_t search_seeds;
  int32_t search_expand_first;
  int32_t search_full_expand;
} rattn_layer_search;

/* How a context is built: start from rattn_context_default_params() and change
 * what you need. The model layout and plan come from, in order: plan_text,
 * plan_path, the plan embedded in a deployable library (`rattn emit --target
 * library`, docs/deploy.md) when the explicit layout fields are all unset, or
 * the explicit layout fields (every layer then global). A field
 * with a "plan default" overrides the plan when >= 0; -1 (its default) keeps
 * the plan's value, or the plan default when the plan names none. Fields
 * marked [EXPERIMENTAL] are off by default and may change or go. */
typedef struct rattn_context_params {
  /* The model and its plan. */
  const char* plan_path; /* a .ra file, or NULL */
  const char* plan_text; /* .ra text, or NULL (read before plan_path) */
  int32_t n_layers;      /* explicit layout without a plan: all four must then be > 0 */
  int32_t n_q_heads;
  int32_t n_kv_heads;
  int32_t head_dim;

  /* The static set: attended exactly, on the GPU when there is one. */
  int32_t sinks;          /* first tokens kept (plan default 128) */
  int32_t window;         /* last tokens kept (plan default 512) */
  rattn_dtype kv_storage; /* dtype K/V are stored in (default RATTN_F16) */
  bool use_gpu;           /* the static set on a GPU when present (default true; rattn_context_info.gpu) */

  /* Retrieval from the CPU store. The tail estimate (plan default 0: off) adds
   * the attention the top-k leaves out (docs/runtime.md, "Tail estimation"). */
  int32_t top_k;               /* keys retrieved per query head (plan default 100; 0: static set only) */
  rattn_index_kind index_kind; /* default RATTN_INDEX_GRAPH */
  int32_t tail_samples;        /* [EXPERIMENTAL] tokens sampled per KV head and step to estimate the rest */

  /* Index build, in prefill. */
  int32_t graph_degree;    /* out-edges per key (plan default 32) */
  int32_t query_neighbors; /* exact neighbours per training query (plan default 100) */
  float build_sample;      /* share of prefill queries that train the index, (0, 1] (plan default 1) */
  uint64_t seed;           /* seeds the build's sampling and the tail estimate's (default 1) */

  /* Index insertion, in decode. refresh_sample: plan default 0 (off). */
  bool insert_evicted;  /* tokens leaving the window enter the indexes (default true; false: as the paper) */
  int32_t insert_batch; /* pending tokens inserted at once, [1, 65536] (default 16); attended exactly until then */
  float refresh_sample; /* [EXPERIMENTAL] share of inserted tokens' queries kept for rattn_sequence_refresh */

  /* Decode searches. Partial expansion (search_expand_first, search_full_expand;
   * plan default 0: off) scores fewer keys, at some cost in perplexity (docs/index.md). */
  int32_t search_queue;        /* candidate queue length (plan default 160) */
  int32_t search_seeds;        /* previous step's results seeding each search (plan default 100; 0: off) */
  int32_t search_expand_first; /* [EXPERIMENTAL] neighbours scored by a candidate ranked below ... (0: all) */
  int32_t search_full_expand;  /* [EXPERIMENTAL] ... this rank of the queue; the best score whole lists */
  const rattn_layer_search* layer_search; /* per-layer values applied over the above, or NULL */
  int32_t n_layer_search;                 /* entries in layer_search */

  /* Threads, kernels and progress. */
  int32_t n_threads;          /* worker threads; 0 = all hardware threads */
  rattn_kernels_kind kernels; /* CPU kernels (default RATTN_KERNELS_AUTO) */
  rattn_progress_callback progress_callback; /* index-build progress, or NULL */
  void* progress_user_data;
} rattn_context_params;

RATTN_API rattn_context_params rattn_context_default_params(void);

/* Creates a context. On failure *out is NULL and the message is available
 * from rattn_context_last_error(NULL) on this thread. */
RATTN_API rattn_status rattn_context_create(const rattn_context_params* params, rattn_context** out);
RATTN_API void rattn_context_free(rattn_context* ctx); /* NULL is a no-op; free sequences first */

/* The message of the last failed call on `ctx` (or on one of its sequences)
 * made by the calling thread; "" if none. With ctx == NULL: the calling
 * thread's last failure of any call. Valid until that thread's next failure. */
RATTN_API const char* rattn_context_last_error(const rattn_context* ctx);

/* What a context was built with (after plan overrides). */
typedef struct rattn_context_info {
  int32_t n_layers;
  int32_t n_global_layers;
  int32_t n_q_heads;
  int32_t n_kv_heads;
  int32_t head_dim;
  int32_t sinks;
  int32_t window;
  int32_t top_k;
  int32_t search_queue;
  int32_t graph_degree;
  int32_t query_neighbors;
  float build_sample;
  rattn_dtype kv_storage;
  rattn_index_kind index_kind;
  int32_t n_threads;
  bool gpu;                 /* static-set attention runs on a GPU (else the CPU fallback) */
  const char* cpu_kernels;  /* name of the CPU kernel implementation: "reference", "halide", or
                               "halide embedded:<set> (<target>)" in a deployable library */
  int32_t insert_batch;
  const char* gpu_status;   /* why the static set runs where it does, e.g. "no GPU (...)" */
  int32_t tail_samples;     /* sampled tail estimate per KV head and step (0: off) */
  int32_t search_seeds;     /* previous-step results seeding each decode search (0: off) */
  float refresh_sample;     /* share of inserted tokens' queries kept for rattn_sequence_refresh (0: off) */
  int32_t search_expand_first; /* partial expansion: first neighbours per candidate (0: whole lists) */
  int32_t search_full_expand;  /* partial expansion: candidates getting whole lists (0: all) */
} rattn_context_info;
RATTN_API rattn_status rattn_context_get_info(const rattn_context* ctx, rattn_context_info* out);
/* The decode searches layer `layer` (a global layer) runs with: every field
 * resolved (none is -1). rattn_context_info holds the plan-wide values. */
RATTN_API rattn_status rattn_context_get_layer_search(const rattn_context* ctx, int32_t layer,
                                                      rattn_layer_search* out);
/* What layer `layer` (a global layer) retrieves per decode step: its top_k and
 * tail_samples, the plan's `layer N { ... }` values where it has them, else
 * the plan-wide ones (rattn_context_params.top_k / tail_samples, when set,
 * hold for every layer). */
RATTN_API rattn_status rattn_context_get_layer_retrieval(const rattn_context* ctx, int32_t layer, int32_t* top_k,
                                                         int32_t* tail_samples);

/* Sequences. A sequence holds, per layer, the static set, the CPU store of
 * offloaded K/V and the indexes. */
RATTN_API rattn_status rattn_sequence_create(rattn_context* ctx, rattn_sequence** out);
RATTN_API void rattn_sequence_free(rattn_sequence* seq); /* NULL is a no-op */

/* Hands over layer `layer`'s prompt: n_tokens >= 1, layouts above. Called
 * once per layer, before any decode of that layer. Builds the indexes of the
 * layer's query heads in parallel, reporting progress. */
RATTN_API rattn_status rattn_sequence_prefill(rattn_sequence* seq, int32_t layer, int64_t n_tokens,
                                              const void* q, const void* k, const void* v,
                                              rattn_dtype dtype);

/* The same prompt in chunks, as an engine computes it (a micro-batch of
 * tokens through every layer at a time): each call hands over the next
 * n_tokens >= 1 of layer `layer`'s prompt, q [n_q_heads, n_tokens, d] and
 * k, v [n_kv_heads, n_tokens, d], all chunks of a layer in one dtype; rattn
 * keeps them (the engine may reuse its buffers at once). rattn_sequence_prefill_end
 * then prefills the layer with their concatenation - the same result as one
 * rattn_sequence_prefill of the whole prompt - and frees them. Until then the
 * layer can neither decode nor be saved. */
RATTN_API rattn_status rattn_sequence_prefill_chunk(rattn_sequence* seq, int32_t layer, int64_t n_tokens,
                                                    const void* q, const void* k, const void* v,
                                                    rattn_dtype dtype);
RATTN_API rattn_status rattn_sequence_prefill_end(rattn_sequence* seq, int32_t layer);

/* rattn_sequence_prefill_end without waiting: checks the call, starts the
 * layer's prefill (its store and index build, the same result bit for bit)
 * on a background thread using the context's worker threads, and returns,
 * so that the engine computes its next layers meanwhile. An engine that
 * computes the prompt layer by layer (every token through layer L before
 * layer L + 1) calls it once the last chunk of a global layer is handed
 * over; a micro-batch engine overlaps only what follows the last chunk.
 * Until rattn_sequence_prefill_wait, the layer is refused by every call
 * (RATTN_INVALID_ARGUMENT) and reads as holding 0 tokens, and save, clone,
 * memory and refresh are refused for the whole sequence; other layers may
 * be prefilled (also in the background) and decoded meanwhile. */
RATTN_API rattn_status rattn_sequence_prefill_end_async(rattn_sequence* seq, int32_t layer);

/* Where the engine waits: returns once every background prefill of `seq`
 * has finished (RATTN_OK at once when none runs). Each built layer is then
 * prefilled. A failed build leaves its layer as before its first chunk
 * (prefill it again) and the call returns the first failure's status, in
 * start order, with its message; the other layers are unaffected.
 * rattn_sequence_free waits for builds still running. */
RATTN_API rattn_status rattn_sequence_prefill_wait(rattn_sequence* seq);

/* One decode step of layer `layer` for one new token: q [n_q_heads, d],
 * k and v [n_kv_heads, d] (all in `dtype`). Writes out [n_q_heads, d] (fp32)
 * and, if lse != NULL, lse [n_q_heads] (natural log). */
RATTN_API rattn_status rattn_sequence_decode(rattn_sequence* seq, int32_t layer, const void* q,
                                             const void* k, const void* v, rattn_dtype dtype,
                                             float* out, float* lse);

/* One decode step of layer `layer` for n_seqs >= 0 distinct sequences of one
 * context at once (a batch of generation streams): entry i of q, k, v, out
 * and lse is sequence i's, laid out as for rattn_sequence_decode (lse, or any
 * of its entries, may be NULL). The sequences' work shares one parallel loop
 * over the context's threads, and with a GPU every static set is queued
 * before the CPU work starts; each out/lse equals what rattn_sequence_decode
 * gives that sequence. Every argument is checked before any sequence
 * changes: on RATTN_INVALID_ARGUMENT (a NULL entry, a sequence of another
 * context or named twice, a layer not prefilled) none has decoded. */
RATTN_API rattn_status rattn_sequence_decode_batch(rattn_sequence* const* seqs, int32_t n_seqs, int32_t layer,
                                                   const void* const* q, const void* const* k,
                                                   const void* const* v, rattn_dtype dtype, float* const* out,
                                                   float* const* lse);

/* Tokens layer `layer` holds (prompt + decoded); -1 for a bad handle/layer. */
RATTN_API int64_t rattn_sequence_n_tokens(const rattn_sequence* seq, int32_t layer);

/* Memory held by a sequence, in bytes. */
typedef struct rattn_memory_info {
  uint64_t static_set_bytes;   /* sinks + window K/V (GPU memory when there is a GPU) */
  uint64_t cpu_kv_bytes;       /* offloaded K/V in the CPU store */
  uint64_t index_bytes;        /* index structures (not the keys) */
  uint64_t query_ring_bytes;   /* the window's queries, kept to insert tokens into the indexes,
                                  and the queries kept for rattn_sequence_refresh */
  uint64_t scratch_bytes;      /* per-head search and decode scratch */
  uint64_t total_bytes;
  int64_t cpu_tokens;          /* offloaded tokens summed over layers and KV heads */
  bool static_set_on_gpu;      /* the static sets are (also) in GPU memory */
  int64_t pending_tokens;      /* offloaded tokens not yet in the indexes (attended exactly until
                                  their batch is inserted), summed over layers and KV heads */
} rattn_memory_info;
RATTN_API rattn_status rattn_sequence_memory(const rattn_sequence* seq, rattn_memory_info* out);

/* Refreshes every index of `seq` with the queries its inserted tokens kept
 * (refresh_sample) and forgets them: their exact top-Nq lists over the
 * offloaded keys, with RoPE-shifted copies when the plan sets
 * shift_queries, run the index build's repair pass, so that later queries
 * find what the insert path alone links poorly (synthetic T = 131072, 10%
 * more tokens inserted: recall@100 on queries needing them 0.913 -> 0.933
 * with a refresh every 1024 tokens at refresh_sample 0.5). An exact GEMM
 * per kept query and copy (about 1 ms per inserted token there on 2
 * threads): call it when the engine is idle, never while another call on
 * `seq` runs. *queries_used (may be NULL) receives the kept queries used,
 * summed over query heads; 0 with refresh_sample 0. Kept queries are not
 * saved by rattn_sequence_save. */
RATTN_API rattn_status rattn_sequence_refresh(rattn_sequence* seq, int64_t* queries_used);

/* Saves a sequence (static sets, CPU stores, window queries and indexes of
 * every prefilled layer) to `path`, atomically, in a versioned, checksummed
 * file, for prefix reuse. */
RATTN_API rattn_status rattn_sequence_save(const rattn_sequence* seq, const char* path);

/* An independent copy of `seq` in its context (through memory, as save and
 * load would make it): it decodes as `seq` would, and the two then go on
 * with their own tokens - several samples or beams from one prompt without
 * prefilling it again. Refused while a layer's chunked prefill is in
 * progress. Free it with rattn_sequence_free. */
RATTN_API rattn_status rattn_sequence_clone(const rattn_sequence* seq, rattn_sequence** out);

/* Loads a file written by rattn_sequence_save into a new sequence of `ctx`,
 * whose layout and plan (layers, heads, head_dim, storage dtype, sinks,
 * window) must match. A truncated or corrupted file gives RATTN_CORRUPT_DATA. */
RATTN_API rattn_status rattn_sequence_load(rattn_context* ctx, const char* path, rattn_sequence** out);

#ifdef __cplusplus
}
#endif

#endif /* RATTN_H */
