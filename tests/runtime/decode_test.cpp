// Decode correctness through the C API: with top-k covering every offloaded
// token the hybrid step equals full attention (float64 reference), across
// window wrap-around, token insertion, GQA groups and input/storage dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "rattn.h"
#include "kernels/cpu_kernels.h"
#include "runtime/runtime.h"
#include "tests/runtime/api_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::random_normal;
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

// ---- the C++ runtime directly: search grouping and the GPU static set -------

// A small model through the C++ API (the knobs the C API does not expose).
rattn::RuntimeConfig cpp_config(int hq, int hkv, int d, int sinks, int window) {
  rattn::RuntimeConfig c;
  c.layout.name = "test";
  c.layout.num_layers = 1;
  c.layout.num_q_heads = hq;
  c.layout.num_kv_heads = hkv;
  c.layout.head_dim = d;
  c.layout.layers.assign(1, rattn::LayerSpec{});
  c.plan.sinks = sinks;
  c.plan.window = window;
  c.plan.top_k = 20;
  c.plan.search_queue = 32;
  c.plan.graph_degree = 16;
  c.plan.query_neighbors = 20;
  c.plan.build_sample = 0.5;
  c.kv_storage = rattn::DType::f16;
  c.kernels = rattn::KernelPreference::reference;
  c.threads = 1;
  c.use_gpu = false;
  return c;
}

std::string temp_path(const char* what) {
  return ::testing::TempDir() + "rattn-decode-" + what + "-" + std::to_string(::getpid()) + ".seq";
}

// Prefills layer 0 of `seq` with the first `prompt` tokens of `s`.
void prefill_prompt(rattn::Sequence& seq, const Stream& s, int64_t prompt) {
  const auto pq = s.prefix(s.q, s.hq, prompt), pk = s.prefix(s.k, s.hkv, prompt), pv = s.prefix(s.v, s.hkv, prompt);
  seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
}

// Decodes `steps` tokens of `s` from token `from` on; returns every output.
std::vector<float> decode_run(rattn::Sequence& seq, const Stream& s, int64_t from, int steps) {
  std::vector<float> outs, out(size_t(s.hq) * size_t(s.d)), lse(size_t(s.hq));
  for (int step = 0; step < steps; ++step) {
    const int64_t t = from + step;
    const auto q = s.token(s.q, s.hq, t), k = s.token(s.k, s.hkv, t), v = s.token(s.v, s.hkv, t);
    seq.decode(0, q.data(), k.data(), v.data(), rattn::DType::f32, out.data(), lse.data());
    outs.insert(outs.end(), out.begin(), out.end());
    outs.insert(outs.end(), lse.begin(), lse.end());
  }
  return outs;
}

TEST(DecodeGrouping, AutomaticChoiceKeepsEveryThreadBusy) {
  EXPECT_EQ(rattn::searches_per_item(4, 1, 1), 4);  // one thread: the whole group in one item
  EXPECT_EQ(rattn::searches_per_item(4, 1, 2), 2);  // two threads: two items of two
  EXPECT_EQ(rattn::searches_per_item(4, 1, 4), 1);
  EXPECT_EQ(rattn::searches_per_item(4, 1, 16), 1);
  EXPECT_EQ(rattn::searches_per_item(4, 8, 8), 4);  // Llama-3-8B layer on 8 threads
  EXPECT_EQ(rattn::searches_per_item(4, 8, 16), 2);
  EXPECT_EQ(rattn::searches_per_item(6, 1, 2), 3);
  EXPECT_EQ(rattn::searches_per_item(6, 1, 4), 1);  // 6 / 4 is no divisor: one head per item
  EXPECT_EQ(rattn::searches_per_item(1, 4, 1), 1);
  auto c = cpp_config(4, 1, 16, 4, 8);
  c.searches_per_item = 3;  // does not divide the group of 4
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  c.searches_per_item = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The group's searches in one item (search_many) give exactly the outputs of
// one item per query head, through the projected graph and with insertion:
// one prefilled state, loaded into runtimes that differ only in grouping.
TEST(DecodeGrouping, GroupedSearchesEqualPerHeadItems) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 60;
  const int64_t prompt = 2200;  // 2180 offloaded keys: above the graph threshold (2048)
  Stream s(hq, hkv, d, prompt + steps, 5);
  const std::string path = temp_path("grouping");
  {
    auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
    rattn::Sequence seq(rt);
    prefill_prompt(seq, s, prompt);
    seq.save(path);
  }
  std::vector<std::vector<float>> runs;
  for (int per_item : {1, 2, 4}) {
    for (int threads : {1, 3}) {
      auto c = cpp_config(hq, hkv, d, sinks, window);
      c.searches_per_item = per_item;
      c.threads = threads;
      auto seq = rattn::Sequence::load(std::make_shared<const rattn::Runtime>(c), path);
      seq->set_profiling(true);
      runs.push_back(decode_run(*seq, s, prompt, steps));
      const rattn::DecodeProfile prof = seq->profile();
      EXPECT_EQ(prof.steps, steps);
      EXPECT_GT(prof.search_ms, 0);
      EXPECT_GT(prof.insert_ms, 0);  // tokens left the window and were inserted
      EXPECT_GE(prof.total_ms, prof.prepare_ms + prof.merge_ms);
    }
  }
  std::remove(path.c_str());
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0) << "run " << i;
  }
  // Not a vacuous equality: the outputs are finite and not all zero.
  double norm = 0;
  for (float x : runs[0]) norm += double(x) * x;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 1.0);
}

// With traversal codes, a GQA group's indexes walk one set of codes per KV
// head, which the decode step updates before its work items insert and
// search: the outputs equal those of indexes with codes of their own,
// whatever the grouping and thread count (per-head items on 3 threads search
// one group's indexes while another item inserts into its own), and the
// memory counts the codes once per KV head instead of once per index.
TEST(DecodeGrouping, SharedTraversalCodesEqualOwnCodes) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 60;
  const int64_t prompt = 2200;
  Stream s(hq, hkv, d, prompt + steps, 9);
  const std::string path = temp_path("shared-codes");
  {
    auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
    rattn::Sequence seq(rt);
    prefill_prompt(seq, s, prompt);
    seq.save(path);
  }
  struct Variant {
    bool share;
    int per_item, threads, insert_batch;
  };
  std::vector<std::vector<float>> runs;
  std::vector<uint64_t> index_bytes;
  for (const Variant& v : {Variant{false, 4, 1, 1}, Variant{true, 4, 1, 1}, Variant{true, 1, 3, 1},
                           Variant{true, 2, 2, 1}, Variant{false, 1, 3, 5}, Variant{true, 1, 3, 5}}) {
    SCOPED_TRACE(::testing::Message() << "share " << v.share << " per item " << v.per_item << " threads "
                                      << v.threads << " insert batch " << v.insert_batch);
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.share_traversal_codes = v.share;
    c.searches_per_item = v.per_item;
    c.threads = v.threads;
    c.insert_batch = v.insert_batch;
    auto seq = rattn::Sequence::load(std::make_shared<const rattn::Runtime>(c), path);
    runs.push_back(decode_run(*seq, s, prompt, steps));
    index_bytes.push_back(seq->memory().index_bytes);
  }
  std::remove(path.c_str());
  // A fresh prefill shares them too (not only a load).
  std::vector<float> fresh[2];
  for (int share = 0; share < 2; ++share) {
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.share_traversal_codes = share == 1;
    rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
    prefill_prompt(seq, s, prompt);
    fresh[share] = decode_run(seq, s, prompt, steps);
  }
  ASSERT_EQ(fresh[1].size(), fresh[0].size());
  EXPECT_EQ(std::memcmp(fresh[1].data(), fresh[0].data(), fresh[0].size() * sizeof(float)), 0);
  // Runs 0-3 insert every step, 4-5 in batches of 5 (other tokens pending,
  // so other outputs): each against the own-codes run of its batch size.
  for (size_t i = 1; i < runs.size(); ++i) {
    const size_t base = i < 4 ? 0 : 4;
    if (i == base) continue;
    ASSERT_EQ(runs[i].size(), runs[base].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[base].data(), runs[base].size() * sizeof(float)), 0) << "run " << i;
  }
  double norm = 0;
  for (float x : runs[0]) norm += double(x) * x;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 1.0);
  // Own codes: 8 sets of >= 2200 rows x 64 B; shared: 2 sets.
  const uint64_t code_set = uint64_t(prompt - sinks - window) * 64;
  EXPECT_GE(index_bytes[0], index_bytes[1] + uint64_t(hq - hkv) * code_set);
}

// The outputs of 40 decode steps after a 3000-token prompt (4 query heads,
// one KV head, d 32, stream `stream_seed`) with the plan knobs `set` sets.
constexpr int kKnobSteps = 40;
std::vector<float> decode_with_plan(uint64_t stream_seed, const std::function<void(rattn::ConcretePlan&)>& set) {
  const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
  const int64_t prompt = 3000;
  Stream s(hq, hkv, d, prompt + kKnobSteps, stream_seed);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  set(c.plan);
  rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
  prefill_prompt(seq, s, prompt);
  return decode_run(seq, s, prompt, kKnobSteps);
}

// The plan's search_patience reaches the decode searches: a patience no
// walk can exhaust changes nothing, a patience of 1 stops walks early and
// so changes what is retrieved.
TEST(DecodeSearch, PlanSearchPatienceReachesTheSearches) {
  std::vector<float> outs[3];
  const int patience[3] = {0, 1 << 20, 1};
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(21, [&](rattn::ConcretePlan& p) { p.search_patience = patience[i]; });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  ASSERT_EQ(outs[2].size(), outs[0].size());
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[2].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.search_patience = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The plan's code_dims / code_coarse_dims reach the decode searches: the
// walk on projected codes (16 8-bit + 16 4-bit directions at d 32, one line)
// retrieves differently from the 8-bit codes of the raw keys, but the
// outputs stay close to them; sharing is skipped for projected codes (each
// head's fit its own queries), so asking for it changes nothing; bad shapes
// are refused.
TEST(DecodeSearch, PlanCodeDimsReachTheSearches) {
  std::vector<float> raw = decode_with_plan(23, [](rattn::ConcretePlan& p) { p.traversal_codes = true; });
  std::vector<float> projected[2];
  for (int share = 0; share < 2; ++share) {
    const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
    const int64_t prompt = 3000;
    Stream s(hq, hkv, d, prompt + kKnobSteps, 23);
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.plan.code_dims = 32;
    c.plan.code_coarse_dims = 16;
    c.share_traversal_codes = share == 1;
    rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
    prefill_prompt(seq, s, prompt);
    projected[share] = decode_run(seq, s, prompt, kKnobSteps);
    // One 64-byte row per key and query head, beside the graphs; each head's
    // search scratch holds a visited byte per key.
    EXPECT_GE(seq.memory().index_bytes, uint64_t(hq) * uint64_t(prompt - sinks - window) * (64 + 4 * 17)) << share;
    EXPECT_GE(seq.memory().scratch_bytes, uint64_t(hq) * uint64_t(prompt - sinks - window)) << share;
  }
  ASSERT_EQ(projected[0].size(), raw.size());
  EXPECT_EQ(std::memcmp(projected[1].data(), projected[0].data(), raw.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(projected[0].data(), raw.data(), raw.size() * sizeof(float)), 0);
  double dot = 0, nr = 0, np = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    dot += double(raw[i]) * projected[0][i];
    nr += double(raw[i]) * raw[i];
    np += double(projected[0][i]) * projected[0][i];
  }
  // Outputs and lse of 40 steps as one vector (0.9987 measured: 16 of the 32
  // directions are 4-bit here, far coarser than the 48 + 32 of d = 128).
  EXPECT_GT(dot / std::sqrt(nr * np), 0.995);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.code_dims = 33;  // above head_dim
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  c.plan.code_dims = 16;
  c.plan.code_coarse_dims = 17;  // above code_dims
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The plan's search_seeds reach the decode searches: the first step (no
// previous results) is the same with and without them, later steps retrieve
// differently (the seeded walks start elsewhere); a count above k takes
// every previous result and gives the same as exactly k; negative counts
// are refused.
TEST(DecodeSearch, PlanSearchSeedsReachTheSearches) {
  // Seeds: none, more than any step finds, exactly k; the smallest queue,
  // where seeds matter most.
  std::vector<float> outs[3];
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(22, [&](rattn::ConcretePlan& p) {
      p.search_queue = p.top_k;
      p.search_seeds = i == 0 ? 0 : i == 1 ? 1 << 16 : int(p.top_k);
    });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  const size_t step_floats = outs[0].size() / kKnobSteps;
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), step_floats * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[1].data() + step_floats, outs[0].data() + step_floats,
                        (outs[0].size() - step_floats) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(outs[2].data(), outs[1].data(), outs[1].size() * sizeof(float)), 0);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.search_seeds = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The C API: -1 keeps the plan's search_seeds, >= 0 overrides them, the
// info reports them, < -1 is refused naming the field.
TEST(DecodeSearch, SearchSeedsContextParamsAndInfo) {
  rattn::testing::expect_context_override("search_seeds", 32, &rattn_context_params::search_seeds,
                                          &rattn_context_info::search_seeds);
}

// The plan's partial expansion reaches the decode searches: a first count
// above any list's length changes nothing, a first count of 2 with whole
// lists for the best candidate only changes what is retrieved; negative
// values are refused.
TEST(DecodeSearch, PlanPartialExpansionReachesTheSearches) {
  std::vector<float> outs[3];
  const int first[3] = {0, 1 << 16, 2};
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(23, [&](rattn::ConcretePlan& p) {
      p.search_expand_first = first[i];
      p.search_full_expand = 1;
    });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  ASSERT_EQ(outs[2].size(), outs[0].size());
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[2].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  for (int bad = 0; bad < 2; ++bad) {
    auto c = cpp_config(4, 1, 32, 4, 16);
    (bad == 0 ? c.plan.search_expand_first : c.plan.search_full_expand) = -1;
    EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  }
}

TEST(DecodeSearch, PartialExpansionContextParamsAndInfo) {
  rattn::testing::expect_context_override("search_expand_first", 8, &rattn_context_params::search_expand_first,
                                          &rattn_context_info::search_expand_first);
  rattn::testing::expect_context_override("search_full_expand", 50, &rattn_context_params::search_full_expand,
                                          &rattn_context_info::search_full_expand);
}

// Two global layers fed the same stream, the plan set by `set`: each
// layer's outputs of kKnobSteps decode steps.
std::array<std::vector<float>, 2> decode_two_layers(const std::function<void(rattn::ConcretePlan&)>& set) {
  const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
  const int64_t prompt = 3000;
  Stream s(hq, hkv, d, prompt + kKnobSteps, 29);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  c.layout.num_layers = 2;
  c.layout.layers.assign(2, rattn::LayerSpec{});
  set(c.plan);
  rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
  const auto pq = s.prefix(s.q, s.hq, prompt), pk = s.prefix(s.k, s.hkv, prompt), pv = s.prefix(s.v, s.hkv, prompt);
  for (int layer = 0; layer < 2; ++layer) seq.prefill(layer, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
  std::array<std::vector<float>, 2> outs;
  std::vector<float> out(size_t(hq) * size_t(d)), lse(static_cast<size_t>(hq));
  for (int step = 0; step < kKnobSteps; ++step) {
    const int64_t t = prompt + step;
    const auto q = s.token(s.q, s.hq, t), k = s.token(s.k, s.hkv, t), v = s.token(s.v, s.hkv, t);
    for (int layer = 0; layer < 2; ++layer) {
      seq.decode(layer, q.data(), k.data(), v.data(), rattn::DType::f32, out.data(), lse.data());
      outs[size_t(layer)].insert(outs[size_t(layer)].end(), out.begin(), out.end());
      outs[size_t(layer)].insert(outs[size_t(layer)].end(), lse.begin(), lse.end());
    }
  }
  return outs;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A layer's own decode-search values (`layer N { ... }`) reach that layer's
// searches and no other: partial expansion 2:1 on layer 1 alone leaves
// layer 0 as in the plain plan, and gives layer 1 exactly what the same
// values plan-wide give it; a layer's own queue works likewise.
TEST(DecodeSearch, LayerSearchReachesOnlyItsLayer) {
  const auto plain = decode_two_layers([](rattn::ConcretePlan&) {});
  const auto own = decode_two_layers([](rattn::ConcretePlan& p) {
    p.layer_search[1] = {{"search_expand_first", 2}, {"search_full_expand", 1}};
  });
  const auto wide = decode_two_layers([](rattn::ConcretePlan& p) {
    p.search_expand_first = 2;
    p.search_full_expand = 1;
  });
  EXPECT_TRUE(same_bytes(own[0], plain[0]));
  EXPECT_FALSE(same_bytes(own[1], plain[1]));
  EXPECT_TRUE(same_bytes(own[1], wide[1]));
  EXPECT_FALSE(same_bytes(wide[0], plain[0]));
  const auto queue = decode_two_layers([](rattn::ConcretePlan& p) { p.layer_search[0] = {{"search_queue", 20}}; });
  EXPECT_FALSE(same_bytes(queue[0], plain[0]));
  EXPECT_TRUE(same_bytes(queue[1], plain[1]));
}

TEST(DecodeSearch, LayerSearchOfABadLayerOrKeyIsRefused) {
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.layout.num_layers = 2;
  c.layout.layers.assign(2, rattn::LayerSpec{});
  c.layout.layers[1].global = false;
  c.layout.layers[1].sliding_window = 8;
  const std::vector<std::map<int, std::map<std::string, int>>> bad = {
      {{2, {{"search_queue", 40}}}},          // no such layer
      {{1, {{"search_queue", 40}}}},          // a sliding-window layer
      {{0, {{"top_k", 40}}}},                 // not a decode-search key
      {{0, {{"search_queue", 0}}}},           // a queue of nothing
      {{0, {{"search_expand_first", -1}}}}};  // negative
  for (const auto& b : bad) {
    c.plan.layer_search = b;
    EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  }
  c.plan.layer_search = {{0, {{"search_queue", 40}}}};
  EXPECT_NO_THROW(rattn::validate_config(c));
}

// Through the C API: the plan's `layer N { ... }` values, rattn_context_get_layer_search,
// a plan-wide override replacing the layers' own values of its key, and
// per-layer entries of rattn_context_params.
TEST(DecodeSearch, LayerSearchThroughTheCApi) {
  const std::string plan =
      "model \"M\" { layers = 4; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192;\n"
      "  pattern = repeat [local(64), global]; }\n"
      "plan { search_queue = 120; search_seeds = 10;\n"
      "  layer 3 { search_queue = 300; search_expand_first = 8; search_full_expand = 50; } }\n";
  rattn_context_params p = rattn_context_default_params();
  EXPECT_EQ(p.layer_search, nullptr);
  EXPECT_EQ(p.n_layer_search, 0);
  p.plan_text = plan.c_str();
  p.kernels = RATTN_KERNELS_REFERENCE;
  p.use_gpu = false;
  p.n_threads = 1;
  auto resolved = [&](const rattn_context_params& params, int layer) {
    rattn_context* ctx = nullptr;
    rattn_layer_search s{-1, -1, -1, -1, -1};
    EXPECT_EQ(rattn_context_create(&params, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    if (!ctx) return s;
    EXPECT_EQ(rattn_context_get_layer_search(ctx, layer, &s), RATTN_OK) << rattn_context_last_error(ctx);
    rattn_layer_search local{};
    EXPECT_EQ(rattn_context_get_layer_search(ctx, 0, &local), RATTN_INVALID_ARGUMENT);  // a local layer
    EXPECT_EQ(rattn_context_get_layer_search(ctx, 4, &local), RATTN_INVALID_ARGUMENT);
    rattn_context_free(ctx);
    return s;
  };
  auto expect = [](const rattn_layer_search& s, int layer, int queue, int seeds, int first, int full) {
    EXPECT_EQ(s.layer, layer);
    EXPECT_EQ(s.search_queue, queue);
    EXPECT_EQ(s.search_seeds, seeds);
    EXPECT_EQ(s.search_expand_first, first);
    EXPECT_EQ(s.search_full_expand, full);
  };
  expect(resolved(p, 1), 1, 120, 10, 0, 0);  // plan-wide
  expect(resolved(p, 3), 3, 300, 10, 8, 50);
  p.search_queue = 200;  // plan-wide override: layer 3's own queue goes, its expansion stays
  expect(resolved(p, 3), 3, 200, 10, 8, 50);
  const rattn_layer_search entries[] = {{1, -1, 0, 4, -1}, {3, 400, -1, -1, 0}};
  p.layer_search = entries;
  p.n_layer_search = 2;
  expect(resolved(p, 1), 1, 200, 0, 4, 0);
  expect(resolved(p, 3), 3, 400, 10, 8, 0);
  rattn_context* ctx = nullptr;
  const rattn_layer_search bad[][1] = {{{0, 100, -1, -1, -1}},    // a local layer
                                       {{5, 100, -1, -1, -1}},    // no such layer
                                       {{1, 0, -1, -1, -1}},      // queue 0
                                       {{1, -1, -2, -1, -1}}};    // below -1
  for (const auto& b : bad) {
    p.layer_search = b;
    p.n_layer_search = 1;
    EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("layer_search[0]"), std::string::npos);
  }
  p.layer_search = nullptr;
  p.n_layer_search = 1;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p.n_layer_search = -1;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
}

// The CPU store's rows survive its growth from small blocks (64-byte
// aligned) into huge-page-sized ones (2 MiB aligned, madvise'd): every row
// reads back as written, through appends of every size.
TEST(RowStore, RowsSurviveGrowthAcrossTheHugePageThreshold) {
  const int d = 128;
  rattn::RowStore store(rattn::DType::f16, d);
  const int64_t total = 9000;  // 2.3 MB of fp16 rows
  const std::vector<float> src = random_normal(size_t(total) * d, 77);
  int64_t rows = 0;
  for (int64_t n = 1; rows < total; n = n * 3 % 1031 + 1) {
    const int64_t take = std::min(n, total - rows);
    store.append_f32(src.data() + size_t(rows) * d, take);
    rows += take;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(store.row(0)) % 64, 0u);
  }
  ASSERT_EQ(store.rows(), total);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(store.row(0)) % (uintptr_t(2) << 20), 0u);
  EXPECT_GE(store.memory_bytes(), size_t(total) * store.row_bytes());
  std::vector<float> row(d);
  for (int64_t i = 0; i < total; ++i) {
    store.row_f32(i, row.data());
    for (int j = 0; j < d; ++j)
      ASSERT_EQ(row[size_t(j)], rattn::f16_to_f32(rattn::f32_to_f16(src[size_t(i) * d + size_t(j)]))) << i << " " << j;
  }
  // Raw appends of a store's own rows, and a reserve, keep them too.
  rattn::RowStore copy(rattn::DType::f16, d);
  copy.reserve(total);
  copy.append_raw(store.row(0), total);
  EXPECT_EQ(std::memcmp(copy.row(0), store.row(0), size_t(total) * store.row_bytes()), 0);
}

// A stand-in for the GPU backend that runs on any machine: it keeps its own
// copy of the static set exactly as the CUDA backend keeps device memory
// (capacity rows per head, rows [0, rows) live) and attends it with the
// reference kernels. Counts what crosses the "bus".
// Atomic: a batch's sequences update their stand-ins from several threads.
struct StandInCounters {
  std::atomic<int> full_uploads{0};
  std::atomic<int64_t> rows_uploaded{0};  // by full uploads
  std::atomic<int64_t> row_updates{0};    // update_static_row calls
};

class StandInGpu final : public rattn::GpuAttention {
 public:
  StandInGpu(const rattn::KernelSpec& spec, StandInCounters* counters)
      : spec_(spec), kernels_(rattn::make_reference_kernels(spec)), counters_(counters) {}
  using GpuAttention::upload_static_set;
  const rattn::KernelSpec& spec() const override { return spec_; }
  std::string device_name() const override { return "stand-in"; }
  void upload_static_set(int kv_heads, const rattn::RowsView* keys, const rattn::RowsView* values,
                         int64_t capacity_rows) override {
    ASSERT_GE(capacity_rows, keys[0].rows);
    heads_ = kv_heads;
    capacity_ = capacity_rows;
    rows_ = keys[0].rows;
    k_.assign(size_t(kv_heads), std::vector<uint8_t>(size_t(capacity_rows) * row_bytes()));
    v_ = k_;
    for (int h = 0; h < kv_heads; ++h) {
      ASSERT_EQ(keys[h].dtype, spec_.kv_dtype);
      std::memcpy(k_[size_t(h)].data(), keys[h].data, size_t(rows_) * row_bytes());
      std::memcpy(v_[size_t(h)].data(), values[h].data, size_t(rows_) * row_bytes());
    }
    ++counters_->full_uploads;
    counters_->rows_uploaded += rows_ * kv_heads;
  }
  void update_static_row(int64_t row, const void* const* keys, const void* const* values) override {
    if (row < 0 || row > rows_ || row >= capacity_) throw rattn::Error(rattn::Status::invalid_argument, "row");
    for (int h = 0; h < heads_; ++h) {
      std::memcpy(k_[size_t(h)].data() + size_t(row) * row_bytes(), keys[h], row_bytes());
      std::memcpy(v_[size_t(h)].data() + size_t(row) * row_bytes(), values[h], row_bytes());
    }
    if (row == rows_) ++rows_;
    ++counters_->row_updates;
  }
  int64_t rows() const override { return rows_; }
  void partial_attention(const float* queries, float* out, float* lse) override {
    const int g = spec_.group_size, d = spec_.head_dim;
    for (int h = 0; h < heads_; ++h) {
      const rattn::RowsView k{k_[size_t(h)].data(), spec_.kv_dtype, rows_, d};
      const rattn::RowsView v{v_[size_t(h)].data(), spec_.kv_dtype, rows_, d};
      kernels_->dense_attention(queries + size_t(h) * size_t(g) * size_t(d), g, k, v, 0, rows_,
                                out + size_t(h) * size_t(g) * size_t(d), lse + size_t(h) * size_t(g));
    }
  }

 private:
  size_t row_bytes() const { return size_t(spec_.head_dim) * rattn::dtype_size(spec_.kv_dtype); }
  rattn::KernelSpec spec_;
  std::unique_ptr<rattn::CpuKernels> kernels_;
  StandInCounters* counters_;
  int heads_ = 0;
  int64_t rows_ = 0, capacity_ = 0;
  std::vector<std::vector<uint8_t>> k_, v_;
};

// The default split form of a backend (the stand-in overrides only the
// whole call): finish runs the call on begin's queries, bit-identical to it;
// a finish without a begin is refused.
TEST(DecodeGpu, DefaultBeginFinishRunsTheWholeCall) {
  rattn::KernelSpec spec;
  spec.head_dim = 32;
  spec.group_size = 2;
  spec.kv_dtype = rattn::DType::f16;
  StandInCounters counters;
  StandInGpu gpu(spec, &counters);
  const int heads = 2, rows = 9, d = spec.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<std::vector<uint16_t>> k(heads, std::vector<uint16_t>(size_t(rows * d))), v = k;
  std::vector<rattn::RowsView> kv(heads), vv(heads);
  for (int h = 0; h < heads; ++h) {
    for (size_t i = 0; i < k[size_t(h)].size(); ++i) {
      k[size_t(h)][i] = rattn::f32_to_f16(nd(rng));
      v[size_t(h)][i] = rattn::f32_to_f16(nd(rng));
    }
    kv[size_t(h)] = {k[size_t(h)].data(), spec.kv_dtype, rows, d};
    vv[size_t(h)] = {v[size_t(h)].data(), spec.kv_dtype, rows, d};
  }
  gpu.upload_static_set(heads, kv.data(), vv.data());
  std::vector<float> q(size_t(heads * spec.group_size * d));
  for (auto& x : q) x = nd(rng);
  std::vector<float> out_a(q.size()), out_b(q.size()), lse_a(size_t(heads * spec.group_size)), lse_b(lse_a.size());
  gpu.partial_attention(q.data(), out_a.data(), lse_a.data());
  gpu.begin_partial_attention(q.data());
  gpu.finish_partial_attention(out_b.data(), lse_b.data());
  EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(lse_a.data(), lse_b.data(), lse_a.size() * sizeof(float)), 0);
  EXPECT_THROW(gpu.finish_partial_attention(out_b.data(), lse_b.data()), rattn::Error);
}

// The runtime's GPU path on any machine: with the stand-in backend, the
// static set is uploaded once per prefill/load and then updated one row per
// step (sinks filling, window filling, the ring wrapping), and the outputs are
// bit-identical to the CPU path's (same reference kernel over the same rows in
// the same order) - so the device copy tracks the host's static set exactly.
// With the tail estimate (tail_samples 16) too: it runs on the CPU and is
// merged after the GPU's static-set partial, the same on both paths.
TEST(DecodeGpu, StandInGpuMirrorsTheStaticSetOneRowPerStep) {
  const int hq = 4, hkv = 2, d = 32, sinks = 4, window = 8, steps = 40;
  for (auto [prompt, tail_samples] : {std::pair<int64_t, int>{3, 0}, {200, 0}, {200, 16}}) {
    SCOPED_TRACE("tail_samples " + std::to_string(tail_samples));
    Stream s(hq, hkv, d, prompt + 2 * steps, 21);
    auto cpu_c = cpp_config(hq, hkv, d, sinks, window);
    cpu_c.index = rattn::IndexChoice::exact;
    cpu_c.plan.tail_samples = tail_samples;
    auto gpu_c = cpu_c;
    gpu_c.use_gpu = true;
    StandInCounters counters;
    gpu_c.gpu_factory = [&counters](const rattn::KernelSpec& spec) {
      return std::make_unique<StandInGpu>(spec, &counters);
    };
    auto cpu_rt = std::make_shared<const rattn::Runtime>(cpu_c);
    auto gpu_rt = std::make_shared<const rattn::Runtime>(gpu_c);
    ASSERT_TRUE(gpu_rt->gpu());
    rattn::Sequence cpu_seq(cpu_rt), gpu_seq(gpu_rt);
    const auto pq = s.prefix(s.q, hq, prompt), pk = s.prefix(s.k, hkv, prompt), pv = s.prefix(s.v, hkv, prompt);
    cpu_seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
    gpu_seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
    EXPECT_TRUE(gpu_seq.memory().static_set_on_gpu);
    EXPECT_EQ(counters.full_uploads, 1);
    EXPECT_EQ(counters.rows_uploaded, std::min<int64_t>(prompt, sinks + window) * hkv);
    auto expect_same = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what << ", prompt " << prompt;
    };
    expect_same(decode_run(gpu_seq, s, prompt, steps), decode_run(cpu_seq, s, prompt, steps), "decode");
    EXPECT_EQ(counters.full_uploads, 1);  // no re-upload while decoding
    EXPECT_EQ(counters.row_updates, steps);
    const std::string path = temp_path("standin");
    gpu_seq.save(path);
    auto loaded = rattn::Sequence::load(gpu_rt, path);
    std::remove(path.c_str());
    EXPECT_EQ(counters.full_uploads, 2);  // the load uploads the whole set
    expect_same(decode_run(*loaded, s, prompt + steps, steps), decode_run(cpu_seq, s, prompt + steps, steps),
                "after load");
    EXPECT_EQ(counters.row_updates, 2 * steps);
  }
}

// With a GPU (skipped otherwise): the static set on the GPU, uploaded once at
// prefill and then updated one row per KV head per step (sinks filling, then
// the window ring wrapping), gives the CPU path's outputs within fp16
// accumulation tolerance; also after a save and load (full upload again).
// The plan's cuda.splits knob reaches the GPU's kernels (their name says it).
TEST(DecodeGpu, GpuStaticSetMatchesTheCpuPath) {
  std::string why;
  if (!rattn::gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  const int sinks = 8, window = 24, steps = 150;
  enum class Shape {
    llama,  // 8 query heads on 2 KV heads, d 128, fp16 storage
    gemma,  // Gemma-3 270M's global layers: 4 query heads on 1 KV head, d 256, bf16 storage
    qwen,   // Qwen2.5-7B's GQA group of 7: 14 query heads on 2 KV heads, d 128, fp16
  };
  struct Case {
    int64_t prompt;
    int splits;  // 0: the default
    Shape shape;
  };
  for (const Case& c : {Case{10, 0, Shape::llama}, Case{3000, 0, Shape::llama}, Case{3000, 1, Shape::llama},
                        Case{10, 16, Shape::llama}, Case{10, 0, Shape::gemma}, Case{3000, 0, Shape::gemma},
                        Case{3000, 0, Shape::qwen}}) {
    // Short prompts: the static set fills by appends.
    const int64_t prompt = c.prompt;
    const int splits = c.splits;
    SCOPED_TRACE("cuda.splits " + std::to_string(splits) + ", shape " + std::to_string(int(c.shape)));
    const int hq = c.shape == Shape::gemma ? 4 : c.shape == Shape::qwen ? 14 : 8;
    const int hkv = c.shape == Shape::gemma ? 1 : 2, d = c.shape == Shape::gemma ? 256 : 128;
    Stream s(hq, hkv, d, prompt + 2 * steps, 9);
    auto cpu_c = cpp_config(hq, hkv, d, sinks, window);
    if (c.shape == Shape::gemma) cpu_c.kv_storage = rattn::DType::bf16;
    cpu_c.index = rattn::IndexChoice::exact;
    auto gpu_c = cpu_c;
    gpu_c.use_gpu = true;
    if (splits > 0) gpu_c.plan.kernel["cuda.splits"] = splits;
    auto cpu_rt = std::make_shared<const rattn::Runtime>(cpu_c);
    auto gpu_rt = std::make_shared<const rattn::Runtime>(gpu_c);
    ASSERT_TRUE(gpu_rt->gpu()) << gpu_rt->gpu_status();
    if (splits > 0) {
      EXPECT_NE(gpu_rt->gpu_status().find("_s" + std::to_string(splits) + "_"), std::string::npos)
          << gpu_rt->gpu_status();
    }
    rattn::Sequence cpu_seq(cpu_rt), gpu_seq(gpu_rt);
    const auto pq = s.prefix(s.q, hq, prompt), pk = s.prefix(s.k, hkv, prompt), pv = s.prefix(s.v, hkv, prompt);
    cpu_seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
    gpu_seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
    EXPECT_TRUE(gpu_seq.memory().static_set_on_gpu);
    EXPECT_FALSE(cpu_seq.memory().static_set_on_gpu);
    auto compare = [&](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      ASSERT_EQ(a.size(), b.size());
      const size_t per_step = size_t(hq) * size_t(d + 1);
      double worst = 0, worst_lse = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        const bool is_lse = i % per_step >= size_t(hq) * size_t(d);
        const double err = std::fabs(double(a[i]) - double(b[i]));
        if (is_lse) worst_lse = std::max(worst_lse, err / std::max(1.0, std::fabs(double(b[i]))));
        else worst = std::max(worst, err);
      }
      // Values are N(0, 1) rows averaged by attention: |out| <~ 1. The GPU
      // kernel's own tolerance against float64 is 3e-3 relative
      // (CudaGpu.PartialAttentionOnTheGpuMatchesFloat64); one wrong or stale
      // row of the 32 in the set moves outputs by ~1e-2..1e-1.
      EXPECT_LT(worst, 1e-2) << what << ", prompt " << prompt;
      EXPECT_LT(worst_lse, 3e-3) << what << ", prompt " << prompt;
    };
    compare(decode_run(gpu_seq, s, prompt, steps), decode_run(cpu_seq, s, prompt, steps), "decode");
    const std::string path = temp_path("gpu");
    gpu_seq.save(path);
    auto loaded = rattn::Sequence::load(gpu_rt, path);
    std::remove(path.c_str());
    compare(decode_run(*loaded, s, prompt + steps, steps), decode_run(cpu_seq, s, prompt + steps, steps),
            "after load");
  }
}


// A batch of sequences decoded in one call equals each decoded alone, bit
// for bit: three sequences (a projected graph, an exact index, a prompt all
// in the static set), insertion in batches of 3, 1 and 3 threads, without a
// GPU, with a stand-in one and (when present) the real one, an lse left null
// for one of them.
TEST(DecodeBatch, EqualsEachSequenceDecodedAlone) {
  const int hq = 8, hkv = 2, d = 64, sinks = 4, window = 16, steps = 30;  // d 64: a shape the GPU kernels cover
  const std::vector<int64_t> prompts = {2200, 300, 12};  // 2200: above the graph threshold (2048)
  std::vector<Stream> streams;
  for (size_t i = 0; i < prompts.size(); ++i) streams.emplace_back(hq, hkv, d, prompts[i] + steps, 40 + i);
  enum class Gpu { none, stand_in, real };
  for (int threads : {1, 3})
    for (Gpu gpu : {Gpu::none, Gpu::stand_in, Gpu::real}) {
      if (gpu == Gpu::real && !rattn::gpu_present()) continue;
      SCOPED_TRACE("threads " + std::to_string(threads) + (gpu == Gpu::stand_in ? ", stand-in GPU"
                                                           : gpu == Gpu::real   ? ", GPU"
                                                                                : ""));
      auto c = cpp_config(hq, hkv, d, sinks, window);
      c.threads = threads;
      c.insert_batch = 3;
      c.use_gpu = gpu != Gpu::none;
      StandInCounters counters;
      if (gpu == Gpu::stand_in)
        c.gpu_factory = [&counters](const rattn::KernelSpec& spec) {
          return std::make_unique<StandInGpu>(spec, &counters);
        };
      auto rt = std::make_shared<const rattn::Runtime>(c);
      ASSERT_EQ(rt->gpu(), gpu != Gpu::none) << rt->gpu_status();
      std::vector<std::unique_ptr<rattn::Sequence>> batch, alone;
      for (size_t i = 0; i < prompts.size(); ++i) {
        for (auto* set : {&batch, &alone}) {
          set->push_back(std::make_unique<rattn::Sequence>(rt));
          prefill_prompt(*set->back(), streams[i], prompts[i]);
        }
      }
      const size_t n = prompts.size();
      std::vector<rattn::Sequence*> seqs;
      for (auto& b : batch) seqs.push_back(b.get());
      std::vector<std::vector<float>> out_b(n, std::vector<float>(size_t(hq) * d)), lse_b(n, std::vector<float>(hq));
      std::vector<float> out_a(size_t(hq) * d), lse_a(hq);
      for (int step = 0; step < steps; ++step) {
        std::vector<std::vector<float>> qs, ks, vs;
        std::vector<const void*> q, k, v;
        std::vector<float*> out, lse;
        for (size_t i = 0; i < n; ++i) {
          const int64_t t = prompts[i] + step;
          qs.push_back(streams[i].token(streams[i].q, hq, t));
          ks.push_back(streams[i].token(streams[i].k, hkv, t));
          vs.push_back(streams[i].token(streams[i].v, hkv, t));
        }
        for (size_t i = 0; i < n; ++i) {
          q.push_back(qs[i].data());
          k.push_back(ks[i].data());
          v.push_back(vs[i].data());
          out.push_back(out_b[i].data());
          lse.push_back(i == 1 ? nullptr : lse_b[i].data());
        }
        rattn::Sequence::decode_batch(seqs.data(), int(n), 0, q.data(), k.data(), v.data(), rattn::DType::f32,
                                      out.data(), lse.data());
        for (size_t i = 0; i < n; ++i) {
          alone[i]->decode(0, q[i], k[i], v[i], rattn::DType::f32, out_a.data(), lse_a.data());
          ASSERT_EQ(std::memcmp(out_a.data(), out_b[i].data(), out_a.size() * sizeof(float)), 0)
              << "sequence " << i << " step " << step;
          if (i != 1) {
            ASSERT_EQ(std::memcmp(lse_a.data(), lse_b[i].data(), lse_a.size() * sizeof(float)), 0)
                << "sequence " << i << " step " << step;
          }
        }
      }
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(batch[i]->tokens(0), prompts[i] + steps);
      EXPECT_GT(batch[0]->memory().cpu_tokens, 0);
      if (gpu == Gpu::stand_in) {
        EXPECT_EQ(counters.row_updates, int64_t(2 * n * steps));  // both sets, one row per step each
      }
    }
}

// A bad batch is refused before any sequence decodes: a duplicate, a
// sequence of another runtime, a null input, a layer not prefilled in one of
// them, a layer out of range; the error names the entry. Nothing changes,
// and an empty batch is a no-op.
TEST(DecodeBatch, BadBatchesChangeNoSequence) {
  const int hq = 4, hkv = 2, d = 16, sinks = 2, window = 4;
  Stream s(hq, hkv, d, 64, 7);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  c.layout.num_layers = 2;
  c.layout.layers.assign(2, rattn::LayerSpec{});
  auto rt = std::make_shared<const rattn::Runtime>(c);
  auto other_rt = std::make_shared<const rattn::Runtime>(c);
  rattn::Sequence a(rt), b(rt), foreign(other_rt);
  for (rattn::Sequence* seq : {&a, &b, &foreign}) prefill_prompt(*seq, s, 40);
  const auto q = s.token(s.q, hq, 40), k = s.token(s.k, hkv, 40), v = s.token(s.v, hkv, 40);
  std::vector<float> o0(size_t(hq) * d), o1(o0.size());
  const void* qs[] = {q.data(), q.data()};
  const void* ks[] = {k.data(), k.data()};
  const void* vs[] = {v.data(), v.data()};
  float* outs[] = {o0.data(), o1.data()};
  auto expect_refused = [&](std::vector<rattn::Sequence*> seqs, int layer, const void* const* qv,
                            const char* needle) {
    try {
      rattn::Sequence::decode_batch(seqs.data(), int(seqs.size()), layer, qv, ks, vs, rattn::DType::f32, outs,
                                    nullptr);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const rattn::Error& e) {
      EXPECT_EQ(e.status(), rattn::Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    for (rattn::Sequence* seq : {&a, &b, &foreign}) EXPECT_EQ(seq->tokens(0), 40) << needle;
  };
  expect_refused({&a, &a}, 0, qs, "twice");
  expect_refused({&a, &foreign}, 0, qs, "sequence 1 belongs to another context");
  const void* null_q[] = {q.data(), nullptr};
  expect_refused({&a, &b}, 0, null_q, "sequence 1: ");
  expect_refused({&a, &b}, 1, qs, "was not prefilled");  // layer 1 of neither
  expect_refused({&a, &b}, 2, qs, "out of range");
  expect_refused({&a, nullptr}, 0, qs, "sequence 1 is null");
  rattn::Sequence::decode_batch(nullptr, 0, 0, nullptr, nullptr, nullptr, rattn::DType::f32, nullptr, nullptr);
  rattn::Sequence* ab[] = {&a, &b};
  rattn::Sequence::decode_batch(ab, 2, 0, qs, ks, vs, rattn::DType::f32, outs, nullptr);
  EXPECT_EQ(a.tokens(0), 41);
  EXPECT_EQ(b.tokens(0), 41);
  EXPECT_EQ(foreign.tokens(0), 40);
  EXPECT_EQ(std::memcmp(o0.data(), o1.data(), o0.size() * sizeof(float)), 0);  // same state, same token
}


// Tokens [first, first + n) of x ([heads, total, d]) packed as [heads, n, d].
std::vector<float> rows_of(const Stream& s, const std::vector<float>& x, int heads, int64_t first, int64_t n) {
  std::vector<float> out(size_t(heads) * size_t(n) * size_t(s.d));
  for (int h = 0; h < heads; ++h)
    std::memcpy(out.data() + size_t(h) * size_t(n) * size_t(s.d), s.head(x, h) + size_t(first) * size_t(s.d),
                size_t(n) * size_t(s.d) * sizeof(float));
  return out;
}

// A prompt handed over in chunks gives the whole prompt's prefill, bit for
// bit: chunks of 1, 7, 100, 1000 and the rest (a projected graph), one
// chunk, and a prompt smaller than the static set in two chunks; the chunks
// count in the memory until prefill_end, and are freed there.
TEST(PrefillChunks, EqualTheWholePrompt) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 30;
  struct Case {
    int64_t prompt;
    std::vector<int64_t> chunks;  // the last runs to the prompt's end
  };
  for (const Case& c : {Case{2200, {1, 7, 100, 1000}}, Case{2200, {}}, Case{12, {5}}}) {
    SCOPED_TRACE("prompt " + std::to_string(c.prompt) + ", " + std::to_string(c.chunks.size() + 1) + " chunks");
    Stream s(hq, hkv, d, c.prompt + steps, 77);
    auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
    rattn::Sequence whole(rt), chunked(rt);
    prefill_prompt(whole, s, c.prompt);
    const int64_t scratch_before = chunked.memory().scratch_bytes;
    int64_t first = 0;
    std::vector<int64_t> sizes = c.chunks;
    sizes.push_back(c.prompt - std::accumulate(c.chunks.begin(), c.chunks.end(), int64_t(0)));
    for (int64_t n : sizes) {
      const auto q = rows_of(s, s.q, hq, first, n), k = rows_of(s, s.k, hkv, first, n), v = rows_of(s, s.v, hkv, first, n);
      chunked.prefill_chunk(0, n, q.data(), k.data(), v.data(), rattn::DType::f32);
      first += n;
    }
    EXPECT_FALSE(chunked.prefilled(0));
    EXPECT_GE(chunked.memory().scratch_bytes - scratch_before, c.prompt * (hq + 2 * hkv) * d * 4);
    chunked.prefill_end(0);
    EXPECT_TRUE(chunked.prefilled(0));
    EXPECT_EQ(chunked.tokens(0), c.prompt);
    EXPECT_EQ(chunked.memory().scratch_bytes, whole.memory().scratch_bytes);  // the chunks are gone
    const auto a = decode_run(whole, s, c.prompt, steps), b = decode_run(chunked, s, c.prompt, steps);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

// Misuse of a chunked prefill is refused with a message and loses nothing:
// a chunk of another dtype, a whole-prompt prefill, a decode or a save
// before prefill_end, prefill_end without chunks, a chunk after the end.
TEST(PrefillChunks, MisuseIsRefusedAndLosesNothing) {
  const int hq = 4, hkv = 2, d = 16, sinks = 2, window = 4;
  Stream s(hq, hkv, d, 64, 8);
  auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
  rattn::Sequence seq(rt), whole(rt);
  prefill_prompt(whole, s, 40);
  auto expect_refused = [](const std::function<void()>& call, const char* needle) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const rattn::Error& e) {
      EXPECT_EQ(e.status(), rattn::Status::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { seq.prefill_end(0); }, "has no chunks");
  const auto q1 = rows_of(s, s.q, hq, 0, 25), k1 = rows_of(s, s.k, hkv, 0, 25), v1 = rows_of(s, s.v, hkv, 0, 25);
  seq.prefill_chunk(0, 25, q1.data(), k1.data(), v1.data(), rattn::DType::f32);
  const std::vector<uint16_t> halves(size_t(hq) * 15 * d);
  expect_refused([&] { seq.prefill_chunk(0, 15, halves.data(), halves.data(), halves.data(), rattn::DType::f16); },
                 "this chunk is f16, the earlier ones f32");
  expect_refused([&] { seq.prefill_chunk(0, 0, q1.data(), k1.data(), v1.data(), rattn::DType::f32); }, ">= 1");
  expect_refused([&] { seq.prefill(0, 25, q1.data(), k1.data(), v1.data(), rattn::DType::f32); },
                 "chunked prefill in progress");
  const auto tq = s.token(s.q, hq, 40), tk = s.token(s.k, hkv, 40), tv = s.token(s.v, hkv, 40);
  std::vector<float> out(size_t(hq) * d), out_whole(out.size());
  expect_refused([&] { seq.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out.data(), nullptr); },
                 "awaits prefill_end");
  const std::string path = temp_path("chunks");
  expect_refused([&] { seq.save(path); }, "chunked prefill in progress");
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // no file written
  // The refused calls lost nothing: the rest of the prompt, the end, a decode as the whole prompt's.
  const auto q2 = rows_of(s, s.q, hq, 25, 15), k2 = rows_of(s, s.k, hkv, 25, 15), v2 = rows_of(s, s.v, hkv, 25, 15);
  seq.prefill_chunk(0, 15, q2.data(), k2.data(), v2.data(), rattn::DType::f32);
  seq.prefill_end(0);
  seq.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out.data(), nullptr);
  whole.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out_whole.data(), nullptr);
  EXPECT_EQ(std::memcmp(out.data(), out_whole.data(), out.size() * sizeof(float)), 0);
  expect_refused([&] { seq.prefill_chunk(0, 15, q2.data(), k2.data(), v2.data(), rattn::DType::f32); },
                 "already prefilled");
  expect_refused([&] { seq.prefill_end(0); }, "has no chunks");
}


// A clone decodes as its original would, bit for bit (index, static set,
// pending tokens and warm-start seeds copied; a projected graph with
// insertion batches of 3 and a stand-in GPU), and the two then diverge
// independently: a step of one leaves the other unchanged. A sequence with a
// chunked prefill in progress is not cloned.
TEST(SequenceClone, DecodesAsTheOriginalAndThenDiverges) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 20;
  const int64_t prompt = 2200;
  Stream s(hq, hkv, d, prompt + 3 * steps, 91);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  c.insert_batch = 3;
  StandInCounters counters;
  c.use_gpu = true;
  c.gpu_factory = [&counters](const rattn::KernelSpec& spec) { return std::make_unique<StandInGpu>(spec, &counters); };
  auto rt = std::make_shared<const rattn::Runtime>(c);
  rattn::Sequence original(rt), reference(rt);
  prefill_prompt(original, s, prompt);
  prefill_prompt(reference, s, prompt);
  decode_run(original, s, prompt, steps + 1);  // pending tokens and seeds in play
  decode_run(reference, s, prompt, steps + 1);
  const auto copy = original.clone();
  EXPECT_EQ(copy->tokens(0), original.tokens(0));
  EXPECT_EQ(copy->memory().pending_tokens, original.memory().pending_tokens);
  const int64_t from = prompt + steps + 1;
  const auto a = decode_run(*copy, s, from, steps), b = decode_run(reference, s, from, steps);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "the clone";
  // The original did not move while its clone decoded: it still decodes as the reference did.
  const auto o = decode_run(original, s, from, steps);
  EXPECT_EQ(std::memcmp(o.data(), b.data(), o.size() * sizeof(float)), 0) << "the original";
  EXPECT_EQ(copy->tokens(0), original.tokens(0));

  rattn::Sequence chunked(rt);
  const auto q = s.prefix(s.q, hq, 10), k = s.prefix(s.k, hkv, 10), v = s.prefix(s.v, hkv, 10);
  chunked.prefill_chunk(0, 10, q.data(), k.data(), v.data(), rattn::DType::f32);
  try {
    chunked.clone();
    ADD_FAILURE() << "a sequence with a chunked prefill in progress was cloned";
  } catch (const rattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("clone: layer 0 has a chunked prefill in progress"), std::string::npos)
        << e.what();
  }
}

}  // namespace
