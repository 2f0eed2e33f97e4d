// The C API's sequences: progress and log callbacks, the C++ wrapper, a
// batch decoded in one call, a chunked prefill, a clone, and two sequences
// on two threads.
#include <gtest/gtest.h>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "rattn.h"
#include "rattn.hpp"
#include "tests/runtime/api_fixture.h"
#include "tests/runtime/test_util.h"

namespace {

using namespace rattn::testing::api;

TEST(ApiCallbacks, ProgressIsMonotonicAndEndsAtOne) {
  std::vector<float> seen;
  const rattn_context_params p = params_recording_progress(&seen);
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK);
  rattn_sequence* seq = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  const Inputs in(80, 6);
  ASSERT_EQ(rattn_sequence_prefill(seq, 0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
  ASSERT_FALSE(seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]);
  EXPECT_FLOAT_EQ(seen.back(), 1.0f);
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
}

TEST(ApiCallbacks, LogCallbackSeesFailures) {
  std::vector<std::string> lines;
  rattn_log_set([](rattn_log_level, const char* text, void* ud) { static_cast<std::vector<std::string>*>(ud)->push_back(text); },
                &lines);
  rattn_context* ctx = nullptr;
  EXPECT_EQ(rattn_context_create(nullptr, &ctx), RATTN_INVALID_ARGUMENT);
  rattn_log_set(nullptr, nullptr);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("rattn_context_create"), std::string::npos);
}

TEST(ApiCpp, RaiiWrapperThrowsWithStatus) {
  rattn::api::Context ctx(small_params());
  rattn::api::Sequence seq(ctx);
  const Inputs in(30, 8);
  seq.prefill(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
  EXPECT_EQ(seq.n_tokens(0), 30);
  try {
    seq.prefill(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
    FAIL() << "second prefill must throw";
  } catch (const rattn::api::Exception& e) {
    EXPECT_EQ(e.status(), RATTN_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("already prefilled"), std::string::npos);
  }
  EXPECT_GT(seq.memory().total_bytes, 0u);
}

// rattn_sequence_decode_batch: two sequences in one call give what two
// rattn_sequence_decode calls give, on both layers; bad batches return
// RATTN_INVALID_ARGUMENT naming the fault and decode nothing. Through the
// RAII wrapper too.
TEST_F(Api, DecodeBatchEqualsOneCallPerSequence) {
  rattn_sequence *seq2 = nullptr, *alone1 = nullptr, *alone2 = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq2), RATTN_OK);
  ASSERT_EQ(rattn_sequence_create(ctx, &alone1), RATTN_OK);
  ASSERT_EQ(rattn_sequence_create(ctx, &alone2), RATTN_OK);
  const Inputs in1(70, 11), in2(90, 12);
  for (int layer = 0; layer < 2; ++layer) {
    prefill(seq, layer, in1);
    prefill(alone1, layer, in1);
    prefill(seq2, layer, in2);
    prefill(alone2, layer, in2);
  }
  rattn_sequence* batch[] = {seq, seq2};
  for (int step = 0; step < 6; ++step)
    for (int layer = 0; layer < 2; ++layer) {
      const uint64_t seed = 500 + uint64_t(step * 2 + layer) * 10;
      const auto q1 = random_normal(size_t(kHq) * kDim, seed), q2 = random_normal(size_t(kHq) * kDim, seed + 1);
      const auto k1 = random_normal(size_t(kHkv) * kDim, seed + 2), k2 = random_normal(size_t(kHkv) * kDim, seed + 3);
      const auto v1 = random_normal(size_t(kHkv) * kDim, seed + 4), v2 = random_normal(size_t(kHkv) * kDim, seed + 5);
      std::vector<float> o1(size_t(kHq) * kDim), o2(o1.size()), a1(o1.size()), a2(o1.size());
      std::vector<float> l1(kHq), l2(kHq), al1(kHq), al2(kHq);
      const void* q[] = {q1.data(), q2.data()};
      const void* k[] = {k1.data(), k2.data()};
      const void* v[] = {v1.data(), v2.data()};
      float* out[] = {o1.data(), o2.data()};
      float* lse[] = {l1.data(), l2.data()};
      ASSERT_EQ(rattn_sequence_decode_batch(batch, 2, layer, q, k, v, RATTN_F32, out, lse), RATTN_OK)
          << rattn_context_last_error(ctx);
      ASSERT_EQ(rattn_sequence_decode(alone1, layer, q1.data(), k1.data(), v1.data(), RATTN_F32, a1.data(), al1.data()),
                RATTN_OK);
      ASSERT_EQ(rattn_sequence_decode(alone2, layer, q2.data(), k2.data(), v2.data(), RATTN_F32, a2.data(), al2.data()),
                RATTN_OK);
      EXPECT_EQ(0, std::memcmp(o1.data(), a1.data(), o1.size() * sizeof(float))) << step << " " << layer;
      EXPECT_EQ(0, std::memcmp(o2.data(), a2.data(), o2.size() * sizeof(float))) << step << " " << layer;
      EXPECT_EQ(0, std::memcmp(l1.data(), al1.data(), l1.size() * sizeof(float))) << step << " " << layer;
      EXPECT_EQ(0, std::memcmp(l2.data(), al2.data(), l2.size() * sizeof(float))) << step << " " << layer;
    }
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 76);
  EXPECT_EQ(rattn_sequence_n_tokens(seq2, 1), 96);

  // Bad batches.
  const auto q = random_normal(size_t(kHq) * kDim, 9), kv = random_normal(size_t(kHkv) * kDim, 10);
  std::vector<float> o1(size_t(kHq) * kDim), o2(o1.size());
  const void* qs[] = {q.data(), q.data()};
  const void* kvs[] = {kv.data(), kv.data()};
  float* outs[] = {o1.data(), o2.data()};
  rattn_context* other = nullptr;
  const rattn_context_params p = small_params();
  ASSERT_EQ(rattn_context_create(&p, &other), RATTN_OK);
  rattn_sequence* foreign = nullptr;
  ASSERT_EQ(rattn_sequence_create(other, &foreign), RATTN_OK);
  prefill(foreign, 0, in1);
  rattn_sequence* twice[] = {seq, seq};
  rattn_sequence* mixed[] = {seq, foreign};
  rattn_sequence* with_null[] = {seq, nullptr};
  // No sequence to take the context from: the message is the global one.
  EXPECT_EQ(rattn_sequence_decode_batch(batch, -1, 0, qs, kvs, kvs, RATTN_F32, outs, nullptr), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("n_seqs"), std::string::npos);
  expect_error(rattn_sequence_decode_batch(twice, 2, 0, qs, kvs, kvs, RATTN_F32, outs, nullptr),
               RATTN_INVALID_ARGUMENT, "twice");
  expect_error(rattn_sequence_decode_batch(mixed, 2, 0, qs, kvs, kvs, RATTN_F32, outs, nullptr),
               RATTN_INVALID_ARGUMENT, "another context");
  expect_error(rattn_sequence_decode_batch(with_null, 2, 0, qs, kvs, kvs, RATTN_F32, outs, nullptr),
               RATTN_INVALID_ARGUMENT, "sequence 1 is null");
  expect_error(rattn_sequence_decode_batch(batch, 2, 0, qs, nullptr, kvs, RATTN_F32, outs, nullptr),
               RATTN_INVALID_ARGUMENT, "must not be null");
  expect_error(rattn_sequence_decode_batch(batch, 2, 0, qs, kvs, kvs, rattn_dtype(9), outs, nullptr),
               RATTN_INVALID_ARGUMENT, "dtype");
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 76);
  EXPECT_EQ(rattn_sequence_n_tokens(seq2, 0), 96);
  EXPECT_EQ(rattn_sequence_n_tokens(foreign, 0), 70);
  EXPECT_EQ(rattn_sequence_decode_batch(nullptr, 0, 0, nullptr, nullptr, nullptr, RATTN_F32, nullptr, nullptr),
            RATTN_OK);
  rattn_sequence_free(foreign);
  rattn_context_free(other);
  rattn_sequence_free(seq2);
  rattn_sequence_free(alone1);
  rattn_sequence_free(alone2);
}

// rattn_sequence_prefill_chunk / _end: the prompt in three chunks decodes as
// rattn_sequence_prefill of the whole prompt (bit for bit, on both layers),
// prefill_end reports progress, and misuse returns RATTN_INVALID_ARGUMENT.
TEST(ApiChunks, ChunkedPrefillEqualsTheWholePrompt) {
  std::vector<float> seen;
  const rattn_context_params p = params_recording_progress(&seen);
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK);
  rattn_sequence *whole = nullptr, *chunked = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &whole), RATTN_OK);
  ASSERT_EQ(rattn_sequence_create(ctx, &chunked), RATTN_OK);
  const Inputs in(70, 31);
  // Tokens [first, first + n) of a [heads, in.n, kDim] array.
  auto rows = [&](const std::vector<float>& x, int heads, int64_t first, int64_t n) {
    std::vector<float> out;
    for (int h = 0; h < heads; ++h) {
      const float* head = x.data() + size_t(h) * size_t(in.n) * kDim;
      out.insert(out.end(), head + first * kDim, head + (first + n) * kDim);
    }
    return out;
  };
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_EQ(rattn_sequence_prefill(whole, layer, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
    int64_t first = 0;
    for (int64_t n : {int64_t(3), int64_t(40), int64_t(27)}) {
      const auto q = rows(in.q, kHq, first, n), k = rows(in.k, kHkv, first, n), v = rows(in.v, kHkv, first, n);
      ASSERT_EQ(rattn_sequence_prefill_chunk(chunked, layer, n, q.data(), k.data(), v.data(), RATTN_F32), RATTN_OK)
          << rattn_context_last_error(ctx);
      first += n;
    }
    seen.clear();
    ASSERT_EQ(rattn_sequence_prefill_end(chunked, layer), RATTN_OK) << rattn_context_last_error(ctx);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back(), 1.0f);
    EXPECT_EQ(rattn_sequence_n_tokens(chunked, layer), in.n);
  }
  for (int layer = 0; layer < 2; ++layer) {
    const auto a = decode_steps(whole, layer, 6, 900 + uint64_t(layer));
    const auto b = decode_steps(chunked, layer, 6, 900 + uint64_t(layer));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "layer " << layer;
  }
  // Misuse: no chunks to end, a chunk after the end, a null sequence, a bad dtype.
  EXPECT_EQ(rattn_sequence_prefill_end(chunked, 0), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(ctx)).find("has no chunks"), std::string::npos);
  EXPECT_EQ(rattn_sequence_prefill_chunk(chunked, 0, 1, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
            RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(ctx)).find("already prefilled"), std::string::npos);
  EXPECT_EQ(rattn_sequence_prefill_end(nullptr, 0), RATTN_INVALID_ARGUMENT);
  rattn_sequence* fresh = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &fresh), RATTN_OK);
  EXPECT_EQ(rattn_sequence_prefill_chunk(fresh, 0, 1, in.q.data(), in.k.data(), in.v.data(), rattn_dtype(7)),
            RATTN_INVALID_ARGUMENT);
  rattn_sequence_free(fresh);
  rattn_sequence_free(whole);
  rattn_sequence_free(chunked);
  rattn_context_free(ctx);
}

// rattn_sequence_prefill_end_async / _wait: both layers built in the
// background save the same file as rattn_sequence_prefill, byte for byte;
// while a layer builds it is refused (and holds 0 tokens), and so is a save;
// the wait with nothing to wait for, and bad calls. Through the wrapper too.
TEST_F(Api, BackgroundPrefillEqualsPrefill) {
  rattn_sequence *whole = seq, *async = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &async), RATTN_OK);
  EXPECT_EQ(rattn_sequence_prefill_wait(async), RATTN_OK);  // nothing to wait for
  const Inputs in(70, 33);
  const std::string a_path = temp_path("async-a.seq"), b_path = temp_path("async-b.seq");
  for (int layer = 0; layer < 2; ++layer) {
    ASSERT_EQ(rattn_sequence_prefill(whole, layer, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
    ASSERT_EQ(rattn_sequence_prefill_chunk(async, layer, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
              RATTN_OK);
    ASSERT_EQ(rattn_sequence_prefill_end_async(async, layer), RATTN_OK) << rattn_context_last_error(ctx);
  }
  EXPECT_EQ(rattn_sequence_n_tokens(async, 0), 0);
  const auto q = random_normal(size_t(kHq) * kDim, 5), kv = random_normal(size_t(kHkv) * kDim, 6);
  std::vector<float> out(size_t(kHq) * kDim);
  expect_error(rattn_sequence_decode(async, 0, q.data(), kv.data(), kv.data(), RATTN_F32, out.data(), nullptr),
               RATTN_INVALID_ARGUMENT, "layer 0 is building in the background");
  expect_error(rattn_sequence_save(async, a_path.c_str()), RATTN_INVALID_ARGUMENT, "is building in the background");
  ASSERT_EQ(rattn_sequence_prefill_wait(async), RATTN_OK) << rattn_context_last_error(ctx);
  EXPECT_EQ(rattn_sequence_n_tokens(async, 1), in.n);
  ASSERT_EQ(rattn_sequence_save(whole, a_path.c_str()), RATTN_OK);
  ASSERT_EQ(rattn_sequence_save(async, b_path.c_str()), RATTN_OK);
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string a = bytes(a_path), b = bytes(b_path);
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the saved sequences differ";
  std::remove(a_path.c_str());
  std::remove(b_path.c_str());
  expect_error(rattn_sequence_prefill_end_async(async, 0), RATTN_INVALID_ARGUMENT, "has no chunks");
  expect_error(rattn_sequence_prefill_end_async(async, 9), RATTN_INVALID_ARGUMENT, "out of range");
  EXPECT_EQ(rattn_sequence_prefill_end_async(nullptr, 0), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_prefill_wait(nullptr), RATTN_INVALID_ARGUMENT);
  rattn::api::Context cpp_ctx(small_params());
  rattn::api::Sequence cpp_seq(cpp_ctx);
  cpp_seq.prefill_chunk(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
  cpp_seq.prefill_end_async(0);
  cpp_seq.prefill_wait();
  EXPECT_EQ(cpp_seq.n_tokens(0), in.n);
  rattn_sequence_free(async);
}

// rattn_sequence_clone: the copy decodes as its original (bit for bit, both
// layers, after decode steps), each then goes on alone, and bad calls return
// RATTN_INVALID_ARGUMENT. Through the RAII wrapper too.
TEST_F(Api, CloneDecodesAsTheOriginal) {
  const Inputs in(60, 41);
  rattn_sequence* twin = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &twin), RATTN_OK);
  for (int layer = 0; layer < 2; ++layer) {
    prefill(seq, layer, in);
    prefill(twin, layer, in);
    decode_steps(seq, layer, 5, 700 + uint64_t(layer));
    decode_steps(twin, layer, 5, 700 + uint64_t(layer));
  }
  rattn_sequence* copy = nullptr;
  ASSERT_EQ(rattn_sequence_clone(seq, &copy), RATTN_OK) << rattn_context_last_error(ctx);
  for (int layer = 0; layer < 2; ++layer) {
    const auto a = decode_steps(copy, layer, 6, 800 + uint64_t(layer));
    const auto b = decode_steps(twin, layer, 6, 800 + uint64_t(layer));
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "layer " << layer;
  }
  EXPECT_EQ(rattn_sequence_n_tokens(copy, 0), 71);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 65);  // the original did not move
  expect_error(rattn_sequence_clone(seq, nullptr), RATTN_INVALID_ARGUMENT, "out must not be null");
  rattn_sequence* none = reinterpret_cast<rattn_sequence*>(0x1);
  EXPECT_EQ(rattn_sequence_clone(nullptr, &none), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  rattn::api::Context cpp_ctx(small_params());
  rattn::api::Sequence original(cpp_ctx);
  original.prefill(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
  const rattn::api::Sequence cpp_copy = original.clone();
  EXPECT_EQ(cpp_copy.n_tokens(0), 60);
  rattn_sequence_free(copy);
  rattn_sequence_free(twin);
}

TEST(ApiCpp, DecodeBatchThroughTheWrapper) {
  rattn::api::Context ctx(small_params());
  rattn::api::Sequence a(ctx), b(ctx);
  const Inputs in(30, 8);
  a.prefill(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
  b.prefill(0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32);
  const auto q = random_normal(size_t(kHq) * kDim, 3), kv = random_normal(size_t(kHkv) * kDim, 4);
  std::vector<float> oa(size_t(kHq) * kDim), ob(oa.size());
  rattn::api::Sequence::decode_batch({&a, &b}, 0, {q.data(), q.data()}, {kv.data(), kv.data()},
                                     {kv.data(), kv.data()}, RATTN_F32, {oa.data(), ob.data()});
  EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)));  // one state, one token
  EXPECT_EQ(a.n_tokens(0), 31);
  try {
    rattn::api::Sequence::decode_batch({&a, &b}, 0, {q.data()}, {kv.data(), kv.data()}, {kv.data(), kv.data()},
                                       RATTN_F32, {oa.data(), ob.data()});
    FAIL() << "a missing q must throw";
  } catch (const rattn::api::Exception& e) {
    EXPECT_EQ(e.status(), RATTN_INVALID_ARGUMENT);
  }
  EXPECT_EQ(b.n_tokens(0), 31);
}

// Two sequences of one context decode on two threads at once (the context's
// worker pool serves both); each matches the same sequence decoded alone.
TEST(ApiThreads, TwoSequencesOnTwoThreads) {
  const rattn_context_params p = small_params();
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK);
  const Inputs in_a(70, 11), in_b(90, 12);
  auto run = [&](const Inputs& in, uint64_t seed, std::vector<float>* out) {
    rattn_sequence* seq = nullptr;
    ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
    for (int layer = 0; layer < 2; ++layer)
      ASSERT_EQ(rattn_sequence_prefill(seq, layer, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32), RATTN_OK);
    for (int round = 0; round < 5; ++round)
      for (int layer = 0; layer < 2; ++layer) {
        const auto o = decode_steps(seq, layer, 8, seed + uint64_t(round * 2 + layer) * 1000);
        out->insert(out->end(), o.begin(), o.end());
      }
    rattn_sequence_free(seq);
  };
  std::vector<float> alone_a, alone_b, par_a, par_b;
  run(in_a, 1, &alone_a);
  run(in_b, 2, &alone_b);
  std::thread ta([&] { run(in_a, 1, &par_a); });
  std::thread tb([&] { run(in_b, 2, &par_b); });
  ta.join();
  tb.join();
  ASSERT_EQ(par_a.size(), alone_a.size());
  ASSERT_EQ(par_b.size(), alone_b.size());
  EXPECT_EQ(0, std::memcmp(par_a.data(), alone_a.data(), par_a.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(par_b.data(), alone_b.data(), par_b.size() * sizeof(float)));
  rattn_context_free(ctx);
}

}  // namespace
