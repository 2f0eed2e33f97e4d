// The Runtime: the checked configuration, the CPU kernels and the GPU
// choice, and the index each query head gets (build, insert parameters,
// refresh). Sequences: sequence.cpp, prefill.cpp, decode.cpp.
#include "runtime/runtime.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "core/error.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"
#include "runtime/kernel_choice.h"
#include "runtime/log.h"

namespace rattn {

namespace {

// Below this many offloaded keys an exact scan is as fast as a graph search
// and needs no build.
constexpr int64_t kMinGraphKeys = 2048;

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
      const auto& keys = plan_keys::layer_keys;
      if (std::find_if(std::begin(keys), std::end(keys), [&](const char* k) { return kv.first == k; }) == std::end(keys))
        bad(where + "'" + kv.first + "' cannot be set per layer");
    }
    const DecodeSearch s = p.decode_search(layer);
    const LayerRetrieval r = p.layer_retrieval(layer);
    if (own.count(plan_keys::top_k) && p.top_k == 0)
      bad(where + "top_k is set but retrieval is off (the plan-wide top_k is 0)");
    if (r.top_k < 0 || (p.top_k > 0 && r.top_k < 1)) bad(where + "top_k must be >= 1");
    if (r.tail_samples < 0) bad(where + "tail_samples must be >= 0");
    if (s.queue < 1) bad(where + "search_queue must be >= 1");
    if (s.patience < 0 || s.seeds < 0 || s.expand_first < 0 || s.full_expand < 0)
      bad(where + "search_patience, search_seeds, search_expand_first and search_full_expand must be >= 0");
  }
  if (p.tail_samples < 0) bad("plan: tail_samples must be >= 0");
  if (p.shift_queries < 0) bad("plan: shift_queries must be >= 0");
  if (!(p.refresh_sample >= 0 && p.refresh_sample <= 1)) bad("plan: refresh_sample must be in [0, 1]");
  if (p.shift_queries > 0 && p.shift_span < 8) bad("plan: shift_span must be >= 8");
  if (p.shift_queries > 0 && p.causal) bad("plan: shift_queries does not combine with causal training lists");
  // A shared graph's training rows are the group's queries head after head,
  // not one row per token position.
  if (p.shared_graph && p.causal) bad("plan: shared_graph does not combine with causal training lists");
  if (p.shift_queries > 0 && m.head_dim % 2 != 0) bad("plan: shift_queries needs an even head_dim (RoPE pairs)");
  if (c.searches_per_item < 0 || (c.searches_per_item > 0 && m.group_size() % c.searches_per_item != 0))
    bad("searches_per_item must be 0 (automatic) or divide the group size (" + std::to_string(m.group_size()) + ")");
}

int Runtime::max_tail_samples() const {
  int most = 0;
  for (const LayerRetrieval& r : layer_retrievals_) most = std::max(most, r.tail_samples);
  return most;
}

int searches_per_item(int group, int kv_heads, int threads) {
  for (int s = group; s > 1; --s)
    if (group % s == 0 && int64_t(kv_heads) * (group / s) >= threads) return s;
  return 1;
}

Runtime::Runtime(RuntimeConfig config) : config_(std::move(config)) {
  validate_config(config_);
  for (int layer = 0; layer < config_.layout.num_layers; ++layer) {
    decode_searches_.push_back(config_.plan.decode_search(layer));
    layer_retrievals_.push_back(config_.plan.layer_retrieval(layer));
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
    // storage, head dims 64/128/256, groups up to 64): a spec it rejects
    // keeps the static set on the CPU instead of failing every prefill.
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

void Runtime::refresh_index(int layer, KeyIndex& index, const RowsView& keys, const float* queries,
                            int64_t num_queries, int threads) const {
  if (!is_projected_graph(index)) return;
  GraphBuildParams gp = internal::graph_build_params(config_.plan, config_.layout, layer);
  gp.threads = std::max(1, threads);
  refresh_projected_graph(index, keys, queries, num_queries, gp);
}

}  // namespace rattn
