// rattn inside llama.cpp (see rattn-llama.h). Only include/rattn.h's C API
// is used, through function pointers resolved with dlopen.
#include "rattn-llama.h"

#include "llama-arch.h"
#include "llama-cparams.h"
#include "llama-graph.h"
#include "llama-hparams.h"
#include "llama-impl.h"
#include "llama-model.h"

#include "ggml.h"
#include "rattn.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef RATTN_LLAMA_DEFAULT_LIBRARY
#define RATTN_LLAMA_DEFAULT_LIBRARY ""
#endif

namespace {

// The C API functions this integration calls.
struct api {
    void * handle = nullptr;
    decltype(&rattn_version)                  version                  = nullptr;
    decltype(&rattn_context_default_params)   context_default_params   = nullptr;
    decltype(&rattn_context_create)           context_create           = nullptr;
    decltype(&rattn_context_free)             context_free             = nullptr;
    decltype(&rattn_context_last_error)       context_last_error       = nullptr;
    decltype(&rattn_context_get_info)         context_get_info         = nullptr;
    decltype(&rattn_context_get_layer_search) context_get_layer_search = nullptr;
    decltype(&rattn_sequence_create)          sequence_create          = nullptr;
    decltype(&rattn_sequence_free)            sequence_free            = nullptr;
    decltype(&rattn_sequence_prefill_chunk)   sequence_prefill_chunk   = nullptr;
    decltype(&rattn_sequence_prefill_end)     sequence_prefill_end     = nullptr;
    decltype(&rattn_sequence_decode)          sequence_decode          = nullptr;
    decltype(&rattn_sequence_memory)          sequence_memory          = nullptr;
};

// One model layer; an offloaded layer's custom ops get its address as userdata
// (stable: the vector is sized once).
struct layer_state {
    int     layer   = 0;
    int64_t held    = 0;     // tokens handed to rattn (prefill chunks + decoded)
    bool    decoded = false; // prefill ended: every further token is a decode step
    float   q_scale = 1.0f;  // folds llama.cpp's query scale into rattn's 1/sqrt(d)
};

struct state {
    api              fn;
    rattn_context  * ctx = nullptr;
    rattn_sequence * seq = nullptr;
    int              n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    int64_t          prefill_limit = INT64_MAX;
    std::vector<bool>        offloaded;  // per model layer
    std::vector<layer_state> layers;     // per model layer
    std::vector<float>       q, k, v;    // scratch: one chunk (or a decode token) in rattn's layout
    // A prompt chunk as f16 (f16_prompt): rattn holds the prompt in the
    // dtype handed over until prefill_end.
    std::vector<ggml_fp16_t> q16, k16, v16;
    int first_layer = -1;                // the lowest offloaded layer: resets the sequence
    const void * owner = nullptr;        // the llama_context
    bool f16_queries = true;             // queries rounded to f16, as llama.cpp's attention rounds them
    bool f16_prompt = true;              // f16 storage and f16 queries: the prompt handed over as f16
};

state * g_state = nullptr;

[[noreturn]] void fatal(const std::string & msg) {
    std::fprintf(stderr, "rattn: error: %s\n", msg.c_str());
    std::fflush(stderr);
    _exit(1);
}

std::string env(const char * name) {
    const char * v = std::getenv(name);
    return v ? std::string(v) : std::string();
}

std::string last_error(const state & s) {
    return s.fn.context_last_error ? s.fn.context_last_error(s.ctx) : "";
}

void check(const state & s, rattn_status st, const char * what) {
    if (st != RATTN_OK) {
        fatal(std::string(what) + " failed: " + last_error(s));
    }
}

void load_library(api & fn) {
    std::vector<std::string> names;
    if (!env("RATTN_LIBRARY").empty()) {
        names.push_back(env("RATTN_LIBRARY"));
    } else {
        names.push_back("librattn.so." + std::to_string(RATTN_ABI_VERSION));
        if (std::strlen(RATTN_LLAMA_DEFAULT_LIBRARY) > 0) {
            names.push_back(RATTN_LLAMA_DEFAULT_LIBRARY);
        }
    }
    std::string errors;
    for (const std::string & name : names) {
        fn.handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (fn.handle) {
            break;
        }
        const char * e = dlerror();
        errors += "\n  " + name + ": " + (e ? e : "not found");
    }
    if (!fn.handle) {
        throw std::runtime_error("rattn: RATTN_PLAN is set but the rattn library could not be loaded (set "
                                 "RATTN_LIBRARY to librattn.so." + std::to_string(RATTN_ABI_VERSION) + "):" + errors);
    }
    auto sym = [&](const char * name) {
        void * p = dlsym(fn.handle, name);
        if (!p) {
            throw std::runtime_error(std::string("rattn: the rattn library lacks ") + name + " (ABI version " +
                                     std::to_string(RATTN_ABI_VERSION) + " expected)");
        }
        return p;
    };
#define RATTN_SYM(field, name) fn.field = reinterpret_cast<decltype(fn.field)>(sym(#name))
    RATTN_SYM(version, rattn_version);
    RATTN_SYM(context_default_params, rattn_context_default_params);
    RATTN_SYM(context_create, rattn_context_create);
    RATTN_SYM(context_free, rattn_context_free);
    RATTN_SYM(context_last_error, rattn_context_last_error);
    RATTN_SYM(context_get_info, rattn_context_get_info);
    RATTN_SYM(context_get_layer_search, rattn_context_get_layer_search);
    RATTN_SYM(sequence_create, rattn_sequence_create);
    RATTN_SYM(sequence_free, rattn_sequence_free);
    RATTN_SYM(sequence_prefill_chunk, rattn_sequence_prefill_chunk);
    RATTN_SYM(sequence_prefill_end, rattn_sequence_prefill_end);
    RATTN_SYM(sequence_decode, rattn_sequence_decode);
    RATTN_SYM(sequence_memory, rattn_sequence_memory);
#undef RATTN_SYM
}

void free_state(state * s) {
    if (!s) {
        return;
    }
    if (s->seq) {
        s->fn.sequence_free(s->seq);
    }
    if (s->ctx) {
        s->fn.context_free(s->ctx);
    }
    // the library stays loaded: its worker threads may outlive the context by a moment
    delete s;
}

int64_t env_int(const char * name, int64_t dflt, int64_t lo) {
    const std::string v = env(name);
    if (v.empty()) {
        return dflt;
    }
    char * end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || x < lo) {
        throw std::runtime_error(std::string("rattn: ") + name + "='" + v + "' is not an integer >= " + std::to_string(lo));
    }
    return x;
}

// A fresh sequence: every layer holds nothing.
void reset_sequence(state & s) {
    if (s.seq) {
        s.fn.sequence_free(s.seq);
        s.seq = nullptr;
    }
    check(s, s.fn.sequence_create(s.ctx, &s.seq), "rattn_sequence_create");
    for (layer_state & l : s.layers) {
        l.held = 0;
        l.decoded = false;
    }
}

bool decoding(const state & s) {
    for (const layer_state & l : s.layers) {
        if (l.decoded) {
            return true;
        }
    }
    return false;
}

const int32_t * positions(const ggml_tensor * pos) {
    return static_cast<const int32_t *>(pos->data);
}

// Token t's heads of x ([d, H, T], contiguous f32): [H, d].
const float * token_rows(const ggml_tensor * x, int64_t t) {
    return static_cast<const float *>(x->data) + t * x->ne[0] * x->ne[1];
}

// llama.cpp's attention multiplies an f16 K cache with the queries converted
// to f16 (KQ matmul and flash attention alike); rattn takes f32 queries, so the
// integration rounds them the same way to compute what llama.cpp computes.
float query_value(float x, bool f16) {
    return f16 ? ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)) : x;
}

float to_element(float x, float) { return x; }
ggml_fp16_t to_element(float x, ggml_fp16_t) { return ggml_fp32_to_fp16(x); }

// x [d, H, T] -> dst [H, T, d], scaled, as f32 or f16 (f16 queries: one
// rounding of the scaled value; they train the index and seed insertions).
template <typename T_elem>
void head_major(const ggml_tensor * x, float scale, std::vector<T_elem> & dst) {
    const int64_t d = x->ne[0], H = x->ne[1], T = x->ne[2];
    dst.resize(size_t(d * H * T));
    const float * src = static_cast<const float *>(x->data);
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t h = 0; h < H; ++h) {
            const float * a = src + (t * H + h) * d;
            T_elem * b = dst.data() + (h * T + t) * d;
            for (int64_t i = 0; i < d; ++i) {
                b[i] = to_element(a[i] * scale, T_elem{});
            }
        }
    }
}

void begin_ubatch(state & s, layer_state & l, int32_t pos0) {
    if (pos0 == 0 && l.layer == s.first_layer) {
        reset_sequence(s);
    }
    if (pos0 != l.held) {
        fatal("layer " + std::to_string(l.layer) + " receives position " + std::to_string(pos0) + " but rattn holds " +
              std::to_string(l.held) + " tokens: the KV cache was edited in a way rattn cannot follow (removing, "
              "shifting or restoring tokens); only appending tokens, or clearing the sequence, is supported");
    }
}

// Prefill: src = {attention output, q, k, v, pos}; hands the chunk to rattn
// and passes llama.cpp's attention output through.
void prefill_op(ggml_tensor * dst, int ith, int, void * userdata) {
    if (ith != 0) {
        return;
    }
    state & s = *g_state;
    layer_state & l = *static_cast<layer_state *>(userdata);
    const ggml_tensor * out = dst->src[0];
    const ggml_tensor * q = dst->src[1];
    const ggml_tensor * k = dst->src[2];
    const ggml_tensor * v = dst->src[3];
    const int64_t T = q->ne[2];
    begin_ubatch(s, l, positions(dst->src[4])[0]);
    if (l.decoded) {
        fatal("layer " + std::to_string(l.layer) + ": a prompt chunk after decoding started");
    }
    if (s.f16_prompt) {
        head_major(q, l.q_scale, s.q16);
        head_major(k, 1.0f, s.k16);
        head_major(v, 1.0f, s.v16);
        check(s, s.fn.sequence_prefill_chunk(s.seq, l.layer, T, s.q16.data(), s.k16.data(), s.v16.data(), RATTN_F16),
              "rattn_sequence_prefill_chunk");
    } else {
        head_major(q, l.q_scale, s.q);
        if (s.f16_queries) {
            // f32 storage (K/V handed over unrounded) with f16 queries
            for (float & x : s.q) {
                x = query_value(x, true);
            }
        }
        head_major(k, 1.0f, s.k);
        head_major(v, 1.0f, s.v);
        check(s, s.fn.sequence_prefill_chunk(s.seq, l.layer, T, s.q.data(), s.k.data(), s.v.data(), RATTN_F32),
              "rattn_sequence_prefill_chunk");
    }
    l.held += T;
    std::memcpy(dst->data, out->data, ggml_nbytes(dst));
}

// Decode: src = {q, k, v, pos}; every token is one rattn decode step.
void decode_op(ggml_tensor * dst, int ith, int, void * userdata) {
    if (ith != 0) {
        return;
    }
    state & s = *g_state;
    layer_state & l = *static_cast<layer_state *>(userdata);
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int32_t * pos = positions(dst->src[3]);
    const int64_t T = q->ne[2], d = q->ne[0], H = q->ne[1], HK = k->ne[1];
    begin_ubatch(s, l, pos[0]);
    s.q.resize(size_t(d * H));
    for (int64_t t = 0; t < T; ++t) {
        if (pos[t] != l.held) {
            fatal("layer " + std::to_string(l.layer) + ": positions in a batch are not consecutive");
        }
        const float * qt = token_rows(q, t);
        for (size_t i = 0; i < s.q.size(); ++i) {
            s.q[i] = query_value(qt[i], s.f16_queries) * l.q_scale;
        }
        const float * kt = token_rows(k, t);
        const float * vt = token_rows(v, t);
        float * o = static_cast<float *>(dst->data) + t * d * H;
        if (!l.decoded && l.held == 0) {
            // a one-token prompt: rattn needs a prefill, and the token attends to itself only
            check(s, s.fn.sequence_prefill_chunk(s.seq, l.layer, 1, s.q.data(), kt, vt, RATTN_F32),
                  "rattn_sequence_prefill_chunk");
            check(s, s.fn.sequence_prefill_end(s.seq, l.layer), "rattn_sequence_prefill_end");
            for (int64_t h = 0; h < H; ++h) {
                std::memcpy(o + h * d, vt + (h / (H / HK)) * d, size_t(d) * sizeof(float));
            }
        } else {
            if (!l.decoded) {
                check(s, s.fn.sequence_prefill_end(s.seq, l.layer), "rattn_sequence_prefill_end");
            }
            check(s, s.fn.sequence_decode(s.seq, l.layer, s.q.data(), kt, vt, RATTN_F32, o, nullptr),
                  "rattn_sequence_decode");
        }
        l.decoded = true;
        ++l.held;
    }
}

ggml_tensor * contiguous(ggml_context * ctx, ggml_tensor * x) {
    return ggml_is_contiguous(x) ? x : ggml_cont(ctx, x);
}

} // namespace

bool rattn_llama_requested() {
    return !env("RATTN_PLAN").empty();
}

void rattn_llama_context_init(const llama_model & model, const llama_cparams & cparams, ggml_type cache_type,
                              const void * owner) {
    if (!rattn_llama_requested()) {
        return;
    }
    if (g_state) {
        throw std::runtime_error("rattn: one llama.cpp context per process can use rattn");
    }
    const std::string plan = env("RATTN_PLAN");
    if (model.arch != LLM_ARCH_GEMMA3) {
        throw std::runtime_error(std::string("rattn: RATTN_PLAN is set, but this integration computes the attention "
                                             "of Gemma-3 models only; this model's architecture is ") +
                                 llm_arch_name(model.arch));
    }
    if (cparams.n_seq_max != 1) {
        throw std::runtime_error("rattn: one sequence per context is supported (this context has " +
                                 std::to_string(cparams.n_seq_max) +
                                 "); run llama-server with --parallel 1 (-np 1), other tools with one sequence");
    }
    const llama_hparams & hp = model.hparams;
    if (hp.swa_type != LLAMA_SWA_TYPE_STANDARD) {
        throw std::runtime_error("rattn: this Gemma-3 model has no sliding-window layers; the integration offloads "
                                 "the global layers of interleaved sliding-window models");
    }
    auto * s = new state();
    try {
        load_library(s->fn);
        s->n_layer = int(hp.n_layer());
        s->n_head = int(hp.n_head(0));
        s->n_head_kv = int(hp.n_head_kv(0));
        s->head_dim = int(hp.n_embd_head_k());
        for (int il = 0; il < s->n_layer; ++il) {
            if (int(hp.n_head(il)) != s->n_head || int(hp.n_head_kv(il)) != s->n_head_kv) {
                throw std::runtime_error("rattn: the model's layers do not all have the same heads");
            }
        }
        if (int(hp.n_embd_head_v()) != s->head_dim) {
            throw std::runtime_error("rattn: the model's K and V head sizes differ");
        }
        rattn_context_params p = s->fn.context_default_params();
        p.plan_path = plan.c_str();
        // rattn stores K/V as llama.cpp's cache does: f32 for an f32 cache
        // (-ctk f32), else f16 (bf16 and quantised caches included).
        p.kv_storage = cache_type == GGML_TYPE_F32 ? RATTN_F32 : RATTN_F16;
        p.n_threads = int32_t(env_int("RATTN_THREADS", cparams.n_threads, 0));
        s->prefill_limit = env_int("RATTN_PREFILL_TOKENS", INT64_MAX, 1);
        const std::string precision = env("RATTN_QUERY_PRECISION");
        if (!precision.empty() && precision != "f16" && precision != "f32") {
            throw std::runtime_error("rattn: RATTN_QUERY_PRECISION is '" + precision + "' (expected f16 or f32)");
        }
        // llama.cpp's attention rounds the queries to the K cache's dtype
        s->f16_queries = precision.empty() ? p.kv_storage == RATTN_F16 : precision == "f16";
        s->f16_prompt = s->f16_queries && p.kv_storage == RATTN_F16;
        if (s->fn.context_create(&p, &s->ctx) != RATTN_OK) {
            throw std::runtime_error("rattn: plan '" + plan + "': " + s->fn.context_last_error(nullptr));
        }
        rattn_context_info info{};
        if (s->fn.context_get_info(s->ctx, &info) != RATTN_OK) {
            throw std::runtime_error("rattn: " + last_error(*s));
        }
        if (info.n_layers != s->n_layer || info.n_q_heads != s->n_head || info.n_kv_heads != s->n_head_kv ||
            info.head_dim != s->head_dim) {
            throw std::runtime_error(
                "rattn: plan '" + plan + "' describes " + std::to_string(info.n_layers) + " layers, " +
                std::to_string(info.n_q_heads) + "/" + std::to_string(info.n_kv_heads) + " heads of dimension " +
                std::to_string(info.head_dim) + "; the model has " + std::to_string(s->n_layer) + " layers, " +
                std::to_string(s->n_head) + "/" + std::to_string(s->n_head_kv) + " heads of dimension " +
                std::to_string(s->head_dim));
        }
        // The plan's global layers must be the model's full-attention layers.
        s->offloaded.assign(size_t(s->n_layer), false);
        s->layers.assign(size_t(s->n_layer), layer_state{});
        std::string mismatch;
        for (int il = 0; il < s->n_layer; ++il) {
            rattn_layer_search ls{};
            const bool global = s->fn.context_get_layer_search(s->ctx, il, &ls) == RATTN_OK;
            const bool full = !hp.is_swa(uint32_t(il));
            if (global != full) {
                mismatch += " " + std::to_string(il) + (full ? " (full attention in the model, local in the plan)"
                                                             : " (sliding-window in the model, global in the plan)");
            }
            s->offloaded[size_t(il)] = global && full;
            s->layers[size_t(il)].layer = il;
            if (global && full && s->first_layer < 0) {
                s->first_layer = il;
            }
        }
        if (!mismatch.empty()) {
            throw std::runtime_error("rattn: plan '" + plan + "' does not match the model's layers:" + mismatch);
        }
        if (s->first_layer < 0) {
            throw std::runtime_error("rattn: plan '" + plan + "' offloads no layer of this model");
        }
        reset_sequence(*s);
        LLAMA_LOG_INFO("rattn: %s, plan %s: %d of %d layers through rattn (sinks %d, window %d, top-k %d, kernels %s, "
                       "%d threads, K/V %s, queries %s)\n",
                       s->fn.version(), plan.c_str(), info.n_global_layers, s->n_layer, info.sinks, info.window,
                       info.top_k, info.cpu_kernels, info.n_threads, info.kv_storage == RATTN_F32 ? "f32" : "f16",
                       s->f16_queries ? "f16" : "f32");
    } catch (...) {
        free_state(s);
        throw;
    }
    s->owner = owner;
    g_state = s;
}

void rattn_llama_context_free(const void * owner) {
    if (!g_state || g_state->owner != owner) {
        return;
    }
    free_state(g_state);
    g_state = nullptr;
}

bool rattn_llama_offloads(int il) {
    return g_state && il >= 0 && il < g_state->n_layer && g_state->offloaded[size_t(il)];
}

ggml_tensor * rattn_llama_build_attn(const llm_graph_context & g, llm_graph_input_attn_kv_iswa * inp,
                                     ggml_tensor * wo, ggml_tensor * wo_s, ggml_tensor * q, ggml_tensor * k,
                                     ggml_tensor * v, ggml_tensor * pos, float kq_scale, int il) {
    state & s = *g_state;
    const llama_ubatch & ub = g.ubatch;
    if (ub.n_seqs_unq > 1 || (ub.seq_id && ub.n_tokens > 0 && ub.seq_id[0][0] != 0)) {
        fatal("a batch of several sequences (rattn supports one sequence, id 0)");
    }
    if (ub.embd) {
        fatal("embeddings as input are not supported (tokens only)");
    }
    layer_state & l = s.layers[size_t(il)];
    l.q_scale = kq_scale * std::sqrt(float(s.head_dim));
    const int64_t T = g.n_tokens;
    const int64_t pos0 = ub.pos ? ub.pos[0] : 0;
    // graph reuse is off, so this ubatch's positions decide the mode
    const bool prefill = T > 1 && (pos0 == 0 || !decoding(s)) && pos0 + T <= s.prefill_limit;
    ggml_context * ctx0 = g.ctx0;
    q = contiguous(ctx0, q);
    k = contiguous(ctx0, k);
    v = contiguous(ctx0, v);
    ggml_tensor * out;
    if (prefill) {
        ggml_tensor * full = g.build_attn(inp, nullptr, nullptr, nullptr, q, k, v, nullptr, nullptr, nullptr, kq_scale, il);
        ggml_tensor * args[] = {full, q, k, v, pos};
        out = ggml_custom_4d(ctx0, GGML_TYPE_F32, full->ne[0], full->ne[1], 1, 1, args, 5, prefill_op, 1, &l);
    } else {
        ggml_tensor * args[] = {q, k, v, pos};
        out = ggml_custom_4d(ctx0, GGML_TYPE_F32, q->ne[0] * q->ne[1], T, 1, 1, args, 4, decode_op, 1, &l);
    }
    g.cb(out, prefill ? "rattn_prefill_out" : "rattn_decode_out", il);
    return wo ? g.build_lora_mm(wo, out, wo_s) : out;
}

bool rattn_llama_seq_rm(int32_t seq_id, int32_t p0, int32_t p1) {
    (void) seq_id;
    if (!g_state) {
        return true;
    }
    int64_t held = 0;
    for (const layer_state & l : g_state->layers) {
        held = std::max(held, l.held);
    }
    const int64_t a = p0 < 0 ? 0 : p0;
    const int64_t b = p1 < 0 ? INT64_MAX : p1;
    if (a == 0 && b == INT64_MAX) {
        return true; // the whole sequence: the next prompt restarts rattn at position 0
    }
    if (a >= held || b <= a) {
        return true; // nothing rattn holds
    }
    LLAMA_LOG_WARN("rattn: refusing to remove positions [%lld, %lld) of the %lld tokens rattn holds (its indexes "
                   "cannot forget tokens); clear the sequence instead\n",
                   (long long) a, (long long) std::min<int64_t>(b, held), (long long) held);
    return false;
}

void rattn_llama_seq_cp(int32_t seq_src, int32_t seq_dst) {
    if (g_state && seq_src != seq_dst) {
        fatal("copying sequence " + std::to_string(seq_src) + " to " + std::to_string(seq_dst) +
              " is not supported (rattn serves one sequence)");
    }
}

void rattn_llama_seq_add(int32_t seq_id, int32_t p0, int32_t p1, int32_t delta) {
    (void) seq_id;
    (void) p0;
    (void) p1;
    if (g_state && delta != 0) {
        fatal("shifting token positions (context shift) is not supported: rattn's indexes hold RoPE'd keys; "
              "use a context large enough for the generation, without context shift");
    }
}

bool rattn_llama_state_load_allowed() {
    if (!g_state) {
        return true;
    }
    LLAMA_LOG_ERROR("rattn: refusing to restore a saved state: it does not hold rattn's sequence (prefill again "
                    "instead)\n");
    return false;
}

void rattn_llama_seq_div(int32_t seq_id, int32_t p0, int32_t p1, int d) {
    (void) seq_id;
    (void) p0;
    (void) p1;
    if (g_state && d != 1) {
        fatal("dividing token positions (self-extend) is not supported: rattn's indexes hold RoPE'd keys");
    }
}
