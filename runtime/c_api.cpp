// include/rattn.h on top of rattn::Runtime / rattn::Sequence. Every entry
// point catches everything: no exception crosses the C boundary.
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "core/embedded_abi.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "rattn.h"
#include "core/log.h"
#include "runtime/runtime.h"

struct rattn_context {
  std::shared_ptr<const rattn::Runtime> runtime;
  rattn_progress_callback progress = nullptr;
  void* progress_user_data = nullptr;
  mutable std::mutex error_mutex;
  // Per calling thread, so that threads working on different sequences never
  // see (or overwrite under the reader) each other's messages.
  mutable std::unordered_map<std::thread::id, std::string> last_error;
};

struct rattn_sequence {
  rattn_context* ctx = nullptr;
  std::unique_ptr<rattn::Sequence> seq;
};

namespace {

thread_local std::string t_last_error;

rattn_status to_c_status(rattn::Status s) {
  switch (s) {
    case rattn::Status::ok: return RATTN_OK;
    case rattn::Status::invalid_argument: return RATTN_INVALID_ARGUMENT;
    case rattn::Status::parse_error: return RATTN_PARSE_ERROR;
    case rattn::Status::io_error: return RATTN_IO_ERROR;
    case rattn::Status::corrupt_data: return RATTN_CORRUPT_DATA;
    case rattn::Status::unsupported: return RATTN_UNSUPPORTED;
    case rattn::Status::not_found: return RATTN_NOT_FOUND;
    case rattn::Status::internal: return RATTN_INTERNAL;
    case rattn::Status::out_of_memory: return RATTN_OUT_OF_MEMORY;
  }
  return RATTN_INTERNAL;
}

rattn_status record(const rattn_context* ctx, rattn_status status, const std::string& message) {
  t_last_error = message;
  if (ctx) {
    std::lock_guard<std::mutex> lock(ctx->error_mutex);
    ctx->last_error[std::this_thread::get_id()] = message;
  }
  rattn::log_message(rattn::LogLevel::debug, message);
  return status;
}

// Runs `body`, turning every exception into a status plus a message.
template <class Body>
rattn_status guarded(const rattn_context* ctx, const char* fn, Body&& body) {
  try {
    body();
    return RATTN_OK;
  } catch (const rattn::Error& e) {
    return record(ctx, to_c_status(e.status()), std::string(fn) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return record(ctx, RATTN_OUT_OF_MEMORY, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return record(ctx, RATTN_INTERNAL, std::string(fn) + ": " + e.what());
  } catch (...) {
    return record(ctx, RATTN_INTERNAL, std::string(fn) + ": unknown exception");
  }
}

// The integer behind a C enum the caller passed. Read through memcpy: a C
// caller may pass any int, and loading an out-of-range value as a C++ enum is
// undefined behaviour.
template <class E>
int enum_value(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return int(v);
}

rattn::DType to_dtype(const rattn_dtype& dtype, const char* what) {
  const int t = enum_value(dtype);
  switch (t) {
    case RATTN_F32: return rattn::DType::f32;
    case RATTN_F16: return rattn::DType::f16;
    case RATTN_BF16: return rattn::DType::bf16;
  }
  rattn::fail(rattn::Status::invalid_argument,
              std::string(what) + ": unknown dtype " + std::to_string(int(t)) +
                  " (expected RATTN_F32, RATTN_F16 or RATTN_BF16)");
}

void require(bool ok, const char* message) {
  if (!ok) rattn::fail(rattn::Status::invalid_argument, message);
}

rattn::RuntimeConfig config_from_params(const rattn_context_params& p) {
  rattn::RuntimeConfig c;
  rattn::Program program;
  if (p.plan_text) {
    program = rattn::parse_program(p.plan_text, "<plan_text>");
  } else if (p.plan_path) {
    program = rattn::load_program(p.plan_path);
  } else if (const auto* e = rattn::embedded::payload();
             e && e->plan_text && p.n_layers <= 0 && p.n_q_heads <= 0 && p.n_kv_heads <= 0 && p.head_dim <= 0) {
    // A deployable library (rattn emit --target library) carries its plan.
    program = rattn::parse_program(e->plan_text, std::string("<embedded plan of ") + e->model + ">");
  } else {
    require(p.n_layers > 0 && p.n_q_heads > 0 && p.n_kv_heads > 0 && p.head_dim > 0,
            "no plan given: n_layers, n_q_heads, n_kv_heads and head_dim must all be > 0");
    auto& m = program.model;
    m.name = "explicit";
    m.num_layers = p.n_layers;
    m.num_q_heads = p.n_q_heads;
    m.num_kv_heads = p.n_kv_heads;
    m.head_dim = p.head_dim;
    m.layers.assign(size_t(p.n_layers), rattn::LayerSpec{});
  }
  c.layout = program.model;
  c.plan = rattn::default_concrete_plan(program.plan);
  if (p.sinks >= 0) c.plan.sinks = p.sinks;
  if (p.window >= 0) c.plan.window = p.window;
  if (p.top_k >= 0) c.plan.top_k = p.top_k;
  if (p.search_queue >= 0) c.plan.search_queue = p.search_queue;
  if (p.graph_degree >= 0) c.plan.graph_degree = p.graph_degree;
  if (p.query_neighbors >= 0) c.plan.query_neighbors = p.query_neighbors;
  if (p.build_sample >= 0) c.plan.build_sample = p.build_sample;
  c.kv_storage = to_dtype(p.kv_storage, "kv_storage");
  switch (const int kind = enum_value(p.index_kind)) {
    case RATTN_INDEX_GRAPH: c.index = rattn::IndexChoice::projected_graph; break;
    case RATTN_INDEX_EXACT: c.index = rattn::IndexChoice::exact; break;
    default: rattn::fail(rattn::Status::invalid_argument, "index_kind: unknown value " + std::to_string(kind));
  }
  switch (const int kernels = enum_value(p.kernels)) {
    case RATTN_KERNELS_AUTO: c.kernels = rattn::KernelPreference::automatic; break;
    case RATTN_KERNELS_REFERENCE: c.kernels = rattn::KernelPreference::reference; break;
    case RATTN_KERNELS_HALIDE: c.kernels = rattn::KernelPreference::halide; break;
    default: rattn::fail(rattn::Status::invalid_argument, "kernels: unknown value " + std::to_string(kernels));
  }
  c.insert_evicted = p.insert_evicted;
  require(p.insert_batch >= 1 && p.insert_batch <= (1 << 16), "insert_batch must be in [1, 65536]");
  c.insert_batch = p.insert_batch;
  c.use_gpu = p.use_gpu;
  require(p.n_threads >= 0, "n_threads must be >= 0");
  c.threads = p.n_threads;
  c.seed = p.seed;
  require(p.tail_samples >= -1, "tail_samples must be >= 0, or -1 to keep the plan's value");
  if (p.tail_samples >= 0) c.plan.tail_samples = p.tail_samples;
  require(p.search_seeds >= -1, "search_seeds must be >= 0, or -1 to keep the plan's value");
  if (p.search_seeds >= 0) c.plan.search_seeds = p.search_seeds;
  require(p.refresh_sample == -1.f || (p.refresh_sample >= 0 && p.refresh_sample <= 1),
          "refresh_sample must be in [0, 1], or -1 to keep the plan's value");
  if (p.refresh_sample >= 0) c.plan.refresh_sample = p.refresh_sample;
  require(p.search_expand_first >= -1, "search_expand_first must be >= 0, or -1 to keep the plan's value");
  if (p.search_expand_first >= 0) c.plan.search_expand_first = p.search_expand_first;
  require(p.search_full_expand >= -1, "search_full_expand must be >= 0, or -1 to keep the plan's value");
  if (p.search_full_expand >= 0) c.plan.search_full_expand = p.search_full_expand;
  // A plan-wide override holds for every layer; then the per-layer entries.
  namespace keys = rattn::plan_keys;
  if (p.top_k >= 0) c.plan.drop_layer_search(keys::top_k);
  if (p.tail_samples >= 0) c.plan.drop_layer_search(keys::tail_samples);
  if (p.search_queue >= 0) c.plan.drop_layer_search(keys::search_queue);
  if (p.search_seeds >= 0) c.plan.drop_layer_search(keys::search_seeds);
  if (p.search_expand_first >= 0) c.plan.drop_layer_search(keys::search_expand_first);
  if (p.search_full_expand >= 0) c.plan.drop_layer_search(keys::search_full_expand);
  require(p.n_layer_search >= 0, "n_layer_search must be >= 0");
  require(p.n_layer_search == 0 || p.layer_search != nullptr, "layer_search must not be null when n_layer_search > 0");
  for (int32_t i = 0; i < p.n_layer_search; ++i) {
    const rattn_layer_search& e = p.layer_search[i];
    const std::string where = "layer_search[" + std::to_string(i) + "] (layer " + std::to_string(e.layer) + "): ";
    if (!c.layout.is_global(e.layer))
      rattn::fail(rattn::Status::invalid_argument, where + "not a global layer of the model");
    auto set = [&](const char* key, int32_t v, int32_t min) {
      if (v == -1) return;
      if (v < min)
        rattn::fail(rattn::Status::invalid_argument,
                    where + key + " must be >= " + std::to_string(min) + ", or -1 to keep the layer's value");
      c.plan.layer_search[e.layer][key] = v;
    };
    set(keys::search_queue, e.search_queue, 1);
    set(keys::search_seeds, e.search_seeds, 0);
    set(keys::search_expand_first, e.search_expand_first, 0);
    set(keys::search_full_expand, e.search_full_expand, 0);
  }
  return c;
}

}  // namespace

extern "C" {

const char* rattn_status_string(rattn_status status) {
  switch (enum_value(status)) {
    case RATTN_OK: return "ok";
    case RATTN_INVALID_ARGUMENT: return "invalid argument";
    case RATTN_PARSE_ERROR: return "parse error";
    case RATTN_IO_ERROR: return "I/O error";
    case RATTN_CORRUPT_DATA: return "corrupt data";
    case RATTN_UNSUPPORTED: return "unsupported";
    case RATTN_NOT_FOUND: return "not found";
    case RATTN_INTERNAL: return "internal error";
    case RATTN_OUT_OF_MEMORY: return "out of memory";
  }
  return "unknown status";
}

const char* rattn_version(void) { return "0.1.0"; }

void rattn_log_set(rattn_log_callback callback, void* user_data) {
  if (!callback) {
    rattn::set_log_sink(nullptr);
    return;
  }
  rattn::set_log_sink([callback, user_data](rattn::LogLevel level, const char* text) {
    callback(rattn_log_level(int(level)), text, user_data);
  });
}

rattn_context_params rattn_context_default_params(void) {
  rattn_context_params p{};
  p.plan_path = nullptr;
  p.plan_text = nullptr;
  p.sinks = p.window = p.top_k = p.search_queue = p.graph_degree = p.query_neighbors = -1;
  p.build_sample = -1.f;
  p.kv_storage = RATTN_F16;
  p.index_kind = RATTN_INDEX_GRAPH;
  p.kernels = RATTN_KERNELS_AUTO;
  p.insert_evicted = true;
  p.insert_batch = 16;
  p.use_gpu = true;
  p.n_threads = 0;
  p.seed = 1;
  p.tail_samples = -1;
  p.search_seeds = -1;
  p.refresh_sample = -1.f;
  p.search_expand_first = p.search_full_expand = -1;
  p.layer_search = nullptr;
  p.n_layer_search = 0;
  return p;
}

rattn_status rattn_context_create(const rattn_context_params* params, rattn_context** out) {
  if (out) *out = nullptr;
  return guarded(nullptr, "rattn_context_create", [&] {
    require(params != nullptr, "params must not be null");
    require(out != nullptr, "out must not be null");
    auto ctx = std::make_unique<rattn_context>();
    ctx->runtime = std::make_shared<const rattn::Runtime>(config_from_params(*params));
    ctx->progress = params->progress_callback;
    ctx->progress_user_data = params->progress_user_data;
    *out = ctx.release();
  });
}

void rattn_context_free(rattn_context* ctx) { delete ctx; }

const char* rattn_context_last_error(const rattn_context* ctx) {
  if (!ctx) return t_last_error.c_str();
  std::lock_guard<std::mutex> lock(ctx->error_mutex);
  auto it = ctx->last_error.find(std::this_thread::get_id());
  return it == ctx->last_error.end() ? "" : it->second.c_str();
}

rattn_status rattn_context_get_info(const rattn_context* ctx, rattn_context_info* out) {
  return guarded(ctx, "rattn_context_get_info", [&] {
    require(ctx != nullptr, "ctx must not be null");
    require(out != nullptr, "out must not be null");
    const auto& rt = *ctx->runtime;
    const auto& c = rt.config();
    rattn_context_info info{};
    info.n_layers = c.layout.num_layers;
    info.n_global_layers = c.layout.num_global_layers();
    info.n_q_heads = c.layout.num_q_heads;
    info.n_kv_heads = c.layout.num_kv_heads;
    info.head_dim = c.layout.head_dim;
    info.sinks = int32_t(c.plan.sinks);
    info.window = int32_t(c.plan.window);
    info.top_k = int32_t(c.plan.top_k);
    info.search_queue = c.plan.search_queue;
    info.graph_degree = c.plan.graph_degree;
    info.query_neighbors = c.plan.query_neighbors;
    info.build_sample = float(c.plan.build_sample);
    info.kv_storage = rattn_dtype(int(c.kv_storage));
    info.index_kind = c.index == rattn::IndexChoice::exact ? RATTN_INDEX_EXACT : RATTN_INDEX_GRAPH;
    info.n_threads = rt.pool().threads();
    info.gpu = rt.gpu();
    info.cpu_kernels = rt.kernels_name().c_str();
    info.insert_batch = c.insert_batch;
    info.gpu_status = rt.gpu_status().c_str();
    info.tail_samples = c.plan.tail_samples;
    info.search_seeds = c.plan.search_seeds;
    info.refresh_sample = float(c.plan.refresh_sample);
    info.search_expand_first = c.plan.search_expand_first;
    info.search_full_expand = c.plan.search_full_expand;
    *out = info;
  });
}

rattn_status rattn_context_get_layer_search(const rattn_context* ctx, int32_t layer, rattn_layer_search* out) {
  return guarded(ctx, "rattn_context_get_layer_search", [&] {
    require(ctx != nullptr, "ctx must not be null");
    require(out != nullptr, "out must not be null");
    if (!ctx->runtime->config().layout.is_global(layer))
      rattn::fail(rattn::Status::invalid_argument,
                  "layer " + std::to_string(layer) + " is not a global layer of the model");
    const rattn::DecodeSearch& s = ctx->runtime->decode_search(layer);
    *out = rattn_layer_search{layer, s.queue, s.seeds, s.expand_first, s.full_expand};
  });
}

rattn_status rattn_context_get_layer_retrieval(const rattn_context* ctx, int32_t layer, int32_t* top_k,
                                               int32_t* tail_samples) {
  return guarded(ctx, "rattn_context_get_layer_retrieval", [&] {
    require(ctx != nullptr, "ctx must not be null");
    require(top_k != nullptr && tail_samples != nullptr, "top_k and tail_samples must not be null");
    if (!ctx->runtime->config().layout.is_global(layer))
      rattn::fail(rattn::Status::invalid_argument,
                  "layer " + std::to_string(layer) + " is not a global layer of the model");
    const rattn::LayerRetrieval& r = ctx->runtime->layer_retrieval(layer);
    *top_k = int32_t(r.top_k);
    *tail_samples = r.tail_samples;
  });
}

rattn_status rattn_sequence_create(rattn_context* ctx, rattn_sequence** out) {
  if (out) *out = nullptr;
  return guarded(ctx, "rattn_sequence_create", [&] {
    require(ctx != nullptr, "ctx must not be null");
    require(out != nullptr, "out must not be null");
    auto s = std::make_unique<rattn_sequence>();
    s->ctx = ctx;
    s->seq = std::make_unique<rattn::Sequence>(ctx->runtime);
    *out = s.release();
  });
}

void rattn_sequence_free(rattn_sequence* seq) { delete seq; }

// The context's progress callback as the core's ProgressFn (empty without one).
rattn::ProgressFn progress_of(const rattn_context* ctx) {
  if (!ctx->progress) return {};
  auto cb = ctx->progress;
  void* ud = ctx->progress_user_data;
  return [cb, ud](double f) { cb(float(f), ud); };
}

rattn_status rattn_sequence_prefill(rattn_sequence* seq, int32_t layer, int64_t n_tokens,
                                    const void* q, const void* k, const void* v, rattn_dtype dtype) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_prefill", [&] {
    require(seq != nullptr, "seq must not be null");
    const rattn::DType t = to_dtype(dtype, "dtype");
    seq->seq->prefill(layer, n_tokens, q, k, v, t, progress_of(seq->ctx));
  });
}

rattn_status rattn_sequence_prefill_chunk(rattn_sequence* seq, int32_t layer, int64_t n_tokens, const void* q,
                                          const void* k, const void* v, rattn_dtype dtype) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_prefill_chunk", [&] {
    require(seq != nullptr, "seq must not be null");
    seq->seq->prefill_chunk(layer, n_tokens, q, k, v, to_dtype(dtype, "dtype"));
  });
}

rattn_status rattn_sequence_prefill_end(rattn_sequence* seq, int32_t layer) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_prefill_end", [&] {
    require(seq != nullptr, "seq must not be null");
    seq->seq->prefill_end(layer, progress_of(seq->ctx));
  });
}

rattn_status rattn_sequence_prefill_end_async(rattn_sequence* seq, int32_t layer) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_prefill_end_async", [&] {
    require(seq != nullptr, "seq must not be null");
    seq->seq->prefill_end_async(layer, progress_of(seq->ctx));
  });
}

rattn_status rattn_sequence_prefill_wait(rattn_sequence* seq) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_prefill_wait", [&] {
    require(seq != nullptr, "seq must not be null");
    seq->seq->prefill_wait();
  });
}

rattn_status rattn_sequence_decode(rattn_sequence* seq, int32_t layer, const void* q, const void* k,
                                   const void* v, rattn_dtype dtype, float* out, float* lse) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_decode", [&] {
    require(seq != nullptr, "seq must not be null");
    seq->seq->decode(layer, q, k, v, to_dtype(dtype, "dtype"), out, lse);
  });
}

rattn_status rattn_sequence_decode_batch(rattn_sequence* const* seqs, int32_t n_seqs, int32_t layer,
                                         const void* const* q, const void* const* k, const void* const* v,
                                         rattn_dtype dtype, float* const* out, float* const* lse) {
  const rattn_context* ctx = seqs && n_seqs > 0 && seqs[0] ? seqs[0]->ctx : nullptr;
  return guarded(ctx, "rattn_sequence_decode_batch", [&] {
    require(n_seqs >= 0, "n_seqs must be >= 0");
    if (n_seqs == 0) return;
    require(seqs != nullptr, "seqs must not be null");
    std::vector<rattn::Sequence*> inner(static_cast<size_t>(n_seqs));
    for (int32_t i = 0; i < n_seqs; ++i) {
      if (!seqs[i]) rattn::fail(rattn::Status::invalid_argument, "sequence " + std::to_string(i) + " is null");
      if (seqs[i]->ctx != seqs[0]->ctx)
        rattn::fail(rattn::Status::invalid_argument,
                    "sequence " + std::to_string(i) + " belongs to another context than sequence 0");
      inner[size_t(i)] = seqs[i]->seq.get();
    }
    rattn::Sequence::decode_batch(inner.data(), n_seqs, layer, q, k, v, to_dtype(dtype, "dtype"), out, lse);
  });
}

int64_t rattn_sequence_n_tokens(const rattn_sequence* seq, int32_t layer) {
  if (!seq) return -1;
  return seq->seq->tokens(layer);
}

rattn_status rattn_sequence_memory(const rattn_sequence* seq, rattn_memory_info* out) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_memory", [&] {
    require(seq != nullptr, "seq must not be null");
    require(out != nullptr, "out must not be null");
    const rattn::MemoryStats m = seq->seq->memory();
    rattn_memory_info info{};
    info.static_set_bytes = m.static_set_bytes;
    info.cpu_kv_bytes = m.cpu_kv_bytes;
    info.index_bytes = m.index_bytes;
    info.query_ring_bytes = m.query_ring_bytes;
    info.scratch_bytes = m.scratch_bytes;
    info.total_bytes = m.total();
    info.cpu_tokens = m.cpu_tokens;
    info.static_set_on_gpu = m.static_set_on_gpu;
    info.pending_tokens = m.pending_tokens;
    *out = info;
  });
}

rattn_status rattn_sequence_refresh(rattn_sequence* seq, int64_t* queries_used) {
  if (queries_used) *queries_used = 0;
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_refresh", [&] {
    require(seq != nullptr, "seq must not be null");
    const int64_t used = seq->seq->refresh_indexes();
    if (queries_used) *queries_used = used;
  });
}

rattn_status rattn_sequence_save(const rattn_sequence* seq, const char* path) {
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_save", [&] {
    require(seq != nullptr, "seq must not be null");
    require(path != nullptr, "path must not be null");
    seq->seq->save(path);
  });
}

rattn_status rattn_sequence_clone(const rattn_sequence* seq, rattn_sequence** out) {
  if (out) *out = nullptr;
  return guarded(seq ? seq->ctx : nullptr, "rattn_sequence_clone", [&] {
    require(seq != nullptr, "seq must not be null");
    require(out != nullptr, "out must not be null");
    auto s = std::make_unique<rattn_sequence>();
    s->ctx = seq->ctx;
    s->seq = seq->seq->clone();
    *out = s.release();
  });
}

rattn_status rattn_sequence_load(rattn_context* ctx, const char* path, rattn_sequence** out) {
  if (out) *out = nullptr;
  return guarded(ctx, "rattn_sequence_load", [&] {
    require(ctx != nullptr, "ctx must not be null");
    require(path != nullptr, "path must not be null");
    require(out != nullptr, "out must not be null");
    auto s = std::make_unique<rattn_sequence>();
    s->ctx = ctx;
    s->seq = rattn::Sequence::load(ctx->runtime, path);
    *out = s.release();
  });
}

}  // extern "C"
