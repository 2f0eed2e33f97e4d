// prefill_end_async / prefill_wait: layers built in the background give the
// same sequence as prefill, byte for byte; a building layer is refused by
// every call; a failed build surfaces at the wait and leaves its layer as
// before its chunks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/runtime.h"
#include "tests/runtime/decode_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::cpp_config;
using rattn::testing::expect_refused;
using rattn::testing::temp_path;
using Stream = rattn::testing::TokenStream;

constexpr int kHq = 8, kHkv = 2, kD = 32, kSinks = 4, kWindow = 16, kLayers = 3;
constexpr int64_t kPrompt = 2200;  // above the graph threshold (2048): projected graphs are built

std::shared_ptr<const rattn::Runtime> runtime(int threads) {
  auto c = cpp_config(kHq, kHkv, kD, kSinks, kWindow);
  c.layout.num_layers = kLayers;
  c.layout.layers.assign(kLayers, rattn::LayerSpec{});
  c.threads = threads;
  return std::make_shared<const rattn::Runtime>(c);
}

// Layer `layer`'s prompt (stream `s`, the first kPrompt tokens) in two chunks.
void hand_chunks(rattn::Sequence& seq, const Stream& s, int layer) {
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 700}, {700, kPrompt - 700}}) {
    const auto q = s.rows(s.q, kHq, first, n), k = s.rows(s.k, kHkv, first, n), v = s.rows(s.v, kHkv, first, n);
    seq.prefill_chunk(layer, n, q.data(), k.data(), v.data(), rattn::DType::f32);
  }
}

void prefill_whole(rattn::Sequence& seq, const Stream& s, int layer) {
  const auto q = s.prefix(s.q, kHq, kPrompt), k = s.prefix(s.k, kHkv, kPrompt), v = s.prefix(s.v, kHkv, kPrompt);
  seq.prefill(layer, kPrompt, q.data(), k.data(), v.data(), rattn::DType::f32);
}

std::string image_of(const rattn::Sequence& seq, const char* what) {
  const std::string path = temp_path(what);
  seq.save(path);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::remove(path.c_str());
  return bytes;
}

// Three layers built at once in the background (each its own prompt) save
// the same image as the same prompts prefilled one by one: static sets, CPU
// stores, window queries and every index, byte for byte. With 1 and 3 threads.
TEST(PrefillAsync, BuildsTheSameSequenceByteForByte) {
  for (int threads : {1, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    auto rt = runtime(threads);
    std::vector<Stream> prompts;
    for (int l = 0; l < kLayers; ++l) prompts.emplace_back(kHq, kHkv, kD, kPrompt, 300 + l);
    rattn::Sequence sync(rt), async(rt);
    for (int l = 0; l < kLayers; ++l) prefill_whole(sync, prompts[size_t(l)], l);
    for (int l = 0; l < kLayers; ++l) {
      hand_chunks(async, prompts[size_t(l)], l);
      async.prefill_end_async(l);
    }
    EXPECT_EQ(async.builds_in_flight(), kLayers);
    async.prefill_wait();
    EXPECT_EQ(async.builds_in_flight(), 0);
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_TRUE(async.prefilled(l));
      EXPECT_EQ(async.tokens(l), kPrompt);
    }
    const std::string a = image_of(sync, "async-sync"), b = image_of(async, "async-async");
    ASSERT_GT(a.size(), size_t(kPrompt) * kHkv * kD);  // the stores and indexes are in it
    EXPECT_TRUE(a == b) << "the images differ";
    async.prefill_wait();  // nothing left to wait for
  }
}

// While layer 0 builds: every call on it is refused (it reads as holding no
// tokens), so are save, clone, memory and refresh; layer 1 prefills and
// decodes meanwhile. After the wait both decode as plain prefills do.
TEST(PrefillAsync, BuildingLayerIsRefusedOthersGoOn) {
  auto rt = runtime(2);
  Stream s(kHq, kHkv, kD, kPrompt + 4, 41);
  rattn::Sequence seq(rt), ref(rt);
  prefill_whole(ref, s, 0);
  prefill_whole(ref, s, 1);
  hand_chunks(seq, s, 0);
  seq.prefill_end_async(0);
  EXPECT_FALSE(seq.prefilled(0));
  EXPECT_EQ(seq.tokens(0), 0);
  const auto tq = s.token(s.q, kHq, kPrompt), tk = s.token(s.k, kHkv, kPrompt), tv = s.token(s.v, kHkv, kPrompt);
  std::vector<float> out(size_t(kHq) * kD), out_ref(out.size());
  expect_refused([&] { seq.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out.data(), nullptr); },
                 "decode: layer 0 is building in the background");
  expect_refused([&] { hand_chunks(seq, s, 0); }, "prefill_chunk: layer 0 is building");
  expect_refused([&] { seq.prefill_end_async(0); }, "prefill_end_async: layer 0 is building");
  expect_refused([&] { seq.prefill_end(0); }, "prefill_end: layer 0 is building");
  expect_refused([&] { prefill_whole(seq, s, 0); }, "prefill: layer 0 is building");
  expect_refused([&] { seq.save(temp_path("async-refused")); }, "save: layer 0 is building in the background");
  expect_refused([&] { seq.clone(); }, "clone: layer 0 is building");
  expect_refused([&] { seq.memory(); }, "memory: layer 0 is building");
  expect_refused([&] { seq.refresh_indexes(); }, "refresh: layer 0 is building");
  // Another layer is free meanwhile.
  prefill_whole(seq, s, 1);
  seq.decode(1, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out.data(), nullptr);
  ref.decode(1, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out_ref.data(), nullptr);
  EXPECT_EQ(std::memcmp(out.data(), out_ref.data(), out.size() * sizeof(float)), 0) << "layer 1";
  seq.prefill_wait();
  EXPECT_EQ(seq.tokens(0), kPrompt);
  seq.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out.data(), nullptr);
  ref.decode(0, tq.data(), tk.data(), tv.data(), rattn::DType::f32, out_ref.data(), nullptr);
  EXPECT_EQ(std::memcmp(out.data(), out_ref.data(), out.size() * sizeof(float)), 0) << "layer 0";
}

// A build that fails (here its progress callback throws once the build is
// done) surfaces at prefill_wait with its status and layer, after the other
// builds have finished; its layer is as before its chunks and prefills
// again to the plain prefill's image, while the layer that built is kept.
TEST(PrefillAsync, FailureSurfacesAtTheWaitAndLeavesTheLayerValid) {
  auto rt = runtime(2);
  std::vector<Stream> prompts;
  for (int l = 0; l < 2; ++l) prompts.emplace_back(kHq, kHkv, kD, kPrompt, 500 + l);
  rattn::Sequence seq(rt), ref(rt);
  for (int l = 0; l < 2; ++l) prefill_whole(ref, prompts[size_t(l)], l);
  hand_chunks(seq, prompts[0], 0);
  seq.prefill_end_async(0, [](double f) {
    if (f >= 1.0) rattn::fail(rattn::Status::out_of_memory, "refused by the test");
  });
  hand_chunks(seq, prompts[1], 1);
  seq.prefill_end_async(1);
  try {
    seq.prefill_wait();
    ADD_FAILURE() << "the failed build was not reported";
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("refused by the test (background build of layer 0"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seq.builds_in_flight(), 0);
  EXPECT_FALSE(seq.prefilled(0));
  EXPECT_EQ(seq.tokens(0), 0);
  EXPECT_TRUE(seq.prefilled(1));
  expect_refused([&] { seq.prefill_end(0); }, "has no chunks");
  seq.prefill_wait();  // reported once
  hand_chunks(seq, prompts[0], 0);
  seq.prefill_end_async(0);
  seq.prefill_wait();
  EXPECT_TRUE(image_of(seq, "async-retry") == image_of(ref, "async-ref")) << "the images differ";
}

// A sequence freed while its builds run waits for them: each build has
// reported its end by the time the sequence is gone.
TEST(PrefillAsync, FreeWaitsForBuildsInFlight) {
  auto rt = runtime(2);
  Stream s(kHq, kHkv, kD, kPrompt, 61);
  std::vector<double> last(2, 0.0);
  auto seq = std::make_unique<rattn::Sequence>(rt);
  for (int l = 0; l < 2; ++l) {
    hand_chunks(*seq, s, l);
    seq->prefill_end_async(l, [&last, l](double f) { last[size_t(l)] = f; });
  }
  seq.reset();
  EXPECT_EQ(last[0], 1.0);
  EXPECT_EQ(last[1], 1.0);
}

}  // namespace
