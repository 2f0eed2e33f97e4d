#include "models/engine/rattn_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/clock.h"
#include "core/error.h"
#include "models/engine/text_util.h"

namespace rattn::engine {

void GlobalQkv::init(const GemmaConfig& c, int64_t tokens) {
  layers = c.global_layers();
  H = c.n_head, HK = c.n_kv_head, d = c.head_dim, T = tokens;
  q.assign(layers.size(), std::vector<float>(size_t(H) * size_t(T) * size_t(d)));
  k.assign(layers.size(), std::vector<float>(size_t(HK) * size_t(T) * size_t(d)));
  v.assign(layers.size(), std::vector<float>(size_t(HK) * size_t(T) * size_t(d)));
}

size_t GlobalQkv::slot(int layer) const {
  const auto it = std::find(layers.begin(), layers.end(), layer);
  if (it == layers.end()) fail(Status::internal, "layer " + std::to_string(layer) + " is not a global layer");
  return size_t(it - layers.begin());
}

GlobalQkvHook GlobalQkv::hook() {
  return [this](int layer, int64_t pos0, int64_t n, const float* qs, const float* ks, const float* vs) {
    const size_t g = slot(layer);
    for (int64_t i = 0; i < n && pos0 + i < T; ++i) {
      const size_t t = size_t(pos0 + i);
      for (int h = 0; h < H; ++h)
        std::memcpy(&q[g][(size_t(h) * size_t(T) + t) * size_t(d)], qs + (i * H + h) * d, size_t(d) * 4);
      for (int h = 0; h < HK; ++h) {
        std::memcpy(&k[g][(size_t(h) * size_t(T) + t) * size_t(d)], ks + (i * HK + h) * d, size_t(d) * 4);
        std::memcpy(&v[g][(size_t(h) * size_t(T) + t) * size_t(d)], vs + (i * HK + h) * d, size_t(d) * 4);
      }
    }
  };
}

namespace {

void check_api(rattn_status s, const rattn_context* ctx, const char* what) {
  if (s != RATTN_OK)
    fail(Status::internal, std::string("rattn C API: ") + what + " failed: " + rattn_status_string(s) + ": " +
                               rattn_context_last_error(ctx));
}

double rel_l2(const float* got, const double* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

namespace internal {

void attention_with_topk_oracle_f64(const float* q, int heads, int d, const float* k, const float* v,
                                    int64_t stride, int64_t pos, double scale, int64_t sinks, int64_t window,
                                    int64_t top_k, double* full, double* oracle) {
  const int64_t n = pos + 1;
#pragma omp parallel for schedule(static)
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + size_t(h) * size_t(d);
    std::vector<double> s(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = k + j * stride;
      double acc = 0;
      for (int i = 0; i < d; ++i) acc += double(qh[i]) * double(kj[i]);
      s[size_t(j)] = acc * scale;
    }
    // Offloaded keys: neither sinks nor in the recent window (pos included).
    std::vector<int64_t> offloaded;
    for (int64_t j = sinks; j <= pos - window; ++j) offloaded.push_back(j);
    std::vector<char> keep(static_cast<size_t>(n), 1);
    if (int64_t(offloaded.size()) > top_k) {
      std::nth_element(offloaded.begin(), offloaded.begin() + top_k, offloaded.end(),
                       [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
      for (size_t i = size_t(top_k); i < offloaded.size(); ++i) keep[size_t(offloaded[i])] = 0;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    std::vector<double> acc_full(static_cast<size_t>(d), 0.0), acc_kept(static_cast<size_t>(d), 0.0);
    double sum_full = 0, sum_kept = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double w = std::exp(s[size_t(j)] - mx);
      const float* vj = v + j * stride;
      sum_full += w;
      for (int i = 0; i < d; ++i) acc_full[size_t(i)] += w * vj[i];
      if (keep[size_t(j)]) {
        sum_kept += w;
        for (int i = 0; i < d; ++i) acc_kept[size_t(i)] += w * vj[i];
      }
    }
    for (int i = 0; i < d; ++i) {
      full[size_t(h) * size_t(d) + size_t(i)] = acc_full[size_t(i)] / sum_full;
      oracle[size_t(h) * size_t(d) + size_t(i)] = acc_kept[size_t(i)] / sum_kept;
    }
  }
}

}  // namespace internal

RattnAttention::RattnAttention(const GemmaConfig& cfg, const RattnAttentionParams& params, const GlobalQkv& qkv,
                               const GemmaSequence* reference, bool overlap)
    : cfg_(cfg), reference_(reference), qkv_(qkv) {
  rattn_context_params p = rattn_context_default_params();
  model_layout_ = !params.plan_path.empty();
  if (model_layout_) {
    p.plan_path = params.plan_path.c_str();
  } else {  // only the global layers, numbered 0..n-1
    p.n_layers = int32_t(qkv.layers.size());
    p.n_q_heads = cfg.n_head;
    p.n_kv_heads = cfg.n_kv_head;
    p.head_dim = cfg.head_dim;
  }
  p.sinks = params.sinks;
  p.window = params.window;
  p.top_k = params.top_k;
  p.search_queue = params.search_queue;
  if (params.insert_batch > 0) p.insert_batch = params.insert_batch;
  p.tail_samples = params.tail_samples;
  p.search_seeds = params.search_seeds;
  p.search_expand_first = params.search_expand_first;
  p.search_full_expand = params.search_full_expand;
  p.graph_degree = params.graph_degree;
  p.query_neighbors = params.query_neighbors;
  p.build_sample = params.build_sample;
  // Without a plan the context numbers only the global layers.
  std::vector<rattn_layer_search> layer_search = params.layer_search;
  for (rattn_layer_search& e : layer_search) {
    const auto it = std::find(qkv.layers.begin(), qkv.layers.end(), e.layer);
    if (it == qkv.layers.end())
      fail(Status::invalid_argument, "layer search override: layer " + std::to_string(e.layer) + " is not a global layer");
    if (!model_layout_) e.layer = int32_t(it - qkv.layers.begin());
  }
  p.layer_search = layer_search.data();
  p.n_layer_search = int32_t(layer_search.size());
  p.kv_storage = params.kv_storage;
  p.index_kind = params.index;
  p.kernels = params.kernels;
  p.n_threads = params.threads;
  check_api(rattn_context_create(&p, &ctx_), nullptr, "rattn_context_create");
  try {
    check_api(rattn_context_get_info(ctx_, &info_), ctx_, "rattn_context_get_info");
    if (model_layout_ && (info_.n_layers != cfg.n_layer || info_.n_q_heads != cfg.n_head ||
                          info_.n_kv_heads != cfg.n_kv_head || info_.head_dim != cfg.head_dim))
      fail(Status::invalid_argument, "plan '" + params.plan_path + "' describes " + std::to_string(info_.n_layers) +
                                         " layers, " + std::to_string(info_.n_q_heads) + "/" +
                                         std::to_string(info_.n_kv_heads) + " heads of dimension " +
                                         std::to_string(info_.head_dim) + "; the GGUF model has " +
                                         std::to_string(cfg.n_layer) + " layers, " + std::to_string(cfg.n_head) +
                                         "/" + std::to_string(cfg.n_kv_head) + " heads of dimension " +
                                         std::to_string(cfg.head_dim));
    // rattn scores with 1/sqrt(d); the model's scale (1/sqrt(query_pre_attn_scalar))
    // is folded into the queries.
    q_scale_ = cfg.attn_scale * std::sqrt(float(cfg.head_dim));
    if (!params.load_state.empty()) {
      if (overlap) fail(Status::invalid_argument, "a loaded state has nothing to prefill in the background");
      check_api(rattn_sequence_load(ctx_, params.load_state.c_str(), &seq_), ctx_, "rattn_sequence_load");
    } else {
      check_api(rattn_sequence_create(ctx_, &seq_), ctx_, "rattn_sequence_create");
      for (size_t g = 0; g < qkv.layers.size() && !overlap; ++g) {  // overlap: start_layer hands each layer over
        const std::vector<float> q = scaled_queries(g);
        check_api(rattn_sequence_prefill(seq_, rattn_layer(g), qkv.T, q.data(), qkv.k[g].data(), qkv.v[g].data(),
                                         RATTN_F32),
                  ctx_, "rattn_sequence_prefill");
      }
    }
  } catch (...) {
    rattn_sequence_free(seq_);
    rattn_context_free(ctx_);
    throw;
  }
  errors_.assign(qkv.layers.size(), {});
  oracle_errors_.assign(qkv.layers.size(), {});
  queries_.assign(qkv.layers.size(), {});
}

std::vector<float> RattnAttention::scaled_queries(size_t slot) const {
  std::vector<float> q = qkv_.q[slot];
  if (q_scale_ != 1.0f)
    for (float& x : q) x *= q_scale_;
  return q;
}

void RattnAttention::start_layer(int layer) {
  const size_t g = qkv_.slot(layer);
  const std::vector<float> q = scaled_queries(g);  // rattn copies the chunk: freed on return
  check_api(rattn_sequence_prefill_chunk(seq_, rattn_layer(g), qkv_.T, q.data(), qkv_.k[g].data(), qkv_.v[g].data(),
                                         RATTN_F32),
            ctx_, "rattn_sequence_prefill_chunk");
  check_api(rattn_sequence_prefill_end_async(seq_, rattn_layer(g)), ctx_, "rattn_sequence_prefill_end_async");
}

void RattnAttention::save_state(const std::string& path) const {
  check_api(rattn_sequence_save(seq_, path.c_str()), ctx_, "rattn_sequence_save");
}

void RattnAttention::finish_prefill() {
  check_api(rattn_sequence_prefill_wait(seq_), ctx_, "rattn_sequence_prefill_wait");
}

int32_t RattnAttention::context_layer(int layer) const {
  const auto it = std::find(qkv_.layers.begin(), qkv_.layers.end(), layer);
  if (it == qkv_.layers.end()) fail(Status::invalid_argument, "layer " + std::to_string(layer) + " is not a global layer");
  return model_layout_ ? int32_t(layer) : int32_t(it - qkv_.layers.begin());
}

rattn_layer_search RattnAttention::layer_search(int layer) const {
  rattn_layer_search out{};
  check_api(rattn_context_get_layer_search(ctx_, context_layer(layer), &out), ctx_, "rattn_context_get_layer_search");
  out.layer = layer;
  return out;
}

std::pair<int32_t, int32_t> RattnAttention::layer_retrieval(int layer) const {
  std::pair<int32_t, int32_t> out{0, 0};
  check_api(rattn_context_get_layer_retrieval(ctx_, context_layer(layer), &out.first, &out.second), ctx_,
            "rattn_context_get_layer_retrieval");
  return out;
}

RattnAttention::~RattnAttention() {
  rattn_sequence_free(seq_);
  rattn_context_free(ctx_);
}

int RattnAttention::rattn_layer(size_t slot) const { return model_layout_ ? qkv_.layers[slot] : int(slot); }

void RattnAttention::decode(int layer, int64_t pos, const float* q, const float* k, const float* v, float* out) {
  const size_t g = qkv_.slot(layer);
  const int H = cfg_.n_head, d = cfg_.head_dim, n = H * d;
  std::vector<float> qs(q, q + n);
  for (float& x : qs) x *= q_scale_;
  const double t0 = seconds_now();
  check_api(rattn_sequence_decode(seq_, rattn_layer(g), qs.data(), k, v, RATTN_F32, out, nullptr), ctx_,
            "rattn_sequence_decode");
  decode_seconds_ += seconds_now() - t0;
  queries_[g].insert(queries_[g].end(), q, q + n);
  if (!reference_) return;
  // The reference cache already holds this token's k/v at `pos`.
  const int HK = cfg_.n_kv_head, group = H / HK;
  std::vector<double> full(static_cast<size_t>(n)), oracle(static_cast<size_t>(n));
  for (int kh = 0; kh < HK; ++kh)
    internal::attention_with_topk_oracle_f64(q + size_t(kh) * size_t(group) * size_t(d), group, d,
                                             reference_->keys(layer) + size_t(kh) * size_t(d),
                                             reference_->values(layer) + size_t(kh) * size_t(d), int64_t(HK) * d, pos,
                                             double(cfg_.attn_scale), info_.sinks, info_.window, info_.top_k,
                                             full.data() + size_t(kh) * size_t(group) * size_t(d),
                                             oracle.data() + size_t(kh) * size_t(group) * size_t(d));
  errors_[g].push_back(rel_l2(out, full.data(), size_t(n)));
  std::vector<float> oracle_f(oracle.begin(), oracle.end());
  oracle_errors_[g].push_back(rel_l2(oracle_f.data(), full.data(), size_t(n)));
}

}  // namespace rattn::engine
