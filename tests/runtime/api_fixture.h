#pragma once
// The C API tests' small model, its inputs and a fixture holding one context
// and one sequence of it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rattn.h"
#include "tests/runtime/test_util.h"

namespace rattn::testing::api {

using rattn::testing::random_normal;

using rattn::testing::random_normal;

constexpr int kHq = 4, kHkv = 2, kDim = 16;

inline rattn_context_params small_params(rattn_index_kind kind = RATTN_INDEX_EXACT) {
  rattn_context_params p = rattn_context_default_params();
  p.n_layers = 2;
  p.n_q_heads = kHq;
  p.n_kv_heads = kHkv;
  p.head_dim = kDim;
  p.sinks = 4;
  p.window = 8;
  p.top_k = 6;
  p.search_queue = 12;
  p.index_kind = kind;
  p.kernels = RATTN_KERNELS_REFERENCE;  // these tests are about the API, not the kernels
  p.n_threads = 2;
  return p;
}

// small_params() whose index builds report their progress into *seen.
inline rattn_context_params params_recording_progress(std::vector<float>* seen) {
  rattn_context_params p = small_params();
  p.progress_callback = [](float f, void* ud) { static_cast<std::vector<float>*>(ud)->push_back(f); };
  p.progress_user_data = seen;
  return p;
}

struct Inputs {
  int64_t n;
  std::vector<float> q, k, v;
  explicit Inputs(int64_t n_, uint64_t seed)
      : n(n_), q(random_normal(size_t(kHq) * size_t(n_) * kDim, seed)),
        k(random_normal(size_t(kHkv) * size_t(n_) * kDim, seed + 1)),
        v(random_normal(size_t(kHkv) * size_t(n_) * kDim, seed + 2)) {}
};

// Decodes `steps` tokens on `layer` from a seeded stream; returns every output.
inline std::vector<float> decode_steps(rattn_sequence* seq, int layer, int steps, uint64_t seed) {
  std::vector<float> all;
  std::vector<float> out(size_t(kHq) * kDim);
  for (int s = 0; s < steps; ++s) {
    const auto q = random_normal(size_t(kHq) * kDim, seed + 3 * uint64_t(s));
    const auto k = random_normal(size_t(kHkv) * kDim, seed + 3 * uint64_t(s) + 1);
    const auto v = random_normal(size_t(kHkv) * kDim, seed + 3 * uint64_t(s) + 2);
    EXPECT_EQ(rattn_sequence_decode(seq, layer, q.data(), k.data(), v.data(), RATTN_F32, out.data(), nullptr), RATTN_OK);
    all.insert(all.end(), out.begin(), out.end());
  }
  return all;
}

class Api : public ::testing::Test {
 protected:
  void SetUp() override {
    const rattn_context_params p = small_params();
    ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  }
  void TearDown() override {
    rattn_sequence_free(seq);
    rattn_context_free(ctx);
  }
  void prefill(rattn_sequence* s, int layer, const Inputs& in) {
    ASSERT_EQ(rattn_sequence_prefill(s, layer, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK)
        << rattn_context_last_error(ctx);
  }
  void expect_error(rattn_status got, rattn_status want, const char* needle) {
    EXPECT_EQ(got, want) << rattn_status_string(got);
    const std::string msg = rattn_context_last_error(ctx);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
  }
  std::string temp_path(const char* name) {
    return ::testing::TempDir() + "rattn_api_test_" + std::to_string(::getpid()) + "_" + name;
  }
  rattn_context* ctx = nullptr;
  rattn_sequence* seq = nullptr;
};

}  // namespace rattn::testing::api
