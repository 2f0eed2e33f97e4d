#include "runtime/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <mutex>

#include "core/error.h"
#include "core/finite.h"
#include "core/hash.h"
#include "core/memory.h"
#include "dsl/memory_plan.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/distance.h"
#include "runtime/kernel_choice.h"
#include "runtime/layer_state.h"
#include "core/log.h"
#include "runtime/index/projected_graph.h"

namespace rattn {

constexpr int kProfileParts = 9;

using internal::kInsertHints;
using internal::KvHeadState;
using internal::LayerState;
using internal::QueryHeadState;

namespace {

// Below this many offloaded keys an exact scan is as fast as a graph search
// and needs no build.
constexpr int64_t kMinGraphKeys = 2048;

// Converts n elements from `src_t` to `dst_t`; `tmp` holds at least n floats
// when a conversion through fp32 is needed.
void convert(DType src_t, const void* src, DType dst_t, void* dst, size_t n, float* tmp) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, n * dtype_size(src_t));
  } else if (src_t == DType::f32) {
    from_f32(dst_t, static_cast<const float*>(src), dst, n);
  } else if (dst_t == DType::f32) {
    to_f32(src_t, src, static_cast<float*>(dst), n);
  } else {
    to_f32(src_t, src, tmp, n);
    from_f32(dst_t, tmp, dst, n);
  }
}

const uint8_t* offset_rows(const void* base, int64_t rows, int d, DType t) {
  return static_cast<const uint8_t*>(base) + size_t(rows) * size_t(d) * dtype_size(t);
}

// Refuses one head's rows when a value is non-finite, beyond 2^40 or beyond
// the storage dtype (core/finite.h), naming where; run before anything
// changes, so a refused call leaves the sequence as it was. Queries are kept
// in fp32, K/V in `store_t`.
void check_head_rows(const std::string& call, const char* tensor, int head, const void* rows, int64_t first_token,
                     int64_t n, int d, DType src_t, DType store_t) {
  const int64_t bad = first_out_of_range(src_t, rows, size_t(n) * size_t(d), store_t);
  if (bad < 0) return;
  fail(Status::invalid_argument, call + ", " + tensor + " head " + std::to_string(head) + ", token " +
                                     std::to_string(first_token + bad / d) + ", element " + std::to_string(bad % d) +
                                     ": " + describe_out_of_range(src_t, rows, size_t(bad), store_t) +
                                     "; nothing was changed");
}

// q [hq][n][d], k and v [hkv][n][d] as per-head row pointers.
void check_prefill_rows(const std::string& call, const RuntimeConfig& c, int64_t first_token, int64_t n,
                        const void* const* q, const void* const* k, const void* const* v, DType dtype) {
  const int d = c.layout.head_dim;
  for (int h = 0; h < c.layout.num_q_heads; ++h)
    check_head_rows(call, "q", h, q[h], first_token, n, d, dtype, DType::f32);
  for (int h = 0; h < c.layout.num_kv_heads; ++h) {
    check_head_rows(call, "k", h, k[h], first_token, n, d, dtype, c.kv_storage);
    check_head_rows(call, "v", h, v[h], first_token, n, d, dtype, c.kv_storage);
  }
}

// DecodeProfile's parts, as indexes into Sequence::profile_ns_.
enum ProfilePart : int { kTotal, kPrepare, kInsert, kSearch, kRetrievedAttention, kStatic, kMerge, kSteps, kTail };

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void validate_config(const RuntimeConfig& c) {
  const auto& m = c.layout;
  auto bad = [](const std::string& what) { fail(Status::invalid_argument, what); };
  if (m.num_layers <= 0) bad("model layout: num_layers must be > 0");
  if (m.num_q_heads <= 0) bad("model layout: num_q_heads must be > 0");
  if (m.num_kv_heads <= 0) bad("model layout: num_kv_heads must be > 0");
  if (m.num_q_heads % m.num_kv_heads != 0)
    bad("model layout: num_q_heads (" + std::to_string(m.num_q_heads) +
        ") must be a multiple of num_kv_heads (" + std::to_string(m.num_kv_heads) + ")");
  if (m.head_dim <= 0 || m.head_dim > 1024) bad("model layout: head_dim must be in [1, 1024]");
  if (m.layers.size() != size_t(m.num_layers))
    bad("model layout: " + std::to_string(m.layers.size()) + " layer specs for " +
        std::to_string(m.num_layers) + " layers");
  const auto& p = c.plan;
  if (p.sinks < 0) bad("plan: sinks must be >= 0");
  if (p.window < 1) bad("plan: window must be >= 1 (the window holds the new token)");
  if (p.top_k < 0) bad("plan: top_k must be >= 0");
  if (p.top_k > std::numeric_limits<int32_t>::max()) bad("plan: top_k too large");
  if (p.search_queue < 1) bad("plan: search_queue must be >= 1");
  if (p.graph_degree < 1) bad("plan: graph_degree must be >= 1");
  if (p.query_neighbors < 1) bad("plan: query_neighbors must be >= 1");
  if (!(p.build_sample > 0 && p.build_sample <= 1)) bad("plan: build_sample must be in (0, 1]");
  if (c.insert_batch < 1 || c.insert_batch > (1 << 16)) bad("insert_batch must be in [1, 65536]");
  if (p.insert_queue < 1) bad("plan: insert_queue must be >= 1");
  if (p.insert_pivots < 0 || p.insert_reverse < 0 || p.insert_key_queue < 0)
    bad("plan: insert_pivots, insert_reverse and insert_key_queue must be >= 0");
  if (p.search_patience < 0) bad("plan: search_patience must be >= 0");
  if (p.code_dims < 0 || p.code_dims > m.head_dim) bad("plan: code_dims must be in [0, head_dim]");
  if (p.code_coarse_dims < 0 || p.code_coarse_dims > p.code_dims) bad("plan: code_coarse_dims must be in [0, code_dims]");
  if (p.search_seeds < 0) bad("plan: search_seeds must be >= 0");
  if (p.search_expand_first < 0 || p.search_full_expand < 0)
    bad("plan: search_expand_first and search_full_expand must be >= 0");
  for (const auto& [layer, own] : p.layer_search) {
    const std::string where = "plan: layer " + std::to_string(layer) + ": ";
    if (layer < 0 || layer >= m.num_layers) bad(where + "no such layer (the model has " + std::to_string(m.num_layers) + ")");
    if (!m.layers[size_t(layer)].global) bad(where + "a sliding-window layer has no decode searches");
    for (const auto& kv : own) {
      const auto& keys = plan_keys::layer_search_keys;
      if (std::find_if(std::begin(keys), std::end(keys), [&](const char* k) { return kv.first == k; }) == std::end(keys))
        bad(where + "'" + kv.first + "' cannot be set per layer");
    }
    const DecodeSearch s = p.decode_search(layer);
    if (s.queue < 1) bad(where + "search_queue must be >= 1");
    if (s.patience < 0 || s.seeds < 0 || s.expand_first < 0 || s.full_expand < 0)
      bad(where + "search_patience, search_seeds, search_expand_first and search_full_expand must be >= 0");
  }
  if (p.tail_samples < 0) bad("plan: tail_samples must be >= 0");
  if (p.shift_queries < 0) bad("plan: shift_queries must be >= 0");
  if (!(p.refresh_sample >= 0 && p.refresh_sample <= 1)) bad("plan: refresh_sample must be in [0, 1]");
  if (p.shift_queries > 0 && p.shift_span < 8) bad("plan: shift_span must be >= 8");
  if (p.shift_queries > 0 && p.causal) bad("plan: shift_queries does not combine with causal training lists");
  if (p.shift_queries > 0 && m.head_dim % 2 != 0) bad("plan: shift_queries needs an even head_dim (RoPE pairs)");
  if (c.searches_per_item < 0 || (c.searches_per_item > 0 && m.group_size() % c.searches_per_item != 0))
    bad("searches_per_item must be 0 (automatic) or divide the group size (" + std::to_string(m.group_size()) + ")");
}

int searches_per_item(int group, int kv_heads, int threads) {
  for (int s = group; s > 1; --s)
    if (group % s == 0 && int64_t(kv_heads) * (group / s) >= threads) return s;
  return 1;
}

namespace internal {

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

Runtime::Runtime(RuntimeConfig config) : config_(std::move(config)) {
  validate_config(config_);
  for (int layer = 0; layer < config_.layout.num_layers; ++layer) {
    decode_searches_.push_back(config_.plan.decode_search(layer));
    decode_search_params_.push_back(internal::decode_search_params(config_.plan, decode_searches_.back(), 0));
  }
  KernelSpec spec;
  spec.head_dim = config_.layout.head_dim;
  spec.group_size = config_.layout.group_size();
  spec.kv_dtype = config_.kv_storage;
  KernelChoice choice = choose_cpu_kernels(spec, config_.kernels, config_.plan);
  kernels_ = std::move(choice.attention);
  index_kernels_ = std::move(choice.index_distances);
  kernels_name_ = std::move(choice.name);
  pool_ = std::make_unique<ThreadPool>(config_.threads);
  std::string why_not;
  if (!config_.use_gpu) {
    gpu_status_ = "GPU not requested: static set on the CPU kernels";
  } else if (config_.gpu_factory) {
    gpu_ = true;
    gpu_status_ = "static set on a stand-in GPU (RuntimeConfig::gpu_factory)";
  } else if (gpu_present(&why_not)) {
    // The CUDA generator covers fewer specs than the CPU kernels (fp16/bf16
    // storage, some head dims, groups up to 8): a spec it rejects keeps the
    // static set on the CPU instead of failing every prefill.
    try {
      const std::unique_ptr<GpuAttention> probe = open_gpu_attention(kernels_->spec(), gpu_options(int64_t(config_.plan.sinks) + config_.plan.window));
      gpu_ = probe != nullptr;
      gpu_status_ = gpu_ ? "GPU present: static set on the GPU (" + probe->device_name() + ", " +
                               probe->kernel_name() + ")"
                         : "GPU present but not usable: static set on the CPU kernels";
    } catch (const Error& e) {
      gpu_status_ = std::string("GPU present, but its kernels do not cover this model (") + e.what() +
                    "): static set on the CPU kernels";
    }
  } else {
    gpu_status_ = "no GPU (" + why_not + "): static set on the CPU kernels";
  }
  log_message(LogLevel::debug, "runtime: " + gpu_status_);
}

std::unique_ptr<GpuAttention> Runtime::open_gpu_stream(int64_t static_rows) const {
  if (!gpu_) return nullptr;
  KernelSpec spec = kernels_->spec();
  if (config_.gpu_factory) return config_.gpu_factory(spec);
  return open_gpu_attention(spec, gpu_options(static_rows));
}

GpuAttentionOptions Runtime::gpu_options(int64_t static_rows) const {
  GpuAttentionOptions options;
  options.knobs = config_.plan.kernel;  // the plan's cuda.* knobs (the generator skips the others)
  if (!options.knobs.count("cuda.splits"))
    options.knobs["cuda.splits"] =
        static_set_splits(static_rows, config_.layout.num_kv_heads);
  return options;
}

namespace internal {
GraphBuildParams graph_build_params(const ConcretePlan& plan) {
  GraphBuildParams gp;
  gp.degree = plan.graph_degree;
  gp.query_neighbors = plan.query_neighbors;
  gp.sample_fraction = plan.build_sample;
  gp.build_queue = plan.build_queue;
  gp.pivot_capacity = plan.pivot_capacity;
  gp.pivots_per_query = plan.pivots_per_query;
  gp.fill_two_hop = plan.two_hop_fill;
  gp.extra_slots = plan.extra_slots;
  gp.entry_points = plan.entry_points;
  gp.repair_fraction = plan.repair_fraction;
  gp.key_metric = plan.key_metric;
  gp.key_metric_ridge = plan.key_metric_ridge;
  gp.key_metric_passes = plan.key_metric_passes;
  // Training query row t is token t; key row 0 is the first token after
  // the sinks (a graph is only built when the prefill filled them).
  gp.causal = plan.causal;
  gp.causal_key_offset = plan.sinks;
  gp.insert_queue = plan.insert_queue;
  gp.insert_pivots = plan.insert_pivots;
  gp.insert_reverse = plan.insert_reverse;
  gp.insert_key_queue = plan.insert_key_queue;
  gp.shift_queries = plan.shift_queries;
  gp.shift_span = plan.shift_span;
  return gp;
}

SearchParams decode_search_params(const ConcretePlan& plan, const DecodeSearch& s, int k) {
  SearchParams sp;
  sp.k = k;
  sp.queue_length = std::max(s.queue, k);
  sp.traversal_codes = plan.traversal_codes;
  sp.code_dims = plan.code_dims;
  sp.code_coarse_dims = plan.code_coarse_dims;
  sp.patience = s.patience;
  sp.expand_first = s.expand_first;
  sp.full_expand_rank = s.full_expand;
  return sp;
}

GraphBuildParams graph_build_params(const ConcretePlan& plan, const ModelLayout& layout, int layer) {
  GraphBuildParams gp = graph_build_params(plan);
  if (layer >= 0 && size_t(layer) < layout.layers.size()) gp.rope_base = layout.layers[size_t(layer)].rope_base;
  gp.rope_interleaved = layout.rope_style == RopeStyle::gptj;
  // Projected codes are fitted to the training queries' second moment.
  gp.keep_query_moment = uses_projected_codes(plan, layout.head_dim);
  return gp;
}

void draw_tail_sample(uint64_t seed, int layer, int kv_head, int64_t position, int64_t rows, int64_t samples,
                      std::vector<int32_t>& ids) {
  ids.clear();
  if (rows <= 0 || samples <= 0) return;
  if (samples >= rows) {
    ids.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t(r);
    return;
  }
  uint64_t h = mix64(seed + kGoldenGamma);
  h = mix64((h ^ uint64_t(uint32_t(layer))) + kGoldenGamma);
  h = mix64((h ^ uint64_t(uint32_t(kv_head))) + kGoldenGamma);
  h = mix64((h ^ uint64_t(position)) + kGoldenGamma);
  const double stride = double(rows) / double(samples);  // > 1: rows are distinct and ascending
  const double offset = double(h >> 11) * 0x1p-53 * stride;
  ids.resize(size_t(samples));
  for (int64_t i = 0; i < samples; ++i)
    ids[size_t(i)] = int32_t(std::min<int64_t>(int64_t(offset + double(i) * stride), rows - 1));
}

void tail_partial(CpuKernels& kernels, const float* query, const RowsView& keys, const RowsView& values,
                  int64_t rows, const std::vector<int32_t>& sample, const int32_t* retrieved,
                  const float* retrieved_scores, int n_retrieved, TailScratch& scratch, float* out, float* lse) {
  scratch.sorted.assign(retrieved, retrieved + n_retrieved);
  std::sort(scratch.sorted.begin(), scratch.sorted.end());
  scratch.ids.resize(sample.size());
  const auto end = std::set_difference(sample.begin(), sample.end(), scratch.sorted.begin(), scratch.sorted.end(),
                                       scratch.ids.begin());
  int n_below = int(end - scratch.ids.begin());
  scratch.above.clear();
  if (retrieved_scores && n_retrieved > 0 && n_below > 0) {
    const float weakest = *std::min_element(retrieved_scores, retrieved_scores + n_retrieved);
    scratch.dots.resize(size_t(n_below));
    kernels.gathered_dot(query, 1, keys, scratch.ids.data(), n_below, scratch.dots.data());
    int kept = 0;
    for (int i = 0; i < n_below; ++i) {
      const int32_t id = scratch.ids[size_t(i)];
      if (scratch.dots[size_t(i)] > weakest) scratch.above.push_back(id);
      else scratch.ids[size_t(kept++)] = id;
    }
    n_below = kept;
  }
  // n_below == 0 gives out = 0, lse = -inf. The rows below are distinct from
  // the retrieved and the above ones, so unseen >= n_below.
  kernels.partial_attention(query, 1, keys, values, scratch.ids.data(), n_below, out, lse);
  const int64_t unseen = rows - int64_t(n_retrieved) - int64_t(scratch.above.size());
  if (n_below > 0) *lse += float(std::log(double(unseen) / double(n_below)));
  if (!scratch.above.empty()) {
    const int d = keys.dim;
    scratch.above_out.resize(size_t(d));
    float above_lse;
    kernels.partial_attention(query, 1, keys, values, scratch.above.data(), int(scratch.above.size()),
                              scratch.above_out.data(), &above_lse);
    merge_partials_ln(out, lse, scratch.above_out.data(), &above_lse, 1, d);
  }
}

}  // namespace internal

void Runtime::apply_insert_params(KeyIndex& index) const {
  const GraphBuildParams p = internal::graph_build_params(config_.plan);
  // The KeyIndex interface does not say which implementation an index is;
  // set_insert_params refuses anything but a projected graph (small stores
  // get an exact index, which has no insert parameters).
  try {
    set_insert_params(index, p);
  } catch (const Error&) {
  }
}

std::unique_ptr<KeyIndex> Runtime::build_index(int layer, const RowsView& keys, const float* train_queries,
                                               int64_t num_queries, uint64_t seed,
                                               int threads, const ProgressFn& progress) const {
  if (config_.index == IndexChoice::projected_graph && keys.rows >= kMinGraphKeys) {
    GraphBuildParams gp = internal::graph_build_params(config_.plan, config_.layout, layer);
    gp.threads = std::max(1, threads);
    gp.seed = seed;
    return build_projected_graph(keys, train_queries, num_queries, gp, index_kernels_, progress);
  }
  auto index = make_brute_force_index(keys.rows, index_kernels_);
  if (progress) progress(1.0);
  return index;
}

// ---------------------------------------------------------------------------

Sequence::Sequence(std::shared_ptr<const Runtime> runtime)
    : runtime_(std::move(runtime)), step_(std::make_unique<PendingStep>()) {
  const auto& c = runtime_->config();
  const auto& m = c.layout;
  const int d = m.head_dim;
  layers_.resize(size_t(m.num_layers));
  for (int l = 0; l < m.num_layers; ++l) {
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
    layers_[size_t(l)] = std::move(st);
  }
  q_f32_.resize(size_t(m.num_q_heads) * size_t(d));
  lse_scratch_.resize(size_t(m.num_q_heads));
  row_f32_.resize(size_t(d));
  pending_out_.resize(q_f32_.size());
  pending_lse_.resize(size_t(m.num_q_heads));
  if (c.plan.tail_samples > 0) {
    tail_out_.resize(q_f32_.size());
    tail_lse_.resize(size_t(m.num_q_heads));
  }
  gpu_key_rows_.resize(size_t(m.num_kv_heads));
  gpu_value_rows_.resize(size_t(m.num_kv_heads));
  search_jobs_.resize(size_t(m.num_q_heads));
  profile_ns_ = std::make_unique<std::atomic<int64_t>[]>(kProfileParts);
  for (int i = 0; i < kProfileParts; ++i) profile_ns_[size_t(i)] = 0;
}

Sequence::~Sequence() = default;

LayerState& Sequence::layer_state(int layer, const char* what) {
  if (layer < 0 || layer >= int(layers_.size()))
    fail(Status::invalid_argument, std::string(what) + ": layer " + std::to_string(layer) +
                                       " out of range [0, " + std::to_string(layers_.size()) + ")");
  return *layers_[size_t(layer)];
}

void Runtime::refresh_index(int layer, KeyIndex& index, const RowsView& keys, const float* queries,
                            int64_t num_queries, int threads) const {
  if (!is_projected_graph(index)) return;
  GraphBuildParams gp = internal::graph_build_params(config_.plan, config_.layout, layer);
  gp.threads = std::max(1, threads);
  refresh_projected_graph(index, keys, queries, num_queries, gp);
}

int64_t Sequence::refresh_indexes() {
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
  return layer >= 0 && layer < int(layers_.size()) && layers_[size_t(layer)]->prefilled;
}

int64_t Sequence::tokens(int layer) const {
  if (layer < 0 || layer >= int(layers_.size())) return -1;
  return layers_[size_t(layer)]->tokens;
}

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
  {
    auto heads_of = [&](const void* base, int heads) {
      std::vector<const void*> p;
      for (int h = 0; h < heads; ++h) p.push_back(offset_rows(base, int64_t(h) * n, d, dtype));
      return p;
    };
    check_prefill_rows(where, c, st.chunks ? st.chunks->tokens : 0, n, heads_of(q, hq).data(),
                       heads_of(k, hkv).data(), heads_of(v, hkv).data(), dtype);
  }
  // A layer's first chunk is assembled aside and attached last, so that a
  // refused or failed first chunk leaves no (empty) prompt behind.
  std::unique_ptr<LayerState::PromptChunks> fresh;
  if (!st.chunks) {
    fresh = std::make_unique<LayerState::PromptChunks>();
    fresh->dtype = dtype;
    fresh->q.resize(size_t(hq));
    fresh->k.resize(size_t(hkv));
    fresh->v.resize(size_t(hkv));
  }
  LayerState::PromptChunks& pc = fresh ? *fresh : *st.chunks;
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

void Sequence::prefill_end(int layer, const ProgressFn& progress) {
  LayerState& st = layer_state(layer, "prefill_end");
  if (!st.chunks)
    fail(Status::invalid_argument, "prefill_end: layer " + std::to_string(layer) + " has no chunks (prefill_chunk first)");
  // Moved out first: a failed prefill leaves the layer as before any chunk.
  // Each head's chunks are one run of rows already: prefilled from in place.
  if (st.chunks->tokens <= 0)
    fail(Status::internal, "prefill_end: layer " + std::to_string(layer) + " holds an empty prompt");
  const std::unique_ptr<LayerState::PromptChunks> pc = std::move(st.chunks);
  auto heads_of = [](const std::vector<std::vector<uint8_t>>& heads) {
    std::vector<const void*> p;
    for (const auto& h : heads) p.push_back(h.data());
    return p;
  };
  prefill_heads(layer, pc->tokens, heads_of(pc->q).data(), heads_of(pc->k).data(), heads_of(pc->v).data(), pc->dtype,
                progress);
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
  const auto qh = heads_of(q, m.num_q_heads), kh = heads_of(k, m.num_kv_heads), vh = heads_of(v, m.num_kv_heads);
  check_prefill_rows("prefill: layer " + std::to_string(layer), runtime_->config(), 0, n, qh.data(), kh.data(),
                     vh.data(), dtype);
  prefill_heads(layer, n, qh.data(), kh.data(), vh.data(), dtype, progress);
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
  {
    // The layer's store and indexes, and the build's fp32 key copies (one per thread).
    const uint64_t store = uint64_t(hkv) * uint64_t(2 * static_cap + (st.global ? 2 * (n_cpu + 4096) : 0)) * row_bytes;
    const uint64_t index = st.global ? uint64_t(hq) * uint64_t(n_cpu) * index_bytes_per_node(c.plan) +
                                           uint64_t(runtime_->pool().threads()) * uint64_t(n_cpu) * uint64_t(d) * 4
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
    // Indexes, one per query head, built in parallel over heads.
    if (c.plan.top_k > 0) {
      std::mutex progress_mutex;
      std::vector<double> head_progress(size_t(hq), 0.0);
      double reported = 0;
      auto report = [&](int h, double f) {
        if (!progress) return;
        std::lock_guard<std::mutex> lock(progress_mutex);
        head_progress[size_t(h)] = std::clamp(f, 0.0, 1.0);
        double sum = 0;
        for (double x : head_progress) sum += x;
        const double total = sum / hq;
        if (total > reported) {
          reported = total;
          progress(total);
        }
      };
      // Heads build in parallel; each build gets the threads the heads leave.
      const int pool_threads = runtime_->pool().threads();
      const int build_threads = std::max(1, pool_threads / std::min(hq, pool_threads));
      runtime_->pool().parallel_for(hq, [&](int64_t hi) {
        const int h = int(hi);
        QueryHeadState& qh = st.q[size_t(h)];
        const RowsView keys = st.kv[size_t(h / group)].cpu_keys.view();
        std::vector<float> train(size_t(n) * size_t(d));
        to_f32(dtype, q[h], train.data(), train.size());
        qh.index = runtime_->build_index(layer, keys, train.data(), n,
                                         c.seed + uint64_t(layer) * 1000003ull + uint64_t(h),
                                         build_threads, [&](double f) { report(h, f); });
        qh.scratch = qh.index->make_scratch();
        report(h, 1.0);
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

// Everything a decode step's work items read, behind one pointer, from
// begin_decode to end_decode.
struct StepArgs {
  LayerState* st;
  CpuKernels* kernels;
  GpuAttention* gpu;
  int64_t gpu_row;  // the static-set slot the new token took
  const void* const* gpu_key_rows;
  const void* const* gpu_value_rows;
  const float* q;
  float* out;
  float* lse;
  float* pending_out;
  float* pending_lse;
  float* tail_out;  // null: no tail estimate this step
  float* tail_lse;
  SearchJob* jobs;
  std::atomic<int64_t>* profile_ns;  // null: not profiling
  int64_t n_static, top_k, pending_attended, pending_inserted, ring_slot, tail_rows;
  int d, group, retrieval_items, per_item;
  DType store_t;
  const SearchParams* search;  // the layer's decode search for k = 0 (Runtime::decode_search_params)
  int search_seeds;
  int64_t refresh_stride;  // 0: no refresh queries kept
};

struct Sequence::PendingStep {
  StepArgs args{};
  // Items of the parallel loop: [0, gpu_items) the GPU's, then
  // args.retrieval_items, then one per KV head.
  int64_t gpu_items = 0, items = 0;
  bool retrieve = false, insert_now = false, tail = false, profiling = false;
  int hq = 0;
  int64_t t_start = 0, t_loop = 0, codes_ns = 0, tail_draw_ns = 0;
};

void Sequence::check_decode(int layer, const void* q, const void* k, const void* v, DType dtype, const float* out) {
  const LayerState& st = layer_state(layer, "decode");
  if (!st.prefilled)
    fail(Status::invalid_argument, "decode: layer " + std::to_string(layer) + " was not prefilled" +
                                       (st.chunks ? " (its chunked prefill awaits prefill_end)" : ""));
  if (!q || !k || !v || !out) fail(Status::invalid_argument, "decode: q, k, v and out must not be null");
  const auto& c = runtime_->config();
  const int d = c.layout.head_dim;
  const std::string call = "decode: layer " + std::to_string(layer);
  const int64_t token = tokens(layer);
  for (int h = 0; h < c.layout.num_q_heads; ++h)
    check_head_rows(call, "q", h, offset_rows(q, h, d, dtype), token, 1, d, dtype, DType::f32);
  for (int h = 0; h < c.layout.num_kv_heads; ++h) {
    check_head_rows(call, "k", h, offset_rows(k, h, d, dtype), token, 1, d, dtype, c.kv_storage);
    check_head_rows(call, "v", h, offset_rows(v, h, d, dtype), token, 1, d, dtype, c.kv_storage);
  }
}

void Sequence::decode(int layer, const void* q, const void* k, const void* v, DType dtype,
                      float* out, float* lse) {
  check_decode(layer, q, k, v, dtype, out);
  begin_decode(layer, q, k, v, dtype, out, lse);
  runtime_->pool().parallel_for(step_->items, [this](int64_t item) { run_decode_item(item); });
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
  const int64_t tail_rows = st.global && c.plan.tail_samples > 0 ? st.kv[0].cpu_keys.rows() - pending_attended : 0;
  const bool tail = tail_rows > 0;
  int64_t tail_draw_ns = 0;
  if (tail) {
    const int64_t t_draw = profiling ? now_ns() : 0;
    for (int h = 0; h < hkv; ++h)
      internal::draw_tail_sample(c.seed, layer, h, position, tail_rows, c.plan.tail_samples,
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
  const int per_item = c.searches_per_item > 0
                           ? c.searches_per_item
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
      c.plan.top_k,
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
      internal::refresh_stride(c.plan.refresh_sample)};
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
    }
    if (a->pending_attended > 0) {
      const RowsView cpu_k = kv.cpu_keys.view();
      a->kernels->dense_attention(q, a->group, cpu_k, kv.cpu_values.view(), cpu_k.rows - a->pending_attended,
                                  cpu_k.rows, a->pending_out + first * size_t(d), a->pending_lse + first);
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
  for (int h = first; h < first + a->per_item; ++h) {
    QueryHeadState& qh = a->st->q[size_t(h)];
    for (int64_t i = 0; i < a->pending_inserted; ++i) {
      const int64_t row = cpu_k.rows - a->pending_inserted + i;
      const float* own_query = qh.pending_queries.data() + size_t(i) * size_t(d);
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
  if (a->pending_inserted > 0) t = lap(t, kInsert);
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
  // The tail estimate of each head: its sample less what it retrieved.
  auto estimate_tail = [&] {
    if (!a->tail_out) return;
    for (int h = first; h < first + a->per_item; ++h) {
      QueryHeadState& qh = a->st->q[size_t(h)];
      internal::tail_partial(*a->kernels, a->q + size_t(h) * size_t(d), cpu_k, cpu_v, a->tail_rows, kv.tail_sample,
                             qh.found.ids.data(), qh.found.scores.data(), int(qh.found.ids.size()), qh.tail,
                             a->tail_out + size_t(h) * size_t(d), a->tail_lse + h);
    }
    lap(t, kTail);
  };
  if (indexed == 0) {
    for (int h = first; h < first + a->per_item; ++h) a->st->q[size_t(h)].found.ids.clear();
    estimate_tail();
    return;
  }
  search_many(jobs, n_jobs, cpu_k, sp);
  t = lap(t, kSearch);
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
  t = lap(t, kRetrievedAttention);
  estimate_tail();
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
    const int64_t t_end = now_ns();
    profile_ns_[kPrepare] += p.t_loop - p.t_start - p.codes_ns - p.tail_draw_ns;
    profile_ns_[kInsert] += p.codes_ns;  // encoding the inserted rows
    profile_ns_[kTail] += p.tail_draw_ns;
    profile_ns_[kMerge] += t_end - t_merge;
    profile_ns_[kTotal] += t_end - p.t_start;
    profile_ns_[kSteps] += 1;
  }
}

void Sequence::set_profiling(bool on) {
  profiling_ = on;
  for (int i = 0; i < kProfileParts; ++i) profile_ns_[size_t(i)] = 0;
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
  return p;
}

MemoryStats Sequence::memory() const {
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
    for (const auto& qh : st->q) {
      m.query_ring_bytes += qh.window_queries.capacity() * sizeof(float);
      if (qh.index) m.index_bytes += qh.index->memory_bytes();
      m.query_ring_bytes += (qh.pending_queries.capacity() + qh.refresh_queries.capacity()) * sizeof(float) +
                            (qh.window_hints.capacity() + qh.window_hint_count.capacity() +
                             qh.pending_hints.capacity() + qh.pending_hint_count.capacity()) * sizeof(int32_t);
      m.scratch_bytes += (qh.tail.sorted.capacity() + qh.tail.ids.capacity() + qh.tail.above.capacity()) * sizeof(int32_t) +
                         (qh.tail.dots.capacity() + qh.tail.above_out.capacity()) * sizeof(float);
      if (qh.scratch) m.scratch_bytes += qh.scratch->memory_bytes();
      m.scratch_bytes += (qh.retrieved_out.capacity() +
                          qh.found.scores.capacity()) * sizeof(float) +
                         (qh.found.ids.capacity() + qh.seed_ids.capacity()) * sizeof(int32_t);
    }
  }
  m.scratch_bytes += (q_f32_.capacity() + lse_scratch_.capacity() + row_f32_.capacity() +
                      pending_out_.capacity() + pending_lse_.capacity() + tail_out_.capacity() +
                      tail_lse_.capacity()) * sizeof(float);
  return m;
}

}  // namespace rattn
