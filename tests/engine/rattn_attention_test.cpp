// The engine with its global layers on rattn's C API must equal the dense
// engine when retrieval returns every offloaded token (exact index, top-k
// larger than the offloaded set): checked on a tiny random Gemma-3 written as
// a GGUF file (always), and on the real model when it is installed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "core/error.h"
#include "models/engine/rattn_attention.h"
#include "tests/engine/gguf_builder.h"
#include "tests/engine/installed_model.h"

namespace rattn::engine {
namespace {

constexpr uint32_t kF32 = 0;

using testing::f32_bytes;

// A Gemma-3 with random weights: 6 layers (layer 5 global), 4 query heads on
// 1 KV head of dimension 32, sliding window 8, and query_pre_attn_scalar 64
// (not head_dim), so that the query scaling handed to rattn is exercised.
std::string write_tiny_gemma(const std::string& path, int vocab) {
  const int L = 6, D = 64, H = 4, HK = 1, d = 32, F = 96;
  testing::GgufBuilder b;
  b.kv_str("general.architecture", "gemma3");
  b.kv_u32("gemma3.block_count", L);
  b.kv_u32("gemma3.embedding_length", D);
  b.kv_u32("gemma3.attention.head_count", H);
  b.kv_u32("gemma3.attention.head_count_kv", HK);
  b.kv_u32("gemma3.attention.key_length", d);
  b.kv_u32("gemma3.attention.value_length", d);
  b.kv_u32("gemma3.feed_forward_length", F);
  b.kv_u32("gemma3.context_length", 1024);
  b.kv_u32("gemma3.attention.sliding_window", 8);
  b.kv_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  b.kv_f32("gemma3.rope.freq_base", 1e6f);
  b.kv_u32("gemma3.attention.query_pre_attn_scalar", 64);
  std::vector<std::string> tokens{"<pad>", "<eos>", "<bos>", "<unk>"};
  while (int(tokens.size()) < vocab) tokens.push_back("t" + std::to_string(tokens.size()));
  b.kv_str("tokenizer.ggml.model", "llama");
  b.kv_str_array("tokenizer.ggml.tokens", tokens);
  b.kv_u32("tokenizer.ggml.bos_token_id", 2);
  b.kv_u32("tokenizer.ggml.eos_token_id", 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto mat = [&](const std::string& name, int rows, int cols, float scale) {
    std::vector<float> w(size_t(rows) * size_t(cols));
    for (float& x : w) x = nd(rng) * scale;
    b.tensor(name, {cols, rows}, kF32, f32_bytes(w));
  };
  auto norm = [&](const std::string& name, int n) {
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = 1.0f + 0.2f * nd(rng);
    b.tensor(name, {n}, kF32, f32_bytes(w));
  };
  mat("token_embd.weight", vocab, D, 0.3f);
  for (int i = 0; i < L; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    mat(p + "attn_q.weight", H * d, D, 1.0f / std::sqrt(float(D)));
    mat(p + "attn_k.weight", HK * d, D, 1.0f / std::sqrt(float(D)));
    mat(p + "attn_v.weight", HK * d, D, 1.0f / std::sqrt(float(D)));
    mat(p + "attn_output.weight", D, H * d, 1.0f / std::sqrt(float(H * d)));
    mat(p + "ffn_gate.weight", F, D, 1.0f / std::sqrt(float(D)));
    mat(p + "ffn_up.weight", F, D, 1.0f / std::sqrt(float(D)));
    mat(p + "ffn_down.weight", D, F, 1.0f / std::sqrt(float(F)));
    for (const char* n : {"attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"}) norm(p + n + ".weight", D);
    // Large QK-norm gains make the attention peaked, so that a wrong key set
    // (or scale) shows in the logits.
    std::vector<float> qn(static_cast<size_t>(d)), kn(static_cast<size_t>(d));
    for (float& x : qn) x = 3.0f + nd(rng);
    for (float& x : kn) x = 3.0f + nd(rng);
    b.tensor(p + "attn_q_norm.weight", {d}, kF32, f32_bytes(qn));
    b.tensor(p + "attn_k_norm.weight", {d}, kF32, f32_bytes(kn));
  }
  norm("output_norm.weight", D);
  const auto bytes = b.build();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

struct DecodeRun {
  std::vector<std::vector<float>> logits;  // per teacher-forced step
  std::vector<double> attention_errors, oracle_errors;
};

// Prefills `prompt`, then decodes `next` teacher-forced, dense or on rattn.
DecodeRun run(const GemmaModel& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& next,
              const RattnAttentionParams* params) {
  const auto& c = m.config();
  const int64_t T = int64_t(prompt.size());
  GemmaSession s(m, T + int64_t(next.size()) + 1);
  GlobalQkv qkv;
  qkv.init(c, T);
  s.prefill(prompt, {T - 1}, 64, qkv.hook());
  std::unique_ptr<RattnAttention> backend;
  if (params) backend = std::make_unique<RattnAttention>(c, *params, qkv, &s);
  DecodeRun r;
  for (int32_t t : next) r.logits.push_back(s.decode(t, backend.get()));
  if (backend)
    for (size_t g = 0; g < qkv.layers.size(); ++g) {
      r.attention_errors.insert(r.attention_errors.end(), backend->errors()[g].begin(), backend->errors()[g].end());
      r.oracle_errors.insert(r.oracle_errors.end(), backend->oracle_errors()[g].begin(), backend->oracle_errors()[g].end());
    }
  return r;
}

class TinyGemma : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    set_engine_threads(2);
    path_ = (std::filesystem::temp_directory_path() / ("rattn_tiny_gemma_" + std::to_string(::getpid()) + ".gguf")).string();
    write_tiny_gemma(path_, 300);
    model_ = GemmaModel::load(path_).release();
  }
  static void TearDownTestSuite() {
    delete model_;
    std::filesystem::remove(path_);
  }
  static std::vector<int32_t> tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t{2};
    while (int(t.size()) < n) t.push_back(int32_t(4 + rng() % 296));
    return t;
  }
  static inline std::string path_;
  static inline GemmaModel* model_ = nullptr;
};

TEST_F(TinyGemma, RattnWithEveryOffloadedTokenEqualsDenseAttention) {
  const auto& c = model_->config();
  ASSERT_EQ(c.global_layers(), std::vector<int>{5});
  ASSERT_FLOAT_EQ(c.attn_scale, 0.125f);  // 1/sqrt(query_pre_attn_scalar = 64), not 1/sqrt(32)
  const auto prompt = tokens(150, 1), next = tokens(40, 2);
  const DecodeRun dense = run(*model_, prompt, next, nullptr);
  RattnAttentionParams p;
  p.sinks = 4;
  p.window = 16;  // the 40 decoded tokens push 40 prompt tokens out of the window: the insert path runs too
  p.top_k = 1 << 30;
  p.index = RATTN_INDEX_EXACT;
  p.kv_storage = RATTN_F32;
  p.kernels = RATTN_KERNELS_REFERENCE;
  const DecodeRun ra = run(*model_, prompt, next, &p);
  ASSERT_EQ(ra.logits.size(), dense.logits.size());
  for (size_t i = 0; i < next.size(); ++i) {
    EXPECT_LT(rel_l2(ra.logits[i], dense.logits[i]), 1e-4) << "step " << i;
    EXPECT_EQ(argmax(ra.logits[i]), argmax(dense.logits[i])) << "step " << i;
  }
  for (double e : ra.attention_errors) EXPECT_LT(e, 1e-5);
  for (double e : ra.oracle_errors) EXPECT_LT(e, 1e-6);  // top-k keeps everything (float rounding only)
  // f16 storage: close, not bit-equal.
  p.kv_storage = RATTN_F16;
  const DecodeRun ra16 = run(*model_, prompt, next, &p);
  for (size_t i = 0; i < next.size(); ++i) EXPECT_LT(rel_l2(ra16.logits[i], dense.logits[i]), 1e-2) << "step " << i;
}

TEST_F(TinyGemma, SmallTopKDiffersAndMatchesTheExactTopKOracle) {
  // Control: with 2 sinks, a window of 4 and top-2 retrieval the output must
  // move away from dense attention (the check above can fail), and an exact
  // index returns exactly the oracle's key set (same static set + exact top-k).
  const auto prompt = tokens(150, 3), next = tokens(20, 4);
  const DecodeRun dense = run(*model_, prompt, next, nullptr);
  RattnAttentionParams p;
  p.sinks = 2;
  p.window = 4;
  p.top_k = 2;
  p.index = RATTN_INDEX_EXACT;
  p.kv_storage = RATTN_F32;
  p.kernels = RATTN_KERNELS_REFERENCE;
  const DecodeRun ra = run(*model_, prompt, next, &p);
  double worst = 0;
  for (size_t i = 0; i < next.size(); ++i) worst = std::max(worst, rel_l2(ra.logits[i], dense.logits[i]));
  EXPECT_GT(worst, 1e-3);
  ASSERT_EQ(ra.attention_errors.size(), ra.oracle_errors.size());
  for (size_t i = 0; i < ra.attention_errors.size(); ++i) {
    EXPECT_GT(ra.oracle_errors[i], 1e-4);
    EXPECT_NEAR(ra.attention_errors[i], ra.oracle_errors[i], 1e-4 + 1e-3 * ra.oracle_errors[i]) << "step " << i;
  }
}

// Per-layer decode searches go by the model's layer numbers: without a plan
// the context numbers only the global layers (the tiny model's layer 5 is
// its layer 0), and the engine maps both ways; a local layer is refused.
TEST_F(TinyGemma, LayerSearchUsesTheModelsLayerNumbers) {
  const auto& c = model_->config();
  const auto prompt = tokens(150, 5);
  const int64_t T = int64_t(prompt.size());
  GemmaSession s(*model_, T + 1);
  GlobalQkv qkv;
  qkv.init(c, T);
  s.prefill(prompt, {T - 1}, 64, qkv.hook());
  RattnAttentionParams p;
  p.sinks = 4;
  p.window = 16;
  p.search_queue = 120;
  p.kernels = RATTN_KERNELS_REFERENCE;
  p.layer_search = {{5, 300, 7, -1, 9}};
  RattnAttention backend(c, p, qkv, &s);
  EXPECT_EQ(backend.global_layers(), std::vector<int>{5});
  const rattn_layer_search own = backend.layer_search(5);
  EXPECT_EQ(own.layer, 5);
  EXPECT_EQ(own.search_queue, 300);
  EXPECT_EQ(own.search_seeds, 7);
  EXPECT_EQ(own.search_expand_first, 0);  // -1 kept the plan's
  EXPECT_EQ(own.search_full_expand, 9);
  EXPECT_EQ(backend.info().search_queue, 120);  // the plan-wide value stays
  EXPECT_THROW(backend.layer_search(4), rattn::Error);
  p.layer_search = {{4, 300, -1, -1, -1}};
  EXPECT_THROW(RattnAttention(c, p, qkv, &s), rattn::Error);
}

TEST(TopKOracle, MatchesAFloat64LoopOverTheKeptKeys) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int heads = 2, d = 8;
  const int64_t pos = 40, sinks = 3, window = 5, top_k = 4;
  std::vector<float> q(size_t(heads * d)), k(size_t((pos + 1) * d)), v(size_t((pos + 1) * d));
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  std::vector<double> full(size_t(heads * d)), oracle(size_t(heads * d));
  internal::attention_with_topk_oracle_f64(q.data(), heads, d, k.data(), v.data(), d, pos, 0.5, sinks, window, top_k,
                                           full.data(), oracle.data());
  for (int h = 0; h < heads; ++h) {
    std::vector<double> s(size_t(pos + 1));
    for (int64_t j = 0; j <= pos; ++j) {
      double a = 0;
      for (int i = 0; i < d; ++i) a += double(q[size_t(h * d + i)]) * k[size_t(j * d + i)];
      s[size_t(j)] = 0.5 * a;
    }
    std::vector<int64_t> off;
    for (int64_t j = sinks; j <= pos - window; ++j) off.push_back(j);
    std::sort(off.begin(), off.end(), [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
    std::vector<bool> keep(size_t(pos + 1), true);
    for (size_t i = size_t(top_k); i < off.size(); ++i) keep[size_t(off[i])] = false;
    for (int which = 0; which < 2; ++which) {
      double sum = 0;
      std::vector<double> acc(size_t(d), 0.0);
      for (int64_t j = 0; j <= pos; ++j) {
        if (which == 1 && !keep[size_t(j)]) continue;
        const double w = std::exp(s[size_t(j)]);
        sum += w;
        for (int i = 0; i < d; ++i) acc[size_t(i)] += w * v[size_t(j * d + i)];
      }
      const auto& got = which == 0 ? full : oracle;
      for (int i = 0; i < d; ++i) EXPECT_NEAR(got[size_t(h * d + i)], acc[size_t(i)] / sum, 1e-12);
    }
  }
}


TEST(RealGemma, RattnWithEveryOffloadedTokenEqualsDenseAttention) {
  const std::string path = testing::installed_gemma_gguf();
  if (path.empty()) GTEST_SKIP() << "Gemma-3 GGUF not installed: run scripts/get-gemma or set RATTN_GEMMA_GGUF";
  set_engine_threads(2);
  auto m = GemmaModel::load(path);
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "Section " + std::to_string(i) + ". The sort command sorts lines of text files; with -n it compares "
            "numbers, with -r it reverses the order, and -k selects the key fields.\n";
  auto ids = m->tokenizer().encode(text, true);
  ASSERT_GT(ids.size(), 300u);
  const std::vector<int32_t> prompt(ids.begin(), ids.end() - 12), next(ids.end() - 12, ids.end());
  const DecodeRun dense = run(*m, prompt, next, nullptr);
  RattnAttentionParams p;
  p.sinks = 8;
  p.window = 32;
  p.top_k = 1 << 30;
  p.index = RATTN_INDEX_EXACT;
  p.kv_storage = RATTN_F32;
  p.kernels = RATTN_KERNELS_REFERENCE;
  const DecodeRun ra = run(*m, prompt, next, &p);
  for (size_t i = 0; i < next.size(); ++i) {
    EXPECT_LT(rel_l2(ra.logits[i], dense.logits[i]), 1e-4) << "step " << i;
    EXPECT_EQ(argmax(ra.logits[i]), argmax(dense.logits[i])) << "step " << i;
  }
}

}  // namespace
}  // namespace rattn::engine
