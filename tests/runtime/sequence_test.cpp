// Sequences: a batch decoded in one call, a prompt prefilled in chunks, and
// a clone; each equals its plain counterpart bit for bit.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "core/error.h"
#include "runtime/runtime.h"
#include "tests/runtime/decode_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::cpp_config;
using rattn::testing::decode_run;
using rattn::testing::prefill_prompt;
using rattn::testing::StandInCounters;
using rattn::testing::StandInGpu;
using rattn::testing::temp_path;
using Stream = rattn::testing::TokenStream;

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
      const auto q = s.rows(s.q, hq, first, n), k = s.rows(s.k, hkv, first, n), v = s.rows(s.v, hkv, first, n);
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
  using rattn::testing::expect_refused;
  const int hq = 4, hkv = 2, d = 16, sinks = 2, window = 4;
  Stream s(hq, hkv, d, 64, 8);
  auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
  rattn::Sequence seq(rt), whole(rt);
  prefill_prompt(whole, s, 40);
  expect_refused([&] { seq.prefill_end(0); }, "has no chunks");
  const auto q1 = s.rows(s.q, hq, 0, 25), k1 = s.rows(s.k, hkv, 0, 25), v1 = s.rows(s.v, hkv, 0, 25);
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
  const auto q2 = s.rows(s.q, hq, 25, 15), k2 = s.rows(s.k, hkv, 25, 15), v2 = s.rows(s.v, hkv, 25, 15);
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
