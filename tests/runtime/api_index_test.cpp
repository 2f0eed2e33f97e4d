// The C API with an index in play: save/load with pending tokens and with a
// projected graph, and the kept queries that refresh the graph.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rattn.h"
#include "tests/runtime/api_fixture.h"
#include "tests/runtime/api_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using namespace rattn::testing::api;

// Deferred insertion: a sequence saved with pending tokens (evicted, not yet
// inserted) loads with them, and both copies continue identically - also in
// a context with a different batch size, whose outputs are the same because
// pending tokens are attended exactly.
TEST(ApiPending, SaveLoadWithPendingTokens) {
  rattn_context_params p = small_params();
  p.top_k = 1 << 20;
  p.insert_batch = 5;
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_EQ(info.insert_batch, 5);
  rattn_sequence* seq = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  const Inputs in(40, 3);
  ASSERT_EQ(rattn_sequence_prefill(seq, 1, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
  rattn_memory_info before, after;
  ASSERT_EQ(rattn_sequence_memory(seq, &before), RATTN_OK);
  // 12 evictions. Layer 1 of 2 inserts when (tokens + 1 * 5 / 2) % 5 == 0:
  // at 43 and 48 tokens (3 + 5 evictions), leaving 4 pending per KV head.
  EXPECT_EQ(before.pending_tokens, 0);
  decode_steps(seq, 1, 12, 100);
  ASSERT_EQ(rattn_sequence_memory(seq, &after), RATTN_OK);
  EXPECT_EQ(after.cpu_tokens, before.cpu_tokens + 12 * kHkv);
  EXPECT_EQ(after.pending_tokens, 4 * kHkv);
  {  // Layer 0 is staggered differently: inserts at 45 and 50 tokens, 2 pending.
    rattn_sequence* other = nullptr;
    ASSERT_EQ(rattn_sequence_create(ctx, &other), RATTN_OK);
    ASSERT_EQ(rattn_sequence_prefill(other, 0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
    decode_steps(other, 0, 12, 100);
    rattn_memory_info m0;
    ASSERT_EQ(rattn_sequence_memory(other, &m0), RATTN_OK);
    EXPECT_EQ(m0.pending_tokens, 2 * kHkv);
    rattn_sequence_free(other);
  }
  // The window's queries and room for a batch of pending tokens' queries.
  EXPECT_GE(after.query_ring_bytes, uint64_t(kHq) * (8 + 5) * kDim * sizeof(float));
  const std::string path = ::testing::TempDir() + "rattn_api_pending_" + std::to_string(::getpid()) + ".seq";
  ASSERT_EQ(rattn_sequence_save(seq, path.c_str()), RATTN_OK) << rattn_context_last_error(ctx);
  rattn_sequence* loaded = nullptr;
  ASSERT_EQ(rattn_sequence_load(ctx, path.c_str(), &loaded), RATTN_OK) << rattn_context_last_error(ctx);
  EXPECT_EQ(rattn_sequence_n_tokens(loaded, 1), 52);
  rattn_memory_info loaded_mem;
  ASSERT_EQ(rattn_sequence_memory(loaded, &loaded_mem), RATTN_OK);
  EXPECT_EQ(loaded_mem.pending_tokens, 4 * kHkv);
  // A context that inserts every step loads the same file.
  rattn_context_params p1 = small_params();
  p1.top_k = 1 << 20;
  rattn_context* ctx1 = nullptr;
  ASSERT_EQ(rattn_context_create(&p1, &ctx1), RATTN_OK);
  rattn_sequence* loaded1 = nullptr;
  ASSERT_EQ(rattn_sequence_load(ctx1, path.c_str(), &loaded1), RATTN_OK) << rattn_context_last_error(ctx1);
  const auto x = decode_steps(seq, 1, 20, 500), y = decode_steps(loaded, 1, 20, 500),
             z = decode_steps(loaded1, 1, 20, 500);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  // Top-k covers every token, so the batch-1 context attends to the same set
  // (the 3 pending tokens are inserted at its first step): equal up to
  // summation order. A lost or doubly counted pending token would not be.
  ASSERT_EQ(x.size(), z.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(x[i], z[i], 1e-5) << i;
  rattn_sequence_free(loaded1);
  rattn_context_free(ctx1);
  rattn_sequence_free(loaded);
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
  std::remove(path.c_str());
}

// One layer with a projected graph index: small dims, small build.
rattn_context_params small_graph_params() {
  rattn_context_params p = small_params(RATTN_INDEX_GRAPH);
  p.n_layers = 1;
  p.build_sample = 0.25f;
  p.graph_degree = 8;
  p.query_neighbors = 16;
  return p;
}

// Enough offloaded keys for a graph (not the exact fallback).
constexpr int64_t kGraphPrompt = 2600;

// A new sequence of `ctx` with layer 0 prefilled from the prompt of `seed`.
void prefilled_sequence(rattn_context* ctx, uint64_t seed, rattn_sequence** seq) {
  ASSERT_EQ(rattn_sequence_create(ctx, seq), RATTN_OK);
  const Inputs in(kGraphPrompt, seed);
  ASSERT_EQ(rattn_sequence_prefill(*seq, 0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK)
      << rattn_context_last_error(ctx);
}

TEST(ApiGraph, SaveLoadWithProjectedGraphIndex) {
  const rattn_context_params p = small_graph_params();
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_sequence* seq = nullptr;
  ASSERT_NO_FATAL_FAILURE(prefilled_sequence(ctx, 5, &seq));
  rattn_memory_info mem;
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);
  EXPECT_GT(mem.index_bytes, 0u);
  decode_steps(seq, 0, 12, 77);
  const std::string path = ::testing::TempDir() + "rattn_api_graph_" + std::to_string(::getpid()) + ".seq";
  ASSERT_EQ(rattn_sequence_save(seq, path.c_str()), RATTN_OK) << rattn_context_last_error(ctx);
  rattn_sequence* loaded = nullptr;
  ASSERT_EQ(rattn_sequence_load(ctx, path.c_str(), &loaded), RATTN_OK) << rattn_context_last_error(ctx);
  const auto x = decode_steps(seq, 0, 12, 900), y = decode_steps(loaded, 0, 12, 900);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  rattn_sequence_free(loaded);
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
  std::remove(path.c_str());
}

// Queries kept for a refresh (refresh_sample) do not change decoding; a
// refresh uses each kept query once (every round(1/F)-th inserted row, per
// query head), and decoding goes on after it.
TEST(ApiGraph, RefreshUsesTheKeptQueriesOnce) {
  rattn_context_params p = small_graph_params();
  p.n_threads = 1;
  rattn_context *plain_ctx = nullptr, *keep_ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &plain_ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  p.refresh_sample = 0.5f;
  ASSERT_EQ(rattn_context_create(&p, &keep_ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(keep_ctx, &info), RATTN_OK);
  EXPECT_EQ(info.refresh_sample, 0.5f);
  rattn_sequence *plain = nullptr, *keep = nullptr;
  ASSERT_NO_FATAL_FAILURE(prefilled_sequence(plain_ctx, 5, &plain));
  ASSERT_NO_FATAL_FAILURE(prefilled_sequence(keep_ctx, 5, &keep));
  rattn_memory_info before, after;
  ASSERT_EQ(rattn_sequence_memory(keep, &before), RATTN_OK);
  constexpr int kSteps = 40;
  const auto x = decode_steps(plain, 0, kSteps, 31), y = decode_steps(keep, 0, kSteps, 31);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  // Each step moves one token per KV head out of the window into the index:
  // CPU rows [R0, R0 + kSteps), R0 = prompt - sinks - window; even rows kept.
  const int64_t r0 = kGraphPrompt - p.sinks - p.window;
  int64_t kept_rows = 0;
  for (int64_t r = r0; r < r0 + kSteps; ++r) kept_rows += r % 2 == 0 ? 1 : 0;
  ASSERT_EQ(rattn_sequence_memory(keep, &after), RATTN_OK);
  EXPECT_GE(after.query_ring_bytes, before.query_ring_bytes + uint64_t(kHq * kept_rows * kDim) * sizeof(float));
  int64_t used = -1;
  ASSERT_EQ(rattn_sequence_refresh(keep, &used), RATTN_OK) << rattn_context_last_error(keep_ctx);
  EXPECT_EQ(used, kHq * kept_rows);
  ASSERT_EQ(rattn_sequence_refresh(keep, &used), RATTN_OK);
  EXPECT_EQ(used, 0);
  ASSERT_EQ(rattn_sequence_refresh(plain, &used), RATTN_OK);
  EXPECT_EQ(used, 0);
  // The refresh reached the graphs: the same steps now retrieve otherwise.
  const auto z = decode_steps(keep, 0, 12, 700), w = decode_steps(plain, 0, 12, 700);
  for (float f : z) ASSERT_TRUE(std::isfinite(f));
  EXPECT_NE(0, std::memcmp(z.data(), w.data(), z.size() * sizeof(float)));
  EXPECT_EQ(rattn_sequence_refresh(nullptr, &used), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(used, 0);
  rattn_sequence_free(keep);
  rattn_sequence_free(plain);
  rattn_context_free(keep_ctx);
  rattn_context_free(plain_ctx);
}

// A head keeps at most 4096 queries: at the bound the oldest half goes.
TEST(ApiGraph, KeptRefreshQueriesAreBounded) {
  rattn_context_params p = small_graph_params();
  p.n_threads = 1;
  p.refresh_sample = 1.0f;
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_sequence* seq = nullptr;
  ASSERT_NO_FATAL_FAILURE(prefilled_sequence(ctx, 9, &seq));
  constexpr int kSteps = 4200, kBound = 4096;
  decode_steps(seq, 0, kSteps, 17);
  int64_t kept = 0;  // the documented rule, step by step
  for (int s = 0; s < kSteps; ++s) kept = (kept >= kBound ? kBound / 2 : kept) + 1;
  rattn_memory_info mem;
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);
  const uint64_t ring_with_kept = mem.query_ring_bytes;
  int64_t used = 0;
  ASSERT_EQ(rattn_sequence_refresh(seq, &used), RATTN_OK) << rattn_context_last_error(ctx);
  EXPECT_EQ(used, kHq * kept);
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);  // the refresh frees them
  EXPECT_GE(ring_with_kept - mem.query_ring_bytes, uint64_t(kHq * kept * kDim) * sizeof(float));
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
}

TEST(ApiGraph, RefreshSampleContextParamsAndInfo) {
  rattn::testing::expect_context_override("refresh_sample", 0.25f, &rattn_context_params::refresh_sample,
                                          &rattn_context_info::refresh_sample);
  rattn_context_params p = small_graph_params();
  p.refresh_sample = 1.5f;
  rattn_context* ctx = nullptr;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("refresh_sample"), std::string::npos);
}

}  // namespace
