#pragma once
// A Gemma-3 with random weights written as a GGUF file, for tests of the
// reference engine and what runs it.
#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/models/engine/gguf_builder.h"

namespace rattn::engine::testing {

// A Gemma-3 with random weights: 6 layers (layer 5 global), 4 query heads on
// 1 KV head of dimension 32 (or head_dim), sliding window 8, and query_pre_attn_scalar 64
// (not head_dim), so that the query scaling handed to rattn is exercised.
// `head_dim`: 64 for a model a DSL plan can describe (it takes 64, 96, 128
// or 256).
inline std::string write_tiny_gemma(const std::string& path, int vocab, int head_dim = 32) {
  const int L = 6, D = 64, H = 4, HK = 1, d = head_dim, F = 96;
  GgufBuilder b;
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
  // Single letters and the word boundary, so that plain lowercase text
  // tokenizes (one token per letter); the rest are placeholders.
  std::vector<std::string> tokens{"<pad>", "<eos>", "<bos>", "<unk>", "\xe2\x96\x81"};
  for (char ch = 'a'; ch <= 'z'; ++ch) tokens.push_back(std::string(1, ch));
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
    b.tensor(name, {cols, rows}, 0, f32_bytes(w));
  };
  auto norm = [&](const std::string& name, int n) {
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = 1.0f + 0.2f * nd(rng);
    b.tensor(name, {n}, 0, f32_bytes(w));
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
    b.tensor(p + "attn_q_norm.weight", {d}, 0, f32_bytes(qn));
    b.tensor(p + "attn_k_norm.weight", {d}, 0, f32_bytes(kn));
  }
  norm("output_norm.weight", D);
  const auto bytes = b.build();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path;
}

}  // namespace rattn::engine::testing
