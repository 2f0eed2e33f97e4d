// Sequence::prefill and the chunked prefill: the static set, the CPU store
// and the per-query-head indexes of one layer.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "dsl/memory_plan.h"
#include "runtime/layer_state.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "runtime/sequence_impl.h"

namespace rattn {

using internal::check_qkv;
using internal::convert;
using internal::KvHeadState;
using internal::LayerState;
using internal::offset_rows;
using internal::PromptChunks;
using internal::QueryHeadState;

void Sequence::prefill_chunk(int layer, int64_t n, const void* q, const void* k, const void* v, DType dtype) {
  LayerState& st = layer_state(layer, "prefill_chunk");
  const std::string where = "prefill_chunk: layer " + std::to_string(layer);
  if (st.prefilled) fail(Status::invalid_argument, where + " was already prefilled");
  if (n <= 0) fail(Status::invalid_argument, "prefill_chunk: n_tokens must be >= 1");
  if (!q || !k || !v) fail(Status::invalid_argument, "prefill_chunk: q, k and v must not be null");
  const auto& c = runtime_->config();
  const int d = c.layout.head_dim, hq = c.layout.num_q_heads, hkv = c.layout.num_kv_heads;
  if (st.chunks && st.chunks->dtype != dtype)
    fail(Status::invalid_argument, where + ": this chunk is " + dtype_name(dtype) + ", the earlier ones " +
                                       dtype_name(st.chunks->dtype) + " (one dtype per prompt)");
  check_qkv("prefill_chunk", layer, c, st.chunks ? st.chunks->tokens : 0, n, q, k, v, dtype);
  // A layer's first chunk is assembled aside and attached last, so that a
  // refused or failed first chunk leaves no (empty) prompt behind.
  std::unique_ptr<PromptChunks> fresh;
  if (!st.chunks) {
    fresh = std::make_unique<PromptChunks>();
    fresh->dtype = dtype;
    fresh->q.resize(size_t(hq));
    fresh->k.resize(size_t(hkv));
    fresh->v.resize(size_t(hkv));
  }
  PromptChunks& pc = fresh ? *fresh : *st.chunks;
  const size_t head_bytes = size_t(n) * size_t(d) * dtype_size(dtype);
  require_memory(uint64_t(hq + 2 * hkv) * head_bytes, where + ": " + std::to_string(n) + " more tokens");
  // Room first, for every head (geometric growth, so many small chunks copy
  // little): an allocation that fails leaves the chunks as they were instead
  // of some heads one chunk longer than others.
  for (auto* heads : {&pc.q, &pc.k, &pc.v})
    for (auto& h : *heads)
      if (h.capacity() - h.size() < head_bytes) h.reserve(std::max(h.size() + head_bytes, 2 * h.capacity()));
  auto append = [&](std::vector<std::vector<uint8_t>>& heads, const void* src) {
    for (size_t h = 0; h < heads.size(); ++h) {
      const uint8_t* from = offset_rows(src, int64_t(h) * n, d, dtype);
      heads[h].insert(heads[h].end(), from, from + head_bytes);  // within the room: cannot throw
    }
  };
  append(pc.q, q);
  append(pc.k, k);
  append(pc.v, v);
  pc.tokens += n;
  if (fresh) st.chunks = std::move(fresh);
}

LayerState& Sequence::layer_with_chunks(int layer, const char* what) {
  LayerState& st = layer_state(layer, what);
  if (!st.chunks)
    fail(Status::invalid_argument,
         std::string(what) + ": layer " + std::to_string(layer) + " has no chunks (prefill_chunk first)");
  if (st.chunks->tokens <= 0)
    fail(Status::internal, std::string(what) + ": layer " + std::to_string(layer) + " holds an empty prompt");
  return st;
}

void Sequence::prefill_end(int layer, const ProgressFn& progress) {
  LayerState& st = layer_with_chunks(layer, "prefill_end");
  // Moved out first: a failed prefill leaves the layer as before any chunk.
  const std::unique_ptr<PromptChunks> pc = std::move(st.chunks);
  try {
    prefill_chunks(layer, *pc, progress);
  } catch (...) {
    layers_[size_t(layer)] = fresh_layer(layer);  // no half-filled store left behind
    throw;
  }
}

void Sequence::prefill_chunks(int layer, const PromptChunks& pc, const ProgressFn& progress) {
  // Each head's chunks are one run of rows already: prefilled from in place.
  auto heads_of = [](const std::vector<std::vector<uint8_t>>& heads) {
    std::vector<const void*> p;
    for (const auto& h : heads) p.push_back(h.data());
    return p;
  };
  const std::vector<const void*> q = heads_of(pc.q), k = heads_of(pc.k), v = heads_of(pc.v);
  prefill_heads(layer, pc.tokens, q.data(), k.data(), v.data(), pc.dtype, progress);
}

void Sequence::prefill_end_async(int layer, const ProgressFn& progress) {
  LayerState& st = layer_with_chunks(layer, "prefill_end_async");
  builds_.reserve(builds_.size() + 1);  // the push_back below cannot throw
  auto b = std::make_unique<Build>();
  b->layer = layer;
  b->chunks = std::move(st.chunks);
  Build* build = b.get();
  try {
    build->thread = std::thread([this, build, progress] {
      try {
        prefill_chunks(build->layer, *build->chunks, progress);
      } catch (const Error& e) {
        build->error = std::make_exception_ptr(
            Error(e.status(), std::string(e.what()) + " (background build of layer " + std::to_string(build->layer) +
                                  "; the layer is as before its chunks)"));
      } catch (...) {
        build->error = std::current_exception();
      }
      build->chunks.reset();  // the prompt's copy, freed as soon as it is built
    });
  } catch (...) {  // no thread: the layer keeps its chunks
    st.chunks = std::move(b->chunks);
    throw;
  }
  st.building = true;
  builds_.push_back(std::move(b));
}

void Sequence::prefill_wait() {
  for (auto& b : builds_)  // all of them first: nothing below runs beside a build
    if (b->thread.joinable()) b->thread.join();
  std::exception_ptr first;
  for (auto& b : builds_) {
    layers_[size_t(b->layer)]->building = false;
    if (!b->error) continue;
    layers_[size_t(b->layer)] = fresh_layer(b->layer);  // no half-filled store left behind
    if (!first) first = b->error;
  }
  builds_.clear();
  if (first) std::rethrow_exception(first);
}

void Sequence::check_no_builds(const char* what) const {
  if (!builds_.empty())
    fail(Status::invalid_argument, std::string(what) + ": layer " + std::to_string(builds_.front()->layer) +
                                       " is building in the background (prefill_wait first)");
}

void Sequence::prefill(int layer, int64_t n, const void* q, const void* k, const void* v,
                       DType dtype, const ProgressFn& progress) {
  LayerState& st = layer_state(layer, "prefill");
  if (st.prefilled)
    fail(Status::invalid_argument, "prefill: layer " + std::to_string(layer) + " was already prefilled");
  if (st.chunks)
    fail(Status::invalid_argument, "prefill: layer " + std::to_string(layer) +
                                       " has a chunked prefill in progress (finish it with prefill_end)");
  if (n <= 0) fail(Status::invalid_argument, "prefill: n_tokens must be >= 1");
  if (!q || !k || !v) fail(Status::invalid_argument, "prefill: q, k and v must not be null");
  const auto& m = runtime_->config().layout;
  auto heads_of = [&](const void* base, int heads) {
    std::vector<const void*> p;
    for (int h = 0; h < heads; ++h) p.push_back(offset_rows(base, int64_t(h) * n, m.head_dim, dtype));
    return p;
  };
  check_qkv("prefill", layer, runtime_->config(), 0, n, q, k, v, dtype);
  try {
    prefill_heads(layer, n, heads_of(q, m.num_q_heads).data(), heads_of(k, m.num_kv_heads).data(),
                  heads_of(v, m.num_kv_heads).data(), dtype, progress);
  } catch (...) {
    layers_[size_t(layer)] = fresh_layer(layer);  // no half-filled store left behind
    throw;
  }
}

void Sequence::prefill_heads(int layer, int64_t n, const void* const* q, const void* const* k,
                             const void* const* v, DType dtype, const ProgressFn& progress) {
  LayerState& st = *layers_[size_t(layer)];
  const auto& c = runtime_->config();
  const int d = c.layout.head_dim;
  const int hq = c.layout.num_q_heads, hkv = c.layout.num_kv_heads, group = c.layout.group_size();
  const DType store_t = c.kv_storage;
  const size_t row_bytes = size_t(d) * dtype_size(store_t);

  const int64_t n_sinks = std::min(n, st.sinks);
  const int64_t n_window = std::min(n - n_sinks, st.window);
  const int64_t n_cpu = n - n_sinks - n_window;  // tokens [n_sinks, n - n_window)
  const int64_t static_cap = st.static_capacity();
  // Indexes: one per query head, or with shared_graph one per KV head, built
  // from its group's queries pooled.
  const int graphs = c.plan.shared_graph ? hkv : hq;
  const int pooled = c.plan.shared_graph ? group : 1;  // query heads per graph
  {
    // The layer's store and indexes, and the build's fp32 key copies and
    // training rows (pooled x n), one per thread.
    const uint64_t store = uint64_t(hkv) * uint64_t(2 * static_cap + (st.global ? 2 * (n_cpu + 4096) : 0)) * row_bytes;
    const uint64_t train_rows = uint64_t(pooled) * uint64_t(n);
    const uint64_t index = st.global ? uint64_t(graphs) * uint64_t(n_cpu) * index_bytes_per_node(c.plan) +
                                           uint64_t(runtime_->pool().threads()) *
                                               (uint64_t(n_cpu) + train_rows) * uint64_t(d) * 4
                                     : 0;
    require_memory(store + index, "prefill: layer " + std::to_string(layer) + " (" + std::to_string(n) + " tokens)");
  }

  // Static set and CPU store, per KV head.
  std::vector<float> tmp;
  for (int h = 0; h < hkv; ++h) {
    KvHeadState& kv = st.kv[size_t(h)];
    kv.static_keys.assign(size_t(static_cap) * row_bytes, 0);
    kv.static_values.assign(size_t(static_cap) * row_bytes, 0);
    const void* kh = k[h];
    const void* vh = v[h];
    auto copy_static = [&](int64_t src_row, int64_t rows, int64_t dst_row) {
      tmp.resize(size_t(rows) * size_t(d));
      convert(dtype, offset_rows(kh, src_row, d, dtype), store_t,
              kv.static_keys.data() + size_t(dst_row) * row_bytes, size_t(rows) * size_t(d), tmp.data());
      convert(dtype, offset_rows(vh, src_row, d, dtype), store_t,
              kv.static_values.data() + size_t(dst_row) * row_bytes, size_t(rows) * size_t(d), tmp.data());
    };
    copy_static(0, n_sinks, 0);
    if (n_window > 0) copy_static(n - n_window, n_window, st.sinks);

    if (!st.global) continue;  // local layers drop what left their window
    // Room for decoded tokens too, so decode steps rarely reallocate.
    kv.cpu_keys.reserve(n_cpu + 4096);
    kv.cpu_values.reserve(n_cpu + 4096);
    constexpr int64_t kChunk = 4096;
    for (int64_t r = 0; r < n_cpu; r += kChunk) {
      const int64_t rows = std::min(kChunk, n_cpu - r);
      const uint8_t* ks = offset_rows(kh, n_sinks + r, d, dtype);
      const uint8_t* vs = offset_rows(vh, n_sinks + r, d, dtype);
      if (dtype == store_t) {
        kv.cpu_keys.append_raw(ks, rows);
        kv.cpu_values.append_raw(vs, rows);
      } else {
        tmp.resize(size_t(rows) * size_t(d));
        to_f32(dtype, ks, tmp.data(), tmp.size());
        kv.cpu_keys.append_f32(tmp.data(), rows);
        to_f32(dtype, vs, tmp.data(), tmp.size());
        kv.cpu_values.append_f32(tmp.data(), rows);
      }
    }
  }
  st.sinks_filled = n_sinks;
  st.window_filled = n_window;
  st.ring_head = 0;  // slots hold the window oldest first
  st.tokens = n;

  if (st.global) {
    // The window's own queries: a token leaving the window is inserted into
    // the index with its query as training query.
    for (int h = 0; h < hq; ++h) {
      QueryHeadState& qh = st.q[size_t(h)];
      qh.window_queries.assign(size_t(st.window) * size_t(d), 0.f);
      qh.clear_hints(st.window, 0);
      if (n_window > 0)
        to_f32(dtype, offset_rows(q[h], n - n_window, d, dtype),
               qh.window_queries.data(), size_t(n_window) * size_t(d));
    }
    // The indexes, built in parallel over graphs.
    if (c.plan.top_k > 0) {
      std::mutex progress_mutex;
      std::vector<double> head_progress(size_t(graphs), 0.0);
      double reported = 0;
      auto report = [&](int h, double f) {
        if (!progress) return;
        std::lock_guard<std::mutex> lock(progress_mutex);
        head_progress[size_t(h)] = std::clamp(f, 0.0, 1.0);
        double sum = 0;
        for (double x : head_progress) sum += x;
        const double total = sum / graphs;
        if (total > reported) {
          reported = total;
          progress(total);
        }
      };
      // Heads build in parallel; each build gets the threads the heads leave.
      const int pool_threads = runtime_->pool().threads();
      const int build_threads = std::max(1, pool_threads / std::min(graphs, pool_threads));
      runtime_->pool().parallel_for(graphs, [&](int64_t gi) {
        const int g = int(gi), h0 = g * pooled;  // the graph's first query head
        const RowsView keys = st.kv[size_t(h0 / group)].cpu_keys.view();
        // Pooled: the group's queries head after head.
        std::vector<float> train(size_t(pooled) * size_t(n) * size_t(d));
        for (int i = 0; i < pooled; ++i)
          to_f32(dtype, q[h0 + i], train.data() + size_t(i) * size_t(n) * size_t(d), size_t(n) * size_t(d));
        std::shared_ptr<KeyIndex> index =
            runtime_->build_index(layer, keys, train.data(), int64_t(pooled) * n,
                                  c.seed + uint64_t(layer) * 1000003ull + uint64_t(h0), build_threads,
                                  [&](double f) { report(g, f); });
        for (int i = 0; i < pooled; ++i) {
          QueryHeadState& qh = st.q[size_t(h0 + i)];
          qh.index = index;
          qh.scratch = index->make_scratch();
        }
        report(g, 1.0);
      });
    }
  }
  internal::share_traversal_codes(st, c);
  st.gpu = runtime_->open_gpu_stream(st.static_capacity());
  internal::upload_static_set_to_gpu(st, d, store_t);
  st.prefilled = true;
  log_message(LogLevel::debug, "prefill: layer " + std::to_string(layer) + ": " + std::to_string(n) +
                                   " tokens, " + std::to_string(n_cpu) + " offloaded per KV head");
}

}  // namespace rattn
