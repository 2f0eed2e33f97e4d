// A Sequence's state outside the prefill and decode calls: construction,
// per-layer state after prefill and load (GPU upload, shared codes), index
// refresh, the row checks both calls run, and memory accounting.
#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "dsl/memory_plan.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"
#include "runtime/sequence_impl.h"

namespace rattn {

using internal::kInsertHints;
using internal::KvHeadState;
using internal::LayerState;
using internal::QueryHeadState;

namespace internal {

void check_qkv(const char* call, int layer, const RuntimeConfig& c, int64_t first_token, int64_t n, const void* q,
               const void* k, const void* v, DType dtype) {
  const int d = c.layout.head_dim;
  const struct {
    const char* name;
    const void* data;
    int heads;
    DType store;
  } tensors[] = {{"q", q, c.layout.num_q_heads, DType::f32},
                 {"k", k, c.layout.num_kv_heads, c.kv_storage},
                 {"v", v, c.layout.num_kv_heads, c.kv_storage}};
  const int64_t head_values = n * d;
  for (const auto& t : tensors) {
    const int64_t bad = first_out_of_range(dtype, t.data, size_t(t.heads) * size_t(head_values), t.store);
    if (bad < 0) continue;
    fail(Status::invalid_argument,
         std::string(call) + ": layer " + std::to_string(layer) + ", " + t.name + " head " +
             std::to_string(bad / head_values) + ", token " + std::to_string(first_token + bad % head_values / d) +
             ", element " + std::to_string(bad % d) + ": " +
             describe_out_of_range(dtype, t.data, size_t(bad), t.store) + "; nothing was changed");
  }
}

void upload_static_set_to_gpu(LayerState& st, int head_dim, DType kv_storage) {
  if (!st.gpu) return;
  std::vector<RowsView> keys, values;
  for (const KvHeadState& kv : st.kv) {
    keys.push_back({kv.static_keys.data(), kv_storage, st.static_rows(), head_dim});
    values.push_back({kv.static_values.data(), kv_storage, st.static_rows(), head_dim});
  }
  st.gpu->upload_static_set(int(st.kv.size()), keys.data(), values.data(), st.static_capacity());
}

void share_traversal_codes(LayerState& st, const RuntimeConfig& config) {
  for (KvHeadState& kv : st.kv) kv.codes.reset();
  if (!st.global || st.q.empty() || !config.plan.traversal_codes || !config.share_traversal_codes) return;
  // Projected codes depend on each head's queries: every index keeps its own.
  if (uses_projected_codes(config.plan, config.layout.head_dim)) return;
  const int group = int(st.q.size() / st.kv.size());
  for (size_t h = 0; h < st.kv.size(); ++h) {
    KvHeadState& kv = st.kv[h];
    auto codes = std::make_shared<SharedTraversalCodes>();
    bool used = false;
    for (int i = 0; i < group; ++i) {
      KeyIndex* index = st.q[h * size_t(group) + size_t(i)].index.get();
      if (index && index->attach_traversal_codes(codes)) used = true;
    }
    if (!used) continue;  // e.g. exact indexes of a small store
    codes->update(kv.cpu_keys.view(), kv.cpu_keys.rows() - st.pending);
    kv.codes = std::move(codes);
  }
}

}  // namespace internal

Sequence::Sequence(std::shared_ptr<const Runtime> runtime)
    : runtime_(std::move(runtime)), step_(std::make_unique<PendingStep>()) {
  const auto& c = runtime_->config();
  const auto& m = c.layout;
  const int d = m.head_dim;
  layers_.resize(size_t(m.num_layers));
  for (int l = 0; l < m.num_layers; ++l) layers_[size_t(l)] = fresh_layer(l);
  q_f32_.resize(size_t(m.num_q_heads) * size_t(d));
  lse_scratch_.resize(size_t(m.num_q_heads));
  row_f32_.resize(size_t(d));
  pending_out_.resize(q_f32_.size());
  pending_lse_.resize(size_t(m.num_q_heads));
  if (runtime_->max_tail_samples() > 0) {
    tail_out_.resize(q_f32_.size());
    tail_lse_.resize(size_t(m.num_q_heads));
  }
  gpu_key_rows_.resize(size_t(m.num_kv_heads));
  gpu_value_rows_.resize(size_t(m.num_kv_heads));
  search_jobs_.resize(size_t(m.num_q_heads));
  profile_ns_ = std::make_unique<std::atomic<int64_t>[]>(internal::kProfileParts);
  for (int i = 0; i < internal::kProfileParts; ++i) profile_ns_[size_t(i)] = 0;
}

Sequence::~Sequence() {
  for (auto& b : builds_)  // a build still in flight writes into this sequence
    if (b->thread.joinable()) b->thread.join();
}

std::unique_ptr<LayerState> Sequence::fresh_layer(int l) const {
  const auto& c = runtime_->config();
  const auto& m = c.layout;
  const int d = m.head_dim;
  auto st = std::make_unique<LayerState>();
  st->global = m.layers[size_t(l)].global;
  if (st->global) {
    st->sinks = c.plan.sinks;
    st->window = c.plan.window;
  } else {  // sliding-window layer: the window alone, nothing offloaded
    st->sinks = 0;
    st->window = m.layers[size_t(l)].sliding_window > 0 ? m.layers[size_t(l)].sliding_window
                                                         : c.plan.window;
  }
  st->kv.resize(size_t(m.num_kv_heads));
  for (auto& kv : st->kv) {
    kv.cpu_keys = RowStore(c.kv_storage, d);
    kv.cpu_values = RowStore(c.kv_storage, d);
  }
  if (st->global) {
    st->q.resize(size_t(m.num_q_heads));
    for (auto& qh : st->q) {
      qh.pending_queries.reserve(size_t(c.insert_batch) * size_t(d));
      qh.pending_hints.reserve(size_t(c.insert_batch) * size_t(kInsertHints));
      qh.pending_hint_count.reserve(size_t(c.insert_batch));
      qh.retrieved_out.resize(size_t(d));
    }
  }
  return st;
}

LayerState& Sequence::layer_state(int layer, const char* what) {
  if (layer < 0 || layer >= int(layers_.size()))
    fail(Status::invalid_argument, std::string(what) + ": layer " + std::to_string(layer) +
                                       " out of range [0, " + std::to_string(layers_.size()) + ")");
  LayerState& st = *layers_[size_t(layer)];
  if (st.building)
    fail(Status::invalid_argument, std::string(what) + ": layer " + std::to_string(layer) +
                                       " is building in the background (prefill_wait first)");
  return st;
}

int64_t Sequence::refresh_indexes() {
  check_no_builds("refresh");
  const int d = runtime_->config().layout.head_dim;
  const int threads = runtime_->pool().threads();
  int64_t used = 0;
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    LayerState& st = *layers_[layer];
    if (!st.global || st.q.empty()) continue;
    const size_t group = st.q.size() / st.kv.size();
    for (size_t h = 0; h < st.q.size(); ++h) {
      QueryHeadState& qh = st.q[h];
      const int64_t n = int64_t(qh.refresh_queries.size()) / d;
      if (n == 0) continue;
      // A shared index is refreshed with every head's kept queries in turn.
      if (qh.index)
        runtime_->refresh_index(int(layer), *qh.index, st.kv[h / group].cpu_keys.view(), qh.refresh_queries.data(), n,
                                threads);
      used += n;
      std::vector<float>().swap(qh.refresh_queries);  // the memory too
    }
  }
  return used;
}

bool Sequence::prefilled(int layer) const {
  // A layer building in the background is not prefilled until prefill_wait.
  return layer >= 0 && layer < int(layers_.size()) && !layers_[size_t(layer)]->building &&
         layers_[size_t(layer)]->prefilled;
}

int64_t Sequence::tokens(int layer) const {
  if (layer < 0 || layer >= int(layers_.size())) return -1;
  return layers_[size_t(layer)]->building ? 0 : layers_[size_t(layer)]->tokens;
}

MemoryStats Sequence::memory() const {
  check_no_builds("memory");
  MemoryStats m;
  for (const auto& st : layers_) {
    for (const auto& kv : st->kv) {
      if (kv.codes) m.index_bytes += kv.codes->memory_bytes();
      m.scratch_bytes += kv.tail_sample.capacity() * sizeof(int32_t);
      m.static_set_bytes += kv.static_keys.capacity() + kv.static_values.capacity();
      m.cpu_kv_bytes += kv.cpu_keys.memory_bytes() + kv.cpu_values.memory_bytes();
      m.cpu_tokens += kv.cpu_keys.rows();
    }
    if (st->gpu) m.static_set_on_gpu = true;
    if (st->chunks)  // a prompt handed over in chunks, held until prefill_end
      for (const auto* heads : {&st->chunks->q, &st->chunks->k, &st->chunks->v})
        for (const auto& h : *heads) m.scratch_bytes += h.capacity();
    m.pending_tokens += st->pending * int64_t(st->kv.size());
    for (size_t h = 0; h < st->q.size(); ++h) {
      const QueryHeadState& qh = st->q[h];
      m.query_ring_bytes += qh.window_queries.capacity() * sizeof(float);
      if (qh.index && !st->shares_index(h)) m.index_bytes += qh.index->memory_bytes();
      m.query_ring_bytes += (qh.pending_queries.capacity() + qh.refresh_queries.capacity()) * sizeof(float) +
                            (qh.window_hints.capacity() + qh.window_hint_count.capacity() +
                             qh.pending_hints.capacity() + qh.pending_hint_count.capacity()) * sizeof(int32_t);
      if (qh.scratch) m.scratch_bytes += qh.scratch->memory_bytes();
      m.scratch_bytes += (qh.retrieved_out.capacity() +
                          qh.found.scores.capacity()) * sizeof(float) +
                         (qh.found.ids.capacity() + qh.seed_ids.capacity()) * sizeof(int32_t);
    }
  }
  m.scratch_bytes += (q_f32_.capacity() + lse_scratch_.capacity() + row_f32_.capacity() +
                      pending_out_.capacity() + pending_lse_.capacity() + tail_out_.capacity() +
                      tail_lse_.capacity()) * sizeof(float);
  for (const internal::TailPiece& t : tail_pieces_) m.scratch_bytes += t.memory_bytes();
  return m;
}

}  // namespace rattn
