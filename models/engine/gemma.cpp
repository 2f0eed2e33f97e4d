#include "models/engine/gemma.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "models/engine/matmul.h"
#include "models/engine/quant.h"

namespace rattn::engine {

std::vector<int> GemmaConfig::global_layers() const {
  std::vector<int> out;
  for (int i = 0; i < n_layer; ++i)
    if (is_global(i)) out.push_back(i);
  return out;
}

namespace internal {

void rms_norm_rows(const float* x, const float* w, float* y, int64_t rows, int n, float eps) {
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0.0;
    for (int j = 0; j < n; ++j) ss += double(xr[j]) * xr[j];
    const float inv = float(1.0 / std::sqrt(ss / n + double(eps)));
    for (int j = 0; j < n; ++j) yr[j] = xr[j] * inv * w[j];
  }
}

void rope_neox(float* x, int64_t n_pos, int heads, int d, int64_t pos0, float base) {
  const int half = d / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) inv_freq[size_t(i)] = std::pow(double(base), -2.0 * i / d);
#pragma omp parallel for schedule(static) if (n_pos > 4)
  for (int64_t p = 0; p < n_pos; ++p) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
      const double a = double(pos0 + p) * inv_freq[size_t(i)];
      c[size_t(i)] = float(std::cos(a));
      s[size_t(i)] = float(std::sin(a));
    }
    for (int h = 0; h < heads; ++h) {
      float* v = x + (p * heads + h) * d;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c[size_t(i)] - x1 * s[size_t(i)];
        v[i + half] = x0 * s[size_t(i)] + x1 * c[size_t(i)];
      }
    }
  }
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

void causal_attention(const float* q, int64_t q_stride, int64_t nq, int heads, int d, int64_t q0,
                      const float* k, const float* v, int64_t kv_stride, int window, float scale,
                      float* out, int64_t out_stride) {
  const int64_t block = 128;
  std::vector<float> qp, scores, op;
  for (int64_t a = 0; a < nq; a += block) {
    const int64_t bq = std::min(block, nq - a);
    const int64_t p_first = q0 + a, p_last = q0 + a + bq - 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p_first - window + 1) : 0;
    const int64_t nk = p_last + 1 - lo;
    const int64_t rows = bq * heads;
    qp.resize(size_t(rows * d));
    for (int64_t i = 0; i < bq; ++i)
      std::memcpy(&qp[size_t(i * heads * d)], q + (a + i) * q_stride, size_t(heads * d) * 4);
    scores.resize(size_t(rows * nk));
    matmul(rows, nk, d, qp.data(), d, k + lo * kv_stride, kv_stride, true, scores.data(), nk, scale);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = p_first + r / heads;
      const int64_t vis_lo = window > 0 ? std::max<int64_t>(lo, p - window + 1) : lo;
      float* s = &scores[size_t(r * nk)];
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = vis_lo - lo; j <= p - lo; ++j) mx = std::max(mx, s[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t key = lo + j;
        if (key < vis_lo || key > p) {
          s[j] = 0.0f;
        } else {
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
      }
      const float inv = float(1.0 / sum);
      for (int64_t j = vis_lo - lo; j <= p - lo; ++j) s[j] *= inv;
    }
    op.resize(size_t(rows * d));
    matmul(rows, d, nk, scores.data(), nk, v + lo * kv_stride, kv_stride, false, op.data(), d);
    for (int64_t i = 0; i < bq; ++i)
      std::memcpy(out + (a + i) * out_stride, &op[size_t(i * heads * d)], size_t(heads * d) * 4);
  }
}

}  // namespace internal

namespace {

std::vector<float> load_f32(const GgufFile& f, const std::string& name, int64_t expect_rows, int64_t expect_cols) {
  const GgufTensor& t = f.tensor(name);
  if (t.dims[0] != expect_cols || t.rows() != expect_rows)
    fail(Status::corrupt_data, "tensor '" + name + "' has shape [" + std::to_string(t.dims[0]) + " x " +
                                   std::to_string(t.rows()) + "], expected [" + std::to_string(expect_cols) +
                                   " x " + std::to_string(expect_rows) + "]");
  std::vector<float> out(size_t(t.elements()));
  const size_t rb = ggml_row_bytes(t.type, t.dims[0]);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < t.rows(); ++r) dequantize(t.type, t.data + size_t(r) * rb, &out[size_t(r * t.dims[0])], t.dims[0]);
  return out;
}

}  // namespace

std::unique_ptr<GemmaModel> GemmaModel::load(const std::string& path) {
  std::unique_ptr<GemmaModel> m(new GemmaModel());
  m->file_ = GgufFile::open(path);
  const GgufFile& f = *m->file_;
  const std::string arch = f.get_string("general.architecture");
  if (arch != "gemma3") fail(Status::unsupported, "'" + path + "': architecture '" + arch + "' is not supported (gemma3 only)");
  GemmaConfig& c = m->cfg_;
  const std::string p = arch + ".";
  // Each hyper-parameter in a plausible range before any arithmetic on it: a
  // corrupted file must fail here, not truncate to a plausible int or divide
  // by a zero head count.
  constexpr int64_t kRequired = std::numeric_limits<int64_t>::min();
  auto count = [&](const std::string& key, int64_t fallback, int64_t hi) {
    const int64_t v = fallback == kRequired ? f.get_int(key) : f.get_int(key, fallback);
    if (v < 1 || v > hi)
      fail(Status::corrupt_data, "'" + path + "': " + key + " = " + std::to_string(v) + " is outside [1, " +
                                     std::to_string(hi) + "]");
    return int(v);
  };
  auto positive = [&](const std::string& key, double fallback) {
    const double v = f.get_float(key, fallback);
    if (!(v > 0) || !std::isfinite(v))
      fail(Status::corrupt_data, "'" + path + "': " + key + " = " + std::to_string(v) + " must be positive");
    return v;
  };
  c.n_layer = count(p + "block_count", kRequired, 4096);
  c.d_model = count(p + "embedding_length", kRequired, 1 << 20);
  c.n_head = count(p + "attention.head_count", kRequired, 4096);
  c.n_kv_head = count(p + "attention.head_count_kv", c.n_head, 4096);
  c.head_dim = count(p + "attention.key_length", std::max(c.d_model / c.n_head, 1), 1 << 16);
  if (f.get_int(p + "attention.value_length", c.head_dim) != c.head_dim)
    fail(Status::unsupported, "'" + path + "': key and value head dimensions differ");
  c.d_ff = count(p + "feed_forward_length", kRequired, 1 << 24);
  c.context = count(p + "context_length", 32768, int64_t(1) << 30);
  c.window = count(p + "attention.sliding_window", 512, int64_t(1) << 30);
  c.global_every = count(p + "attention.sliding_window_pattern", 6, 4096);
  c.eps = float(positive(p + "attention.layer_norm_rms_epsilon", 1e-6));
  c.rope_base_global = float(positive(p + "rope.freq_base", 1e6));
  // Gemma-3 uses 10000 on its sliding-window layers; files may carry it.
  c.rope_base_local =
      float(positive(p + "rope.local_freq_base", positive(p + "rope.freq_base_swa", 1e4)));
  c.attn_scale = float(1.0 / std::sqrt(positive(p + "attention.query_pre_attn_scalar", double(c.head_dim))));
  if (c.n_head % c.n_kv_head != 0 || c.head_dim % 2 != 0)
    fail(Status::corrupt_data, "'" + path + "': inconsistent gemma3 hyper-parameters");
  m->tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
  m->embd_ = &f.tensor("token_embd.weight");
  if (m->embd_->dims[0] != c.d_model) fail(Status::corrupt_data, "token_embd.weight row length differs from embedding_length");
  c.vocab = m->embd_->rows();
  const int D = c.d_model, Q = c.n_head * c.head_dim, KV = c.n_kv_head * c.head_dim;
  // llama.cpp's converter bakes Gemma's (1 + w) into stored norm weights;
  // RATTN_GEMMA_NORM_PLUS_ONE=1 selects files that store raw w.
  const char* plus = std::getenv("RATTN_GEMMA_NORM_PLUS_ONE");
  c.norm_plus_one = plus && plus[0] == '1';
  auto norm = [&](const std::string& name, int n) {
    std::vector<float> w = load_f32(f, name, 1, n);
    if (c.norm_plus_one)
      for (float& x : w) x += 1.0f;
    return w;
  };
  m->layers_.resize(size_t(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& L = m->layers_[size_t(i)];
    L.wq = load_f32(f, b + "attn_q.weight", Q, D);
    L.wk = load_f32(f, b + "attn_k.weight", KV, D);
    L.wv = load_f32(f, b + "attn_v.weight", KV, D);
    L.wo = load_f32(f, b + "attn_output.weight", D, Q);
    L.gate = load_f32(f, b + "ffn_gate.weight", c.d_ff, D);
    L.up = load_f32(f, b + "ffn_up.weight", c.d_ff, D);
    L.down = load_f32(f, b + "ffn_down.weight", D, c.d_ff);
    L.attn_norm = norm(b + "attn_norm.weight", D);
    L.post_attn_norm = norm(b + "post_attention_norm.weight", D);
    L.ffn_norm = norm(b + "ffn_norm.weight", D);
    L.post_ffw_norm = norm(b + "post_ffw_norm.weight", D);
    L.q_norm = norm(b + "attn_q_norm.weight", c.head_dim);
    L.k_norm = norm(b + "attn_k_norm.weight", c.head_dim);
  }
  m->output_norm_ = norm("output_norm.weight", D);
  return m;
}

void GemmaModel::embedding_rows(const int32_t* ids, int64_t n, float* out) const {
  const int D = cfg_.d_model;
  const size_t rb = ggml_row_bytes(embd_->type, D);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= cfg_.vocab) fail(Status::invalid_argument, "token id " + std::to_string(ids[i]) + " is outside the vocabulary");
    dequantize(embd_->type, embd_->data + size_t(ids[i]) * rb, out + i * D, D);
  }
}

namespace {

// logits[r] = sum over Q8_0 blocks b of row r: d_b * <q_b, x_b>, for a few
// rows of x at once: the decode path reads each quantised row once instead of
// dequantising the whole table into a tile first.
template <int kRows>
void q8_0_dot_rows(const uint8_t* row, const float* x, int D, int64_t x_stride, float* out) {
  float acc[kRows] = {};
  for (int b = 0; b < D / 32; ++b, row += 34) {
    uint16_t hd;
    std::memcpy(&hd, row, 2);
    const float d = f16_to_f32(hd);
    const int8_t* q = reinterpret_cast<const int8_t*>(row + 2);
    float qf[32];
    for (int j = 0; j < 32; ++j) qf[j] = float(q[j]);
    for (int r = 0; r < kRows; ++r) {
      const float* xb = x + r * x_stride + b * 32;
      float s = 0.0f;
      for (int j = 0; j < 32; ++j) s += qf[j] * xb[j];
      acc[r] += d * s;
    }
  }
  for (int r = 0; r < kRows; ++r) out[r] = acc[r];
}

__attribute__((target("avx2,fma"))) void q8_0_gemv_avx2(const uint8_t* data, size_t rb, int64_t V, const float* x,
                                                        int D, float* logits) {
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < V; ++v) q8_0_dot_rows<1>(data + size_t(v) * rb, x, D, D, &logits[v]);
}
void q8_0_gemv_plain(const uint8_t* data, size_t rb, int64_t V, const float* x, int D, float* logits) {
#pragma omp parallel for schedule(static)
  for (int64_t v = 0; v < V; ++v) q8_0_dot_rows<1>(data + size_t(v) * rb, x, D, D, &logits[v]);
}

}  // namespace

void GemmaModel::output_head(const float* x, int64_t n, float* logits) const {
  const int D = cfg_.d_model;
  const int64_t V = cfg_.vocab, block = 8192;
  const size_t rb = ggml_row_bytes(embd_->type, D);
  if (n == 1 && embd_->type == uint32_t(GgmlType::q8_0)) {
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx2) q8_0_gemv_avx2(embd_->data, rb, V, x, D, logits);
    else q8_0_gemv_plain(embd_->data, rb, V, x, D, logits);
    return;
  }
  std::vector<float> tile(static_cast<size_t>(block * D));
  for (int64_t v0 = 0; v0 < V; v0 += block) {
    const int64_t nb = std::min(block, V - v0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < nb; ++r) dequantize(embd_->type, embd_->data + size_t(v0 + r) * rb, &tile[size_t(r * D)], D);
    matmul(n, nb, D, x, D, tile.data(), D, true, logits + v0, V);
  }
}

GemmaSequence::GemmaSequence(const GemmaModel& model, int64_t max_tokens) : m_(model), cap_(max_tokens) {
  const auto& c = m_.config();
  const size_t per = size_t(max_tokens) * size_t(c.n_kv_head * c.head_dim);
  k_.resize(size_t(c.n_layer));
  v_.resize(size_t(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i) {
    k_[size_t(i)].assign(per, 0.0f);
    v_[size_t(i)].assign(per, 0.0f);
  }
}

void GemmaSequence::truncate(int64_t n) {
  if (n < 0 || n > len_) fail(Status::invalid_argument, "truncate: length out of range");
  len_ = n;
}

// Scratch of one chunk's pass through a layer.
struct GemmaSequence::ChunkScratch {
  std::vector<float> h, q, k, v, att, o, g, u;
  ChunkScratch(const GemmaConfig& c, int64_t n)
      : h(size_t(n * c.d_model)), q(size_t(n * c.n_head * c.head_dim)), k(size_t(n * c.n_kv_head * c.head_dim)),
        v(k.size()), att(q.size()), o(h.size()), g(size_t(n * c.d_ff)), u(g.size()) {}
};

void GemmaSequence::layer_forward(int li, int64_t pos0, int64_t n, float* xs, ChunkScratch& sc,
                                  const GlobalQkvHook& hook, GlobalAttentionBackend* backend) {
  const GemmaConfig& c = m_.config();
  const int D = c.d_model, H = c.n_head, HK = c.n_kv_head, d = c.head_dim, F = c.d_ff;
  const int Q = H * d, KV = HK * d, group = H / HK;
  std::vector<float>&h = sc.h, &q = sc.q, &k = sc.k, &v = sc.v, &att = sc.att, &o = sc.o, &g = sc.g, &u = sc.u;
  const size_t xn = size_t(n) * size_t(D);
  float* x = xs;
  const LayerWeights& L = m_.layer(li);
  const bool global = c.is_global(li);
  internal::rms_norm_rows(x, L.attn_norm.data(), h.data(), n, D, c.eps);
  matmul(n, Q, D, h.data(), D, L.wq.data(), D, true, q.data(), Q);
  matmul(n, KV, D, h.data(), D, L.wk.data(), D, true, k.data(), KV);
  matmul(n, KV, D, h.data(), D, L.wv.data(), D, true, v.data(), KV);
  internal::rms_norm_rows(q.data(), L.q_norm.data(), q.data(), n * H, d, c.eps);
  internal::rms_norm_rows(k.data(), L.k_norm.data(), k.data(), n * HK, d, c.eps);
  const float base = global ? c.rope_base_global : c.rope_base_local;
  internal::rope_neox(q.data(), n, H, d, pos0, base);
  internal::rope_neox(k.data(), n, HK, d, pos0, base);
  float* kc = k_[size_t(li)].data();
  float* vc = v_[size_t(li)].data();
  std::memcpy(kc + pos0 * KV, k.data(), size_t(n * KV) * 4);
  std::memcpy(vc + pos0 * KV, v.data(), size_t(n * KV) * 4);
  if (global && hook) hook(li, pos0, n, q.data(), k.data(), v.data());
  if (global && backend) {
    for (int64_t i = 0; i < n; ++i)
      backend->decode(li, pos0 + i, &q[size_t(i * Q)], &k[size_t(i * KV)], &v[size_t(i * KV)], &att[size_t(i * Q)]);
  } else {
    for (int kh = 0; kh < HK; ++kh)
      internal::causal_attention(q.data() + kh * group * d, Q, n, group, d, pos0, kc + kh * d, vc + kh * d, KV,
                                 global ? 0 : c.window, c.attn_scale, att.data() + kh * group * d, Q);
  }
  matmul(n, D, Q, att.data(), Q, L.wo.data(), Q, true, o.data(), D);
  internal::rms_norm_rows(o.data(), L.post_attn_norm.data(), o.data(), n, D, c.eps);
  for (size_t i = 0; i < xn; ++i) x[i] += o[i];
  internal::rms_norm_rows(x, L.ffn_norm.data(), h.data(), n, D, c.eps);
  matmul(n, F, D, h.data(), D, L.gate.data(), D, true, g.data(), F);
  matmul(n, F, D, h.data(), D, L.up.data(), D, true, u.data(), F);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n * F; ++i) g[size_t(i)] = internal::gelu_tanh(g[size_t(i)]) * u[size_t(i)];
  matmul(n, D, F, g.data(), F, L.down.data(), F, true, o.data(), D);
  internal::rms_norm_rows(o.data(), L.post_ffw_norm.data(), o.data(), n, D, c.eps);
  for (size_t i = 0; i < xn; ++i) x[i] += o[i];
}

std::vector<float> GemmaSequence::embed_next(const int32_t* tokens, int64_t n) const {
  if (len_ + n > cap_)
    fail(Status::invalid_argument, "sequence of " + std::to_string(len_ + n) + " tokens exceeds the sequence's capacity " + std::to_string(cap_));
  const int D = m_.config().d_model;
  std::vector<float> x(size_t(n) * size_t(D));
  m_.embedding_rows(tokens, n, x.data());
  const float emb_scale = std::sqrt(float(D));
  for (float& e : x) e *= emb_scale;
  return x;
}

void GemmaSequence::forward_chunk(const int32_t* tokens, int64_t n, float* x_out, const GlobalQkvHook& hook,
                                 GlobalAttentionBackend* backend) {
  const GemmaConfig& c = m_.config();
  const int D = c.d_model;
  std::vector<float> x = embed_next(tokens, n);
  ChunkScratch sc(c, n);
  for (int li = 0; li < c.n_layer; ++li) layer_forward(li, len_, n, x.data(), sc, hook, backend);
  internal::rms_norm_rows(x.data(), m_.output_norm().data(), x_out, n, D, c.eps);
  len_ += n;
}

std::vector<float> GemmaSequence::prefill(const std::vector<int32_t>& tokens, const std::vector<int64_t>& keep_rows,
                                         int64_t chunk, const GlobalQkvHook& hook,
                                         const std::function<void(int64_t)>& progress,
                                         const std::function<void(int)>& layer_done) {
  const GemmaConfig& c = m_.config();
  const int D = c.d_model;
  std::vector<float> kept(keep_rows.size() * size_t(D));
  const int64_t n = int64_t(tokens.size());
  if (!layer_done) {  // a chunk through every layer at a time
    std::vector<float> xo;
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t m = std::min(chunk, n - s);
      xo.resize(size_t(m * D));
      forward_chunk(tokens.data() + s, m, xo.data(), hook, nullptr);
      for (size_t r = 0; r < keep_rows.size(); ++r)
        if (keep_rows[r] >= s && keep_rows[r] < s + m)
          std::memcpy(&kept[r * size_t(D)], &xo[size_t((keep_rows[r] - s) * D)], size_t(D) * 4);
      if (progress) progress(s + m);
    }
    return kept;
  }
  // Every token through a layer before the next one: the same arithmetic on
  // the same chunks (the same result, bit for bit), with each layer complete
  // early, so that its consumer (layer_done) can overlap the later layers.
  std::vector<float> x = embed_next(tokens.data(), n);
  ChunkScratch sc(c, std::min(chunk, n));  // the last, shorter chunk uses its first rows
  for (int li = 0; li < c.n_layer; ++li) {
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t m = std::min(chunk, n - s);
      layer_forward(li, len_ + s, m, x.data() + size_t(s) * size_t(D), sc, hook, nullptr);
    }
    layer_done(li);
    if (progress) progress(n * (li + 1) / c.n_layer);
  }
  for (size_t r = 0; r < keep_rows.size(); ++r)
    internal::rms_norm_rows(&x[size_t(keep_rows[r]) * size_t(D)], m_.output_norm().data(), &kept[r * size_t(D)], 1, D,
                            c.eps);
  len_ += n;
  return kept;
}

std::vector<float> GemmaSequence::decode(int32_t token, GlobalAttentionBackend* backend) {
  const auto& c = m_.config();
  std::vector<float> x(static_cast<size_t>(c.d_model));
  forward_chunk(&token, 1, x.data(), nullptr, backend);
  std::vector<float> logits(static_cast<size_t>(c.vocab));
  m_.output_head(x.data(), 1, logits.data());
  return logits;
}

void GemmaSequence::dense_attention_one(int layer, int64_t pos, const float* q, float* out) const {
  const auto& c = m_.config();
  const int d = c.head_dim, HK = c.n_kv_head, group = c.n_head / HK, KV = HK * d;
  if (pos < 0 || pos >= cap_) fail(Status::invalid_argument, "dense_attention_one: position outside the cache");
  for (int kh = 0; kh < HK; ++kh)
    internal::causal_attention(q + kh * group * d, c.n_head * d, 1, group, d, pos, k_[size_t(layer)].data() + kh * d,
                               v_[size_t(layer)].data() + kh * d, KV, c.is_global(layer) ? 0 : c.window, c.attn_scale,
                               out + kh * group * d, c.n_head * d);
}

}  // namespace rattn::engine
