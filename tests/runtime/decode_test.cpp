// Decode correctness through the C API: with top-k covering every offloaded
// token the hybrid step equals full attention (float64 reference), across
// window wrap-around, token insertion, GQA groups and input/storage dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "rattn.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::reference_attention;
using Stream = rattn::testing::TokenStream;

std::vector<uint16_t> to_16(const std::vector<float>& x, rattn_dtype t) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = t == RATTN_F16 ? rattn::f32_to_f16(x[i]) : rattn::f32_to_bf16(x[i]);
  return out;
}

struct Case {
  int hq, hkv, d;
  int64_t prompt;
  int steps;
  int sinks, window;
  rattn_dtype input, storage;
  double tol;
  rattn_kernels_kind kernels = RATTN_KERNELS_REFERENCE;
  int insert_batch = 1;
  rattn_index_kind index = RATTN_INDEX_EXACT;
};

void run_case(const Case& c) {
  Stream s(c.hq, c.hkv, c.d, c.prompt + c.steps, 42);
  if (c.input != RATTN_F32) s.round_to(c.input == RATTN_F16 ? rattn::DType::f16 : rattn::DType::bf16);
  if (c.storage != RATTN_F32) s.round_to(c.storage == RATTN_F16 ? rattn::DType::f16 : rattn::DType::bf16);

  rattn_context_params p = rattn_context_default_params();
  p.n_layers = 2;
  p.n_q_heads = c.hq;
  p.n_kv_heads = c.hkv;
  p.head_dim = c.d;
  p.sinks = c.sinks;
  p.window = c.window;
  p.top_k = 1 << 20;  // covers every offloaded token
  p.search_queue = 16;
  p.kv_storage = c.storage;
  p.index_kind = c.index;
  p.kernels = c.kernels;
  p.insert_batch = c.insert_batch;
  p.n_threads = 2;
  // These cases check the CPU kernels (to 1e-4 and tighter); the GPU static
  // set has its own tests (DecodeGpu.*) at fp16 tolerance.
  p.use_gpu = false;
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_sequence* seq = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);

  auto pass = [&](const std::vector<float>& x) -> std::vector<uint16_t> {
    return c.input == RATTN_F32 ? std::vector<uint16_t>{} : to_16(x, c.input);
  };
  auto ptr = [&](const std::vector<float>& f, const std::vector<uint16_t>& h) -> const void* {
    return c.input == RATTN_F32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
  };
  const auto pq = s.prefix(s.q, c.hq, c.prompt), pk = s.prefix(s.k, c.hkv, c.prompt),
             pv = s.prefix(s.v, c.hkv, c.prompt);
  const auto hq16 = pass(pq), hk16 = pass(pk), hv16 = pass(pv);
  // Layer 1 only: layer 0 stays untouched, which must be allowed.
  ASSERT_EQ(rattn_sequence_prefill(seq, 1, c.prompt, ptr(pq, hq16), ptr(pk, hk16), ptr(pv, hv16), c.input),
            RATTN_OK)
      << rattn_context_last_error(ctx);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 1), c.prompt);

  std::vector<float> out(size_t(c.hq) * size_t(c.d)), lse(size_t(c.hq));
  std::vector<double> ref(size_t(c.d));
  const int group = c.hq / c.hkv;
  double max_err = 0, max_lse_err = 0;
  for (int step = 0; step < c.steps; ++step) {
    const int64_t t = c.prompt + step;
    const auto q = s.token(s.q, c.hq, t), k = s.token(s.k, c.hkv, t), v = s.token(s.v, c.hkv, t);
    const auto q16 = pass(q), k16 = pass(k), v16 = pass(v);
    ASSERT_EQ(rattn_sequence_decode(seq, 1, ptr(q, q16), ptr(k, k16), ptr(v, v16), c.input, out.data(), lse.data()),
              RATTN_OK)
        << rattn_context_last_error(ctx);
    for (int h = 0; h < c.hq; ++h) {
      const int kvh = h / group;
      double ref_lse;
      reference_attention(q.data() + size_t(h) * size_t(c.d), s.k.data() + size_t(kvh) * size_t(s.total) * size_t(c.d),
                          s.v.data() + size_t(kvh) * size_t(s.total) * size_t(c.d), t + 1, c.d, ref.data(), &ref_lse);
      for (int j = 0; j < c.d; ++j)
        max_err = std::max(max_err, std::abs(double(out[size_t(h) * size_t(c.d) + size_t(j)]) - ref[size_t(j)]));
      max_lse_err = std::max(max_lse_err, std::abs(double(lse[size_t(h)]) - ref_lse));
    }
  }
  EXPECT_LT(max_err, c.tol);
  EXPECT_LT(max_lse_err, c.tol * 10);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 1), c.prompt + c.steps);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 0);

  rattn_memory_info mem;
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);
  const int64_t offloaded =
      std::max<int64_t>(0, c.prompt + c.steps - c.sinks - c.window) * c.hkv;
  EXPECT_EQ(mem.cpu_tokens, offloaded);
  // Pending tokens never reach a full batch (a full one is inserted at once).
  EXPECT_LT(mem.pending_tokens, int64_t(c.insert_batch) * c.hkv);
  EXPECT_LE(mem.pending_tokens, offloaded);
  EXPECT_GE(mem.cpu_kv_bytes, uint64_t(offloaded) * 2 * uint64_t(c.d) * (c.storage == RATTN_F32 ? 4 : 2));
  EXPECT_EQ(mem.total_bytes, mem.static_set_bytes + mem.cpu_kv_bytes + mem.index_bytes +
                                 mem.query_ring_bytes + mem.scratch_bytes);
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
}

// fp32 in, fp32 stored: only summation order differs from the reference.
TEST(Decode, EqualsFullAttentionWhenTopKCoversAll_F32) {
  run_case({4, 2, 32, 300, 90, 16, 32, RATTN_F32, RATTN_F32, 2e-5});
}
// The window wraps several times; each evicted token is inserted into the index.
TEST(Decode, EqualsFullAttentionAcrossManyWindowWraps) {
  run_case({2, 1, 16, 70, 200, 8, 8, RATTN_F32, RATTN_F32, 2e-5});
}
// Prompt shorter than the static set: sinks fill, then the window, then eviction.
TEST(Decode, EqualsFullAttentionFromShortPrompt) {
  run_case({4, 1, 16, 3, 60, 8, 16, RATTN_F32, RATTN_F32, 2e-5});
}
// fp16 inputs stored as fp16: the reference sees the same rounded values.
TEST(Decode, EqualsFullAttentionF16) {
  run_case({4, 2, 64, 400, 40, 32, 64, RATTN_F16, RATTN_F16, 2e-5});
}
// The production kernels (Halide, compiled on first use) in the same step.
TEST(Decode, EqualsFullAttentionWithHalideKernels) {
  run_case({4, 1, 64, 300, 40, 16, 32, RATTN_F16, RATTN_F16, 1e-4, RATTN_KERNELS_HALIDE});
}
// bf16 inputs converted to fp16 storage.
TEST(Decode, EqualsFullAttentionBf16InputF16Storage) {
  run_case({2, 2, 32, 200, 30, 16, 16, RATTN_BF16, RATTN_F16, 2e-5});
}

// Deferred insertion: evicted tokens stay pending (attended exactly) until a
// batch of 7 is inserted; every step, including those with a partly filled
// batch and the insertion steps, equals full attention. 200 steps over a
// 16-token static set: many batches, and a partial batch at the end.
TEST(Decode, DeferredInsertionEqualsFullAttention) {
  run_case({4, 2, 32, 300, 200, 8, 8, RATTN_F32, RATTN_F32, 2e-5, RATTN_KERNELS_REFERENCE, 7});
}
// A batch larger than the whole run: no token is ever inserted, all of them
// are attended as pending tokens.
TEST(Decode, DeferredInsertionNeverInsertedEqualsFullAttention) {
  run_case({2, 1, 16, 100, 60, 4, 8, RATTN_F32, RATTN_F32, 2e-5, RATTN_KERNELS_REFERENCE, 1000});
}
// The Halide kernels with deferred insertion (group attention of the pending
// rows in the CPU store).
TEST(Decode, DeferredInsertionWithHalideKernels) {
  run_case({4, 1, 64, 300, 40, 16, 16, RATTN_F16, RATTN_F16, 1e-4, RATTN_KERNELS_HALIDE, 5});
}
// The projected graph with batches: inserted tokens are searched through the
// graph. With top-k = every token it must still equal full attention once the
// graph returns every indexed key (a small graph with a long queue).
TEST(Decode, DeferredInsertionIntoProjectedGraph) {
  run_case({2, 1, 16, 2600, 40, 4, 8, RATTN_F32, RATTN_F32, 2e-5, RATTN_KERNELS_REFERENCE, 6, RATTN_INDEX_GRAPH});
}

// top_k = 0: the static set alone (StreamingLLM-style); equals attention over
// sinks + window exactly.
TEST(Decode, StaticOnlyEqualsSinksPlusWindow) {
  const int hq = 2, hkv = 1, d = 16, sinks = 4, window = 8;
  const int64_t prompt = 50;
  Stream s(hq, hkv, d, prompt + 20, 7);
  rattn_context_params p = rattn_context_default_params();
  p.n_layers = 1;
  p.n_q_heads = hq;
  p.n_kv_heads = hkv;
  p.head_dim = d;
  p.sinks = sinks;
  p.window = window;
  p.top_k = 0;
  p.kv_storage = RATTN_F32;
  p.kernels = RATTN_KERNELS_REFERENCE;
  p.n_threads = 1;
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_sequence* seq = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  const auto pq = s.prefix(s.q, hq, prompt), pk = s.prefix(s.k, hkv, prompt), pv = s.prefix(s.v, hkv, prompt);
  ASSERT_EQ(rattn_sequence_prefill(seq, 0, prompt, pq.data(), pk.data(), pv.data(), RATTN_F32), RATTN_OK);
  std::vector<float> out(size_t(hq) * d);
  std::vector<double> ref(d);
  for (int step = 0; step < 20; ++step) {
    const int64_t t = prompt + step;
    const auto q = s.token(s.q, hq, t), k = s.token(s.k, hkv, t), v = s.token(s.v, hkv, t);
    ASSERT_EQ(rattn_sequence_decode(seq, 0, q.data(), k.data(), v.data(), RATTN_F32, out.data(), nullptr), RATTN_OK);
    // Sinks [0, 4) and the last `window` tokens (t - 7 .. t).
    std::vector<float> ks, vs;
    for (int64_t i = 0; i <= t; ++i) {
      if (i >= sinks && i <= t - window) continue;
      ks.insert(ks.end(), s.k.begin() + i * d, s.k.begin() + (i + 1) * d);
      vs.insert(vs.end(), s.v.begin() + i * d, s.v.begin() + (i + 1) * d);
    }
    for (int h = 0; h < hq; ++h) {
      double lse;
      reference_attention(q.data() + h * d, ks.data(), vs.data(), int64_t(ks.size() / d), d, ref.data(), &lse);
      for (int j = 0; j < d; ++j) EXPECT_NEAR(out[size_t(h * d + j)], ref[size_t(j)], 2e-5);
    }
  }
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
}

}  // namespace
