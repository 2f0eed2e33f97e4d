// Sequence::decode and decode_batch: one decode step in three parts
// (begin_decode, the parallel loop's work items, end_decode), and the step's
// time profile.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "runtime/index/distance.h"
#include "runtime/index/projected_graph.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"
#include "runtime/sequence_impl.h"

namespace rattn {

using internal::check_qkv;
using internal::convert;
using internal::kInsertHints;
using internal::KvHeadState;
using internal::LayerState;
using internal::now_ns;
using internal::offset_rows;
using internal::QueryHeadState;
using internal::StepArgs;
using enum internal::ProfilePart;

void Sequence::check_decode(int layer, const void* q, const void* k, const void* v, DType dtype, const float* out) {
  const LayerState& st = layer_state(layer, "decode");
  if (!st.prefilled)
    fail(Status::invalid_argument, "decode: layer " + std::to_string(layer) + " was not prefilled" +
                                       (st.chunks ? " (its chunked prefill awaits prefill_end)" : ""));
  if (!q || !k || !v || !out) fail(Status::invalid_argument, "decode: q, k, v and out must not be null");
  check_qkv("decode", layer, runtime_->config(), st.tokens, 1, q, k, v, dtype);
}

void Sequence::decode(int layer, const void* q, const void* k, const void* v, DType dtype,
                      float* out, float* lse) {
  check_decode(layer, q, k, v, dtype, out);
  begin_decode(layer, q, k, v, dtype, out, lse);
  runtime_->pool().parallel_for(step_->items, [this](int64_t item) { run_decode_item(item); });
  if (step_->tail_items > 0)
    runtime_->pool().parallel_for(step_->tail_items, [this](int64_t item) { run_tail_item(item); });
  end_decode();
}

void Sequence::decode_batch(Sequence* const* seqs, int n, int layer, const void* const* q, const void* const* k,
                            const void* const* v, DType dtype, float* const* out, float* const* lse) {
  if (n < 0) fail(Status::invalid_argument, "decode_batch: n_sequences must be >= 0");
  if (n == 0) return;
  if (!seqs || !q || !k || !v || !out)
    fail(Status::invalid_argument, "decode_batch: the sequence, q, k, v and out arrays must not be null");
  // Every check before any sequence changes: a bad entry leaves all as they were.
  std::vector<const Sequence*> seen;
  seen.reserve(size_t(n));
  for (int i = 0; i < n; ++i) {
    auto which = [i] { return "decode_batch: sequence " + std::to_string(i); };  // built only for an error
    if (!seqs[i]) fail(Status::invalid_argument, which() + " is null");
    if (seqs[i]->runtime_ != seqs[0]->runtime_)
      fail(Status::invalid_argument, which() + " belongs to another context than sequence 0");
    seen.push_back(seqs[i]);
    try {
      seqs[i]->check_decode(layer, q[i], k[i], v[i], dtype, out[i]);
    } catch (const Error& e) {
      fail(e.status(), which() + ": " + e.what());
    }
  }
  std::sort(seen.begin(), seen.end());
  if (std::adjacent_find(seen.begin(), seen.end()) != seen.end())
    fail(Status::invalid_argument, "decode_batch: a sequence appears twice");
  for (int i = 0; i < n; ++i) seqs[i]->begin_decode(layer, q[i], k[i], v[i], dtype, out[i], lse ? lse[i] : nullptr);
  // One loop over every sequence's items, in three tiers: the GPU items
  // (queued first, so the GPU works while the CPU does), the long retrieval
  // items, then the per-KV-head items.
  std::vector<std::pair<Sequence*, int64_t>> order;
  for (int tier = 0; tier < 3; ++tier)
    for (int i = 0; i < n; ++i) {
      const PendingStep& p = *seqs[i]->step_;
      const int64_t first = tier == 0 ? 0 : tier == 1 ? p.gpu_items : p.gpu_items + p.args.retrieval_items;
      const int64_t last = tier == 0 ? p.gpu_items : tier == 1 ? p.gpu_items + p.args.retrieval_items : p.items;
      for (int64_t item = first; item < last; ++item) order.emplace_back(seqs[i], item);
    }
  seqs[0]->runtime_->pool().parallel_for(int64_t(order.size()), [&order](int64_t i) {
    order[size_t(i)].first->run_decode_item(order[size_t(i)].second);
  });
  // The tail estimates read every head's top-k: a second loop.
  order.clear();
  for (int i = 0; i < n; ++i)
    for (int64_t item = 0; item < seqs[i]->step_->tail_items; ++item) order.emplace_back(seqs[i], item);
  if (!order.empty())
    seqs[0]->runtime_->pool().parallel_for(int64_t(order.size()), [&order](int64_t i) {
      order[size_t(i)].first->run_tail_item(order[size_t(i)].second);
    });
  for (int i = 0; i < n; ++i) seqs[i]->end_decode();
}

void Sequence::begin_decode(int layer, const void* q, const void* k, const void* v, DType dtype, float* out,
                            float* lse) {
  LayerState& st = *layers_[size_t(layer)];
  const auto& c = runtime_->config();
  const int d = c.layout.head_dim;
  const int hq = c.layout.num_q_heads, hkv = c.layout.num_kv_heads, group = c.layout.group_size();
  const DType store_t = c.kv_storage;
  const size_t row_bytes = size_t(d) * dtype_size(store_t);

  const bool profiling = profiling_;
  const int64_t t_start = profiling ? now_ns() : 0;
  to_f32(dtype, q, q_f32_.data(), q_f32_.size());
  const int64_t position = st.tokens;  // the new token's

  // Where the new token goes in the static set, and which token it evicts.
  int64_t slot;
  int64_t ring_slot = -1;  // window slot of the new token (its query is kept there)
  bool evict = false;
  if (st.sinks_filled < st.sinks) {
    slot = st.sinks_filled++;
  } else if (st.window_filled < st.window) {
    ring_slot = st.window_filled++;
    slot = st.sinks + ring_slot;
  } else {
    ring_slot = st.ring_head;
    slot = st.sinks + ring_slot;
    st.ring_head = (st.ring_head + 1) % st.window;
    evict = true;
  }
  const bool retrieve = st.global && c.plan.top_k > 0;
  // The evicted token joins the pending set (attended exactly) until its batch
  // is inserted; without insertion it stays in the CPU store, unsearchable.
  const bool defer = retrieve && evict && c.insert_evicted;
  for (int h = 0; h < hkv; ++h) {
    KvHeadState& kv = st.kv[size_t(h)];
    uint8_t* ks = kv.static_keys.data() + size_t(slot) * row_bytes;
    uint8_t* vs = kv.static_values.data() + size_t(slot) * row_bytes;
    if (evict && st.global) {
      kv.cpu_keys.append_raw(ks, 1);
      kv.cpu_values.append_raw(vs, 1);
    }
    convert(dtype, offset_rows(k, h, d, dtype), store_t, ks, size_t(d), row_f32_.data());
    convert(dtype, offset_rows(v, h, d, dtype), store_t, vs, size_t(d), row_f32_.data());
  }
  if (st.global && ring_slot >= 0) {  // a token that went into the sinks keeps no query
    for (int h = 0; h < hq; ++h) {
      QueryHeadState& qh = st.q[size_t(h)];
      float* kept = qh.window_queries.data() + size_t(ring_slot) * size_t(d);
      if (defer) {
        qh.pending_queries.insert(qh.pending_queries.end(), kept, kept + d);
        const int32_t* hints = qh.window_hints.data() + size_t(ring_slot) * size_t(kInsertHints);
        qh.pending_hints.insert(qh.pending_hints.end(), hints, hints + kInsertHints);
        qh.pending_hint_count.push_back(qh.window_hint_count[size_t(ring_slot)]);
      }
      std::memcpy(kept, q_f32_.data() + size_t(h) * size_t(d), size_t(d) * sizeof(float));
      qh.window_hint_count[size_t(ring_slot)] = 0;  // set by this step's search
    }
  }
  if (defer) ++st.pending;
  ++st.tokens;
  // A full batch is inserted before this step's searches, so this step
  // attends to it through the indexes, not as pending tokens.
  // Layers insert at staggered token positions (layer l when tokens + l * B /
  // layers is a multiple of B), so that with many layers each token carries
  // about the same share of insertion instead of every layer's batch landing
  // on one token. A full batch is always inserted.
  const int64_t batch = c.insert_batch;
  const int64_t stagger = int64_t(layer) * batch / std::max<int64_t>(1, int64_t(layers_.size()));
  const bool batch_due = st.pending >= batch || (st.tokens + stagger) % batch == 0;
  const bool insert_now = retrieve && c.insert_evicted && st.pending > 0 && batch_due;
  const int64_t pending_attended = insert_now ? 0 : st.pending;
  // Shared traversal codes take the rows inserted this step here, before the
  // work items insert and search: no search may run while they are written.
  int64_t codes_ns = 0;
  if (insert_now) {
    const int64_t t_codes = profiling ? now_ns() : 0;
    for (KvHeadState& kv : st.kv)
      if (kv.codes) kv.codes->update(kv.cpu_keys.view(), kv.cpu_keys.rows());
    if (profiling) codes_ns = now_ns() - t_codes;
  }
  // Tail estimate: one sample per KV head of the offloaded tokens that are
  // neither pending nor static (the set U the top-k is drawn from), shared by
  // the group's query heads.
  const LayerRetrieval& retrieval = runtime_->layer_retrieval(layer);
  const int64_t tail_rows = st.global && retrieval.tail_samples > 0 ? st.kv[0].cpu_keys.rows() - pending_attended : 0;
  const bool tail = tail_rows > 0;
  int64_t tail_draw_ns = 0;
  if (tail) {
    const int64_t t_draw = profiling ? now_ns() : 0;
    for (int h = 0; h < hkv; ++h)
      internal::draw_tail_sample(c.seed, layer, h, position, tail_rows, retrieval.tail_samples,
                                 st.kv[size_t(h)].tail_sample);
    if (profiling) tail_draw_ns = now_ns() - t_draw;
  }

  // Static set on the GPU: the new token's row replaces the slot it took in
  // the host copy (a sink, or the window ring's oldest), one row per KV head;
  // the set is uploaded whole only at prefill and load. Both are queued by
  // the loop's first item below.
  GpuAttention* gpu = st.gpu.get();
  if (gpu) {
    for (int h = 0; h < hkv; ++h) {
      gpu_key_rows_[size_t(h)] = st.kv[size_t(h)].static_keys.data() + size_t(slot) * row_bytes;
      gpu_value_rows_[size_t(h)] = st.kv[size_t(h)].static_values.data() + size_t(slot) * row_bytes;
    }
  }
  // Retrieval items: `per_item` query heads of one group each (their
  // insertions, then their searches together through search_many()).
  // A shared graph (one per KV head) takes its group in one item: its
  // insertions write it, and the group's searches walk it in lockstep.
  const bool shared = group > 1 && st.global && !st.q.empty() && st.shares_index(1);
  const int per_item = shared                      ? group
                       : c.searches_per_item > 0 ? c.searches_per_item
                                                 : searches_per_item(group, hkv, runtime_->pool().threads());
  const int64_t t_loop = profiling ? now_ns() : 0;

  // Everything the loop body reads, behind one pointer (the closures fit
  // std::function's inline buffer: the step allocates nothing here).
  PendingStep& p = *step_;
  p.args = StepArgs{
      &st,
      &runtime_->kernels(),
      gpu,
      slot,
      gpu_key_rows_.data(),
      gpu_value_rows_.data(),
      q_f32_.data(),
      out,
      lse ? lse : lse_scratch_.data(),
      pending_out_.data(),
      pending_lse_.data(),
      tail ? tail_out_.data() : nullptr,
      tail_lse_.data(),
      search_jobs_.data(),
      profiling ? profile_ns_.get() : nullptr,
      st.static_rows(),
      retrieval.top_k,
      pending_attended,
      insert_now ? st.pending : 0,
      st.global ? ring_slot : -1,
      tail_rows,
      d,
      group,
      retrieve ? hq / per_item : 0,
      per_item,
      store_t,
      &runtime_->decode_search_params(layer),
      runtime_->decode_search(layer).seeds,
      internal::refresh_stride(c.plan.refresh_sample),
      shared};
  p.retrieve = retrieve;
  p.insert_now = insert_now;
  p.tail = tail;
  p.profiling = profiling;
  p.hq = hq;
  p.t_start = t_start;
  p.t_loop = t_loop;
  p.codes_ns = codes_ns;
  p.tail_draw_ns = tail_draw_ns;
  // Items [0, retrieval_items): `per_item` query heads of one group: their
  // insertions, their searches (one search_many() call) and their top-k
  // attentions (the long items, claimed first). Then one item per KV head:
  // its whole query group against the static set (CPU kernels, one call, so
  // the group's static K/V are read once) and against the pending tokens.
  // With a GPU, item 0 queues the static set's row update and attention
  // there (claimed first: the GPU works while the CPU's items run; the
  // results are collected after the loop), and the others shift by one.
  p.gpu_items = gpu ? 1 : 0;
  p.items = p.gpu_items + p.args.retrieval_items + hkv;
  // With retrieval, each KV head's tail estimate runs after the searches, in
  // pieces of its sample so that a few KV heads still fill the threads.
  p.tail_pieces = 0;
  p.tail_items = 0;
  if (tail && retrieve) {
    const int64_t n_sample = int64_t(st.kv[0].tail_sample.size());
    const int64_t want = (runtime_->pool().threads() + hkv - 1) / hkv;
    p.tail_pieces = int(std::max<int64_t>(1, std::min(want, n_sample / internal::kTailPieceRows)));
    p.tail_items = int64_t(hkv) * p.tail_pieces;
    if (tail_pieces_.size() < size_t(p.tail_items)) tail_pieces_.resize(size_t(p.tail_items));
  }
}

void Sequence::run_tail_item(int64_t item) {
  const PendingStep& p = *step_;
  const StepArgs* a = &p.args;
  const int64_t t = a->profile_ns ? now_ns() : 0;
  const int kvh = int(item / p.tail_pieces), piece = int(item % p.tail_pieces);
  const KvHeadState& kv = a->st->kv[size_t(kvh)];
  const size_t first = size_t(kvh) * size_t(a->group);
  internal::TailPiece& piece_state = tail_pieces_[size_t(item)];
  piece_state.hits.resize(size_t(a->group));
  for (int g = 0; g < a->group; ++g) {
    const SearchResult& found = a->st->q[first + size_t(g)].found;
    piece_state.hits[size_t(g)] = {found.ids.data(), found.scores.data(), int(found.ids.size())};
  }
  const int64_t n = int64_t(kv.tail_sample.size());
  const int64_t lo = n * piece / p.tail_pieces, hi = n * (piece + 1) / p.tail_pieces;
  internal::tail_piece(*a->kernels, a->q + first * size_t(a->d), a->group, kv.cpu_keys.view(), kv.cpu_values.view(),
                       kv.tail_sample.data() + lo, int(hi - lo), piece_state.hits.data(), piece_state);
  if (a->profile_ns) a->profile_ns[kTail].fetch_add(now_ns() - t, std::memory_order_relaxed);
}

void Sequence::run_decode_item(int64_t item) {
  const StepArgs* a = &step_->args;
  const int64_t gpu_items = step_->gpu_items;
  const int d = a->d;
  // Adds the time since `t` to part `part` when profiling; returns now.
  auto lap = [a](int64_t t, int part) {
    if (!a->profile_ns) return int64_t(0);
    const int64_t t1 = now_ns();
    a->profile_ns[part].fetch_add(t1 - t, std::memory_order_relaxed);
    return t1;
  };
  // Adds `n` to count `part` when profiling.
  auto count = [a](int part, int64_t n) {
    if (a->profile_ns) a->profile_ns[part].fetch_add(n, std::memory_order_relaxed);
  };
  int64_t t = a->profile_ns ? now_ns() : 0;
  if (item < gpu_items) {
    a->gpu->update_static_row(a->gpu_row, a->gpu_key_rows, a->gpu_value_rows);
    a->gpu->begin_partial_attention(a->q);
    lap(t, kStatic);
    return;
  }
  item -= gpu_items;
  if (item >= a->retrieval_items) {
    const int kvh = int(item - a->retrieval_items);
    const KvHeadState& kv = a->st->kv[size_t(kvh)];
    const size_t first = size_t(kvh) * size_t(a->group);
    const float* q = a->q + first * size_t(d);
    if (!a->gpu) {
      const RowsView static_k{kv.static_keys.data(), a->store_t, a->n_static, d};
      const RowsView static_v{kv.static_values.data(), a->store_t, a->n_static, d};
      a->kernels->dense_attention(q, a->group, static_k, static_v, 0, a->n_static, a->out + first * size_t(d),
                                  a->lse + first);
      count(kStaticRows, a->n_static);
    }
    if (a->pending_attended > 0) {
      const RowsView cpu_k = kv.cpu_keys.view();
      a->kernels->dense_attention(q, a->group, cpu_k, kv.cpu_values.view(), cpu_k.rows - a->pending_attended,
                                  cpu_k.rows, a->pending_out + first * size_t(d), a->pending_lse + first);
      count(kStaticRows, a->pending_attended);
    }
    t = lap(t, kStatic);
    if (a->tail_out && a->retrieval_items == 0) {
      // No retrieval: the sample stands for every offloaded token, the same
      // set for the whole group, so one kernel call scores it for all.
      const std::vector<int32_t>& sample = kv.tail_sample;
      a->kernels->partial_attention(q, a->group, kv.cpu_keys.view(), kv.cpu_values.view(), sample.data(),
                                    int(sample.size()), a->tail_out + first * size_t(d), a->tail_lse + first);
      const float shift = float(std::log(double(a->tail_rows) / double(sample.size())));
      for (int g = 0; g < a->group; ++g) a->tail_lse[first + size_t(g)] += shift;
      lap(t, kTail);
    }
    return;
  }
  const int first = int(item) * a->per_item;  // query heads [first, first + per_item), one group
  const KvHeadState& kv = a->st->kv[size_t(first / a->group)];
  const RowsView cpu_k = kv.cpu_keys.view();
  // A shared graph (its item holds the whole group) takes each token once,
  // in row order, with the query and hits of the group's heads in turn: its
  // training queries are the group's.
  const bool shared = a->shared_index;
  for (int64_t i = 0; shared && i < a->pending_inserted; ++i) {
    const int64_t row = cpu_k.rows - a->pending_inserted + i;
    QueryHeadState& qh = a->st->q[size_t(first + int(row % a->group))];
    qh.index->insert_hinted(int32_t(row), qh.pending_queries.data() + size_t(i) * size_t(d), cpu_k,
                            qh.pending_hints.data() + size_t(i) * size_t(kInsertHints), qh.pending_hint_count[size_t(i)]);
  }
  for (int h = first; h < first + a->per_item; ++h) {
    QueryHeadState& qh = a->st->q[size_t(h)];
    for (int64_t i = 0; i < a->pending_inserted; ++i) {
      const int64_t row = cpu_k.rows - a->pending_inserted + i;
      const float* own_query = qh.pending_queries.data() + size_t(i) * size_t(d);
      if (!shared)
        qh.index->insert_hinted(int32_t(row), own_query, cpu_k,
                                qh.pending_hints.data() + size_t(i) * size_t(kInsertHints),
                                qh.pending_hint_count[size_t(i)]);
      if (a->refresh_stride > 0 && row % a->refresh_stride == 0) {
        std::vector<float>& kept = qh.refresh_queries;
        if (int64_t(kept.size()) >= internal::kMaxRefreshQueries * d)  // keep the newest half
          kept.erase(kept.begin(), kept.begin() + std::ptrdiff_t(internal::kMaxRefreshQueries / 2 * d));
        kept.insert(kept.end(), own_query, own_query + d);
      }
    }
    qh.retrieved_lse = -std::numeric_limits<float>::infinity();
  }
  if (a->pending_inserted > 0) {
    count(kInserted, a->pending_inserted * (shared ? 1 : a->per_item));  // once per index written
    t = lap(t, kInsert);
  }
  // The group's indexes hold the same keys (every insertion goes to all of
  // them), so one SearchParams serves the jobs; a head whose index size
  // differs (never expected) is searched on its own.
  const int64_t indexed = a->st->q[size_t(first)].index->size();
  SearchParams sp = *a->search;
  sp.k = int(std::min<int64_t>(a->top_k, indexed));
  sp.queue_length = std::max(a->search->queue_length, sp.k);
  int n_jobs = 0;
  SearchJob* jobs = a->jobs + first;
  for (int h = first; h < first + a->per_item; ++h) {
    QueryHeadState& qh = a->st->q[size_t(h)];
    const float* q = a->q + size_t(h) * size_t(d);
    const int64_t own = qh.index->size();
    // Warm start: this head's previous results (consecutive queries share
    // much of their top-k) move to seed_ids, since the search rewrites
    // `found`; every path below rewrites or clears it.
    qh.seed_ids.swap(qh.found.ids);
    const int n_seeds = int(std::min(size_t(std::max(a->search_seeds, 0)), qh.seed_ids.size()));
    if (own == indexed) {
      if (indexed > 0)
        jobs[n_jobs++] = SearchJob{qh.index.get(), q, qh.scratch.get(), &qh.found, qh.seed_ids.data(), n_seeds};
    } else if (own > 0) {
      SearchParams own_sp = sp;
      own_sp.seeds = qh.seed_ids.data();
      own_sp.num_seeds = n_seeds;
      own_sp.k = int(std::min<int64_t>(a->top_k, own));
      own_sp.queue_length = std::max(a->search->queue_length, own_sp.k);  // traversal_codes copied from sp
      qh.index->search(q, cpu_k, own_sp, *qh.scratch, qh.found);
    } else {
      qh.found.ids.clear();
    }
  }
  const RowsView cpu_v = kv.cpu_values.view();
  if (indexed == 0) {  // nothing retrieved: the tail items take every row
    for (int h = first; h < first + a->per_item; ++h) a->st->q[size_t(h)].found.ids.clear();
    return;
  }
  search_many(jobs, n_jobs, cpu_k, sp);
  t = lap(t, kSearch);
  if (a->profile_ns) {
    int64_t scored = 0, rows = 0;
    for (int h = first; h < first + a->per_item; ++h) {
      const SearchResult& found = a->st->q[size_t(h)].found;
      scored += found.keys_scored;
      rows += int64_t(found.ids.size());
    }
    count(kKeysScored, scored);
    count(kRetrievedRows, rows);
  }
  // The searches read keys only: the top-k's value rows are far from the
  // cache. Requesting all of them first lets their misses overlap instead
  // of each attention waiting on its rows one by one.
  for (int h = first; h < first + a->per_item; ++h)
    for (const int32_t id : a->st->q[size_t(h)].found.ids) internal::prefetch_row(cpu_v, id);
  for (int h = first; h < first + a->per_item; ++h) {
    QueryHeadState& qh = a->st->q[size_t(h)];
    if (qh.index->size() == 0) continue;
    if (a->ring_slot >= 0) {  // this token's query is kept: so are its hits, for its insertion
      const int n = int(std::min<size_t>(qh.found.ids.size(), size_t(kInsertHints)));
      std::copy_n(qh.found.ids.data(), n, qh.window_hints.data() + size_t(a->ring_slot) * size_t(kInsertHints));
      qh.window_hint_count[size_t(a->ring_slot)] = n;
    }
    a->kernels->partial_attention(a->q + size_t(h) * size_t(d), 1, cpu_k, cpu_v,
                                  qh.found.ids.data(), int(qh.found.ids.size()), qh.retrieved_out.data(),
                                  &qh.retrieved_lse);
  }
  lap(t, kRetrievedAttention);
}

void Sequence::end_decode() {
  const PendingStep& p = *step_;
  LayerState& st = *p.args.st;
  const int hq = p.hq, d = p.args.d;
  const bool profiling = p.profiling;
  float* out = p.args.out;
  GpuAttention* gpu = p.args.gpu;
  const int64_t pending_attended = p.args.pending_attended;
  float* lse_out = p.args.lse;
  if (gpu) {  // the static set's partial; its wait counts as static-set time
    const int64_t t_wait = profiling ? now_ns() : 0;
    gpu->finish_partial_attention(out, lse_out);
    if (profiling) profile_ns_[kStatic] += now_ns() - t_wait;
  }
  const int64_t t_merge = profiling ? now_ns() : 0;
  // Merges: static set + pending tokens + each head's retrieved tokens.
  if (pending_attended > 0) merge_partials_ln(out, lse_out, pending_out_.data(), pending_lse_.data(), hq, d);
  if (p.retrieve) {
    for (int h = 0; h < hq; ++h) {
      QueryHeadState& qh = st.q[size_t(h)];
      merge_partials_ln(out + size_t(h) * size_t(d), lse_out + h, qh.retrieved_out.data(), &qh.retrieved_lse, 1, d);
    }
  }
  if (p.tail_items > 0) {
    const int64_t t_finish = profiling ? now_ns() : 0;
    const int group = p.args.group;
    for (int64_t kvh = 0; kvh < p.tail_items / p.tail_pieces; ++kvh) {
      const size_t first = size_t(kvh) * size_t(group);
      const internal::TailPiece* pieces = tail_pieces_.data() + kvh * p.tail_pieces;
      internal::tail_finish(pieces, p.tail_pieces, group, d, p.args.tail_rows, pieces->hits.data(),
                            tail_out_.data() + first * size_t(d), tail_lse_.data() + first);
    }
    if (profiling) profile_ns_[kTail] += now_ns() - t_finish;
  }
  if (p.tail) merge_partials_ln(out, lse_out, tail_out_.data(), tail_lse_.data(), hq, d);
  if (p.insert_now) {
    st.pending = 0;
    for (auto& qh : st.q) {
      qh.pending_queries.clear();
      qh.pending_hints.clear();
      qh.pending_hint_count.clear();
    }
  }
  if (profiling) {
    profile_ns_[kMergedPartials] += int64_t(hq) * ((pending_attended > 0) + p.retrieve + p.tail);
    const int64_t t_end = now_ns();
    profile_ns_[kPrepare] += p.t_loop - p.t_start - p.codes_ns - p.tail_draw_ns;
    profile_ns_[kInsert] += p.codes_ns;  // encoding the inserted rows
    profile_ns_[kTail] += p.tail_draw_ns;
    profile_ns_[kMerge] += t_end - t_merge;
    profile_ns_[kTotal] += t_end - p.t_start;
    profile_ns_[kSteps] += 1;
  }
}

// Keys the projected-graph indexes of `layers` scored in insertions since
// their build or load, a shared index once (-1: none of them is a projected
// graph). Layers building in the background are skipped: their thread
// writes them, and a fresh build has inserted nothing.
static int64_t insert_keys_scored(const std::vector<std::unique_ptr<LayerState>>& layers) {
  int64_t sum = -1;
  for (const auto& st : layers) {
    if (!st || st->building) continue;
    for (size_t h = 0; h < st->q.size(); ++h) {
      if (!st->q[h].index || st->shares_index(h)) continue;
      const int64_t n = projected_graph_insert_keys_scored(*st->q[h].index);  // -1: another index kind
      if (n >= 0) sum = std::max<int64_t>(sum, 0) + n;
    }
  }
  return sum;
}

void Sequence::set_profiling(bool on) {
  profiling_ = on;
  for (int i = 0; i < internal::kProfileParts; ++i) profile_ns_[size_t(i)] = 0;
  if (on) profile_ns_[kInsertScoredBase] = insert_keys_scored(layers_);
}

DecodeProfile Sequence::profile() const {
  auto ms = [&](int part) { return 1e-6 * double(profile_ns_[size_t(part)].load()); };
  DecodeProfile p;
  p.steps = profile_ns_[kSteps].load();
  p.total_ms = ms(kTotal);
  p.prepare_ms = ms(kPrepare);
  p.insert_ms = ms(kInsert);
  p.search_ms = ms(kSearch);
  p.retrieved_attention_ms = ms(kRetrievedAttention);
  p.static_ms = ms(kStatic);
  p.merge_ms = ms(kMerge);
  p.tail_ms = ms(kTail);
  p.static_rows = profile_ns_[kStaticRows].load();
  p.keys_scored = profile_ns_[kKeysScored].load();
  p.retrieved_rows = profile_ns_[kRetrievedRows].load();
  p.merged_partials = profile_ns_[kMergedPartials].load();
  p.inserted = profile_ns_[kInserted].load();
  const int64_t base = profile_ns_[kInsertScoredBase].load(), now = insert_keys_scored(layers_);
  p.insert_keys_scored = base >= 0 && now >= 0 ? now - base : -1;
  return p;
}

}  // namespace rattn
