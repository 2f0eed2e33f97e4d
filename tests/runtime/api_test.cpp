// The C API's contracts: errors come back as statuses with messages (null
// pointers, wrong shapes, bad call order, truncated or corrupted files),
// save/load round trips exactly, progress and log callbacks, and two
// sequences decoding on two threads at once.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "rattn.h"
#include "rattn.hpp"
#include "tests/runtime/api_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::random_normal;

constexpr int kHq = 4, kHkv = 2, kDim = 16;

rattn_context_params small_params(rattn_index_kind kind = RATTN_INDEX_EXACT) {
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
rattn_context_params params_recording_progress(std::vector<float>* seen) {
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
std::vector<float> decode_steps(rattn_sequence* seq, int layer, int steps, uint64_t seed) {
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

TEST(ApiStatic, StatusStringsAndVersion) {
  for (int s = 0; s <= 8; ++s) EXPECT_STRNE(rattn_status_string(rattn_status(s)), "unknown status");
  EXPECT_STREQ(rattn_status_string(rattn_status(99)), "unknown status");
  EXPECT_STREQ(rattn_version(), "0.1.0");
}

TEST(ApiStatic, CreateRejectsNullsAndBadLayouts) {
  rattn_context* ctx = reinterpret_cast<rattn_context*>(0x1);
  EXPECT_EQ(rattn_context_create(nullptr, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);  // cleared on failure
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("params"), std::string::npos);
  rattn_context_params p = small_params();
  EXPECT_EQ(rattn_context_create(&p, nullptr), RATTN_INVALID_ARGUMENT);

  p = rattn_context_default_params();  // no plan, no layout
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("head_dim"), std::string::npos);

  p = small_params();
  p.n_q_heads = 5;  // not a multiple of the 2 KV heads
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("multiple"), std::string::npos);
  p = small_params();
  p.window = 0;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p = small_params();
  p.build_sample = 2.f;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p = small_params();
  p.kv_storage = rattn_dtype(9);
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p = small_params();
  p.kernels = rattn_kernels_kind(9);
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p = small_params();
  p.index_kind = rattn_index_kind(9);
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p = small_params();
  p.insert_batch = 0;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("insert_batch"), std::string::npos);
  p = small_params();
  p.plan_path = "/nonexistent/plan.ra";
  EXPECT_NE(rattn_context_create(&p, &ctx), RATTN_OK);
  EXPECT_STRNE(rattn_context_last_error(nullptr), "");
  p = small_params();
  p.plan_text = "this is not a plan {";
  EXPECT_NE(rattn_context_create(&p, &ctx), RATTN_OK);
  EXPECT_EQ(ctx, nullptr);
}

// Plan text goes through the DSL front end with its limits: knobs are
// checked, and a text over the size cap is refused before it is lexed (a
// quadratic path on this half-million-member set would not finish).
TEST(ApiStatic, PlanTextIsCheckedLikeAFile) {
  const std::string model = "model \"M\" { layers = 1; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192; }\n";
  rattn_context_params p = small_params();
  rattn_context* ctx = nullptr;
  const std::pair<std::string, std::string> cases[] = {
      {model + "plan { kernel.cuda.warps = 3; }\n", "<plan_text>:2:28: error: 'kernel.cuda.warps' must be 1, 2, 4 or 8, got 3"},
      {model + "plan { kernel.foo.bar = 1; }\n", "<plan_text>:2:8: error: unknown key 'kernel.foo.bar' in the plan block (expected one of: kernel.cuda.tile"},
  };
  for (const auto& [plan, message] : cases) {
    p.plan_text = plan.c_str();
    EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_PARSE_ERROR) << plan;
    EXPECT_EQ(ctx, nullptr);
    EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find(message), std::string::npos)
        << rattn_context_last_error(nullptr);
  }
  std::string big = model + "plan { top_k = {";
  for (int i = 1; i <= 500000; ++i) big += (i > 1 ? ", " : "") + std::to_string(i);
  big += "}; }\n";
  p.plan_text = big.c_str();
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_PARSE_ERROR);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("a .ra file may have at most 1048576 (1 MiB)"),
            std::string::npos)
      << rattn_context_last_error(nullptr);
}

TEST(ApiStatic, NullHandlesReturnStatus) {
  rattn_sequence* seq = nullptr;
  float out[kHq * kDim], buf[kHq * kDim] = {};
  rattn_memory_info mem;
  rattn_context_info info;
  EXPECT_EQ(rattn_sequence_create(nullptr, &seq), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_prefill(nullptr, 0, 1, buf, buf, buf, RATTN_F32), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_decode(nullptr, 0, buf, buf, buf, RATTN_F32, out, nullptr), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_memory(nullptr, &mem), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_save(nullptr, "x"), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_load(nullptr, "x", &seq), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_context_get_info(nullptr, &info), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(rattn_sequence_n_tokens(nullptr, 0), -1);
  rattn_sequence_free(nullptr);
  rattn_context_free(nullptr);
}

TEST_F(Api, NullArgumentsReturnStatus) {
  const Inputs in(40, 1);
  float out[kHq * kDim];
  expect_error(rattn_sequence_prefill(seq, 0, in.n, nullptr, in.k.data(), in.v.data(), RATTN_F32),
               RATTN_INVALID_ARGUMENT, "null");
  prefill(seq, 0, in);
  expect_error(rattn_sequence_decode(seq, 0, in.q.data(), in.k.data(), in.v.data(), RATTN_F32, nullptr, nullptr),
               RATTN_INVALID_ARGUMENT, "null");
  expect_error(rattn_sequence_decode(seq, 0, in.q.data(), nullptr, in.v.data(), RATTN_F32, out, nullptr),
               RATTN_INVALID_ARGUMENT, "null");
  expect_error(rattn_sequence_memory(seq, nullptr), RATTN_INVALID_ARGUMENT, "out");
  expect_error(rattn_sequence_save(seq, nullptr), RATTN_INVALID_ARGUMENT, "path");
  rattn_sequence* loaded = nullptr;
  expect_error(rattn_sequence_load(ctx, nullptr, &loaded), RATTN_INVALID_ARGUMENT, "path");
  expect_error(rattn_context_get_info(ctx, nullptr), RATTN_INVALID_ARGUMENT, "out");
  // The failures left the sequence usable.
  EXPECT_EQ(rattn_sequence_decode(seq, 0, in.q.data(), in.k.data(), in.v.data(), RATTN_F32, out, nullptr), RATTN_OK)
      << rattn_context_last_error(ctx);
}

TEST_F(Api, WrongShapesAndCallOrderReturnStatus) {
  const Inputs in(40, 2);
  float out[kHq * kDim];
  expect_error(rattn_sequence_prefill(seq, 2, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
               RATTN_INVALID_ARGUMENT, "layer 2 out of range");
  expect_error(rattn_sequence_prefill(seq, -1, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
               RATTN_INVALID_ARGUMENT, "out of range");
  expect_error(rattn_sequence_prefill(seq, 0, 0, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
               RATTN_INVALID_ARGUMENT, "n_tokens");
  expect_error(rattn_sequence_prefill(seq, 0, in.n, in.q.data(), in.k.data(), in.v.data(), rattn_dtype(5)),
               RATTN_INVALID_ARGUMENT, "dtype");
  expect_error(rattn_sequence_decode(seq, 0, in.q.data(), in.k.data(), in.v.data(), RATTN_F32, out, nullptr),
               RATTN_INVALID_ARGUMENT, "not prefilled");
  prefill(seq, 0, in);
  expect_error(rattn_sequence_prefill(seq, 0, in.n, in.q.data(), in.k.data(), in.v.data(), RATTN_F32),
               RATTN_INVALID_ARGUMENT, "already prefilled");
  expect_error(rattn_sequence_decode(seq, 7, in.q.data(), in.k.data(), in.v.data(), RATTN_F32, out, nullptr),
               RATTN_INVALID_ARGUMENT, "layer 7");
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 7), -1);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 40);
}

TEST_F(Api, ContextInfoReflectsOverrides) {
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_EQ(info.n_layers, 2);
  EXPECT_EQ(info.n_global_layers, 2);
  EXPECT_EQ(info.n_q_heads, kHq);
  EXPECT_EQ(info.n_kv_heads, kHkv);
  EXPECT_EQ(info.head_dim, kDim);
  EXPECT_EQ(info.sinks, 4);
  EXPECT_EQ(info.window, 8);
  EXPECT_EQ(info.top_k, 6);
  EXPECT_EQ(info.graph_degree, 32);  // the plan's default, not overridden
  EXPECT_EQ(info.kv_storage, RATTN_F16);
  EXPECT_EQ(info.n_threads, 2);
  EXPECT_FALSE(info.gpu);
  EXPECT_STREQ(info.cpu_kernels, "reference");
  EXPECT_EQ(info.insert_batch, 1);
}

TEST_F(Api, SaveLoadRoundTripsExactly) {
  prefill(seq, 1, Inputs(60, 3));
  decode_steps(seq, 1, 15, 100);
  const std::string path = temp_path("roundtrip.seq");
  ASSERT_EQ(rattn_sequence_save(seq, path.c_str()), RATTN_OK) << rattn_context_last_error(ctx);
  rattn_sequence* loaded = nullptr;
  ASSERT_EQ(rattn_sequence_load(ctx, path.c_str(), &loaded), RATTN_OK) << rattn_context_last_error(ctx);
  EXPECT_EQ(rattn_sequence_n_tokens(loaded, 1), 75);
  EXPECT_EQ(rattn_sequence_n_tokens(loaded, 0), 0);
  rattn_memory_info a, b;
  ASSERT_EQ(rattn_sequence_memory(seq, &a), RATTN_OK);
  ASSERT_EQ(rattn_sequence_memory(loaded, &b), RATTN_OK);
  EXPECT_EQ(a.cpu_tokens, b.cpu_tokens);
  EXPECT_EQ(a.cpu_tokens, (75 - 12) * kHkv);
  // Both continue identically (window ring position, indexes, stored queries).
  const auto x = decode_steps(seq, 1, 20, 500), y = decode_steps(loaded, 1, 20, 500);
  ASSERT_EQ(x.size(), y.size());
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)));
  // The unprefilled layer of the loaded sequence can still be prefilled.
  prefill(loaded, 0, Inputs(30, 9));
  rattn_sequence_free(loaded);
  std::remove(path.c_str());
}

TEST_F(Api, TruncatedOrCorruptedFileReturnsStatus) {
  prefill(seq, 0, Inputs(50, 4));
  const std::string path = temp_path("good.seq");
  ASSERT_EQ(rattn_sequence_save(seq, path.c_str()), RATTN_OK);
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(bytes.size(), 100u);
  const std::string bad = temp_path("bad.seq");
  auto write = [&](const std::string& b) {
    std::ofstream f(bad, std::ios::binary | std::ios::trunc);
    f.write(b.data(), std::streamsize(b.size()));
  };
  rattn_sequence* out = nullptr;
  for (size_t len : {size_t(0), size_t(7), size_t(23), size_t(40), bytes.size() / 2, bytes.size() - 1}) {
    write(bytes.substr(0, len));
    expect_error(rattn_sequence_load(ctx, bad.c_str(), &out), RATTN_CORRUPT_DATA, "sequence file");
    EXPECT_EQ(out, nullptr);
  }
  for (size_t pos : {size_t(2), size_t(9), size_t(30), bytes.size() / 3, bytes.size() - 3}) {
    std::string b = bytes;
    b[pos] = char(b[pos] ^ 0x5a);
    write(b);
    EXPECT_EQ(rattn_sequence_load(ctx, bad.c_str(), &out), RATTN_CORRUPT_DATA) << "flipped byte " << pos;
  }
  expect_error(rattn_sequence_load(ctx, temp_path("missing.seq").c_str(), &out), RATTN_IO_ERROR, "cannot open");
  // A FIFO is refused at once (opening it to read would wait for a writer),
  // a directory by name.
  const std::string fifo = temp_path("fifo.seq");
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error(rattn_sequence_load(ctx, fifo.c_str(), &out), RATTN_IO_ERROR, "is a FIFO");
  EXPECT_EQ(out, nullptr);
  std::remove(fifo.c_str());
  const std::string dir = temp_path("dir.seq");
  ::mkdir(dir.c_str(), 0700);
  expect_error(rattn_sequence_load(ctx, dir.c_str(), &out), RATTN_IO_ERROR, "is a directory");
  EXPECT_EQ(out, nullptr);
  ::rmdir(dir.c_str());
  // A context with another layout refuses the file.
  rattn_context_params p = small_params();
  p.window = 16;
  rattn_context* other = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &other), RATTN_OK);
  EXPECT_EQ(rattn_sequence_load(other, path.c_str(), &out), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(other)).find("different layout"), std::string::npos);
  rattn_context_free(other);
  // Saving where no file can be written.
  expect_error(rattn_sequence_save(seq, "/nonexistent-dir/x.seq"), RATTN_IO_ERROR, "nonexistent-dir");
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

// Static-set attention takes the GPU exactly when the backend finds one and
// its kernels cover the model (fp16/bf16 storage, head_dim 64/128/256, groups
// up to 8), and says so through context info and memory info; otherwise (no
// GPU, as on the development machine, or this fixture's head_dim 16) the CPU
// fallback runs and the step still works.
TEST_F(Api, GpuOrFallbackIsReported) {
  std::string why_not;
  const bool present = rattn::gpu_present(&why_not);
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_FALSE(info.gpu);  // head_dim 16: no GPU kernel, present or not
  ASSERT_NE(info.gpu_status, nullptr);
  if (!present) {
    EXPECT_NE(std::string(info.gpu_status).find("no GPU"), std::string::npos) << info.gpu_status;
    EXPECT_NE(std::string(info.gpu_status).find(why_not), std::string::npos) << info.gpu_status;
  } else {
    EXPECT_NE(std::string(info.gpu_status).find("head_dim 16"), std::string::npos) << info.gpu_status;
  }
  prefill(seq, 1, Inputs(40, 3));
  decode_steps(seq, 1, 3, 100);
  rattn_memory_info mem;
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);
  EXPECT_FALSE(mem.static_set_on_gpu);
  EXPECT_GT(mem.static_set_bytes, 0u);
  // A model the GPU kernels cover takes the GPU exactly when one is present.
  {
    rattn_context_params p = small_params();
    p.n_q_heads = 4;
    p.n_kv_heads = 1;
    p.head_dim = 64;
    p.kv_storage = RATTN_F16;
    rattn_context* gpu_ctx = nullptr;
    ASSERT_EQ(rattn_context_create(&p, &gpu_ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    ASSERT_EQ(rattn_context_get_info(gpu_ctx, &info), RATTN_OK);
    EXPECT_EQ(info.gpu, present) << info.gpu_status;
    rattn_sequence* s = nullptr;
    ASSERT_EQ(rattn_sequence_create(gpu_ctx, &s), RATTN_OK);
    const int64_t n = 30;
    const auto q = random_normal(size_t(4 * n * 64), 1), k = random_normal(size_t(n * 64), 2),
               v = random_normal(size_t(n * 64), 3);
    ASSERT_EQ(rattn_sequence_prefill(s, 0, n, q.data(), k.data(), v.data(), RATTN_F32), RATTN_OK)
        << rattn_context_last_error(gpu_ctx);
    std::vector<float> out(4 * 64);
    const auto qt = random_normal(4 * 64, 4), kt = random_normal(64, 5), vt = random_normal(64, 6);
    ASSERT_EQ(rattn_sequence_decode(s, 0, qt.data(), kt.data(), vt.data(), RATTN_F32, out.data(), nullptr), RATTN_OK)
        << rattn_context_last_error(gpu_ctx);
    ASSERT_EQ(rattn_sequence_memory(s, &mem), RATTN_OK);
    EXPECT_EQ(mem.static_set_on_gpu, present);
    rattn_sequence_free(s);
    rattn_context_free(gpu_ctx);
  }
  // use_gpu = false forces the CPU kernels.
  rattn_context_params p = small_params();
  p.use_gpu = false;
  rattn_context* cpu_ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &cpu_ctx), RATTN_OK);
  ASSERT_EQ(rattn_context_get_info(cpu_ctx, &info), RATTN_OK);
  EXPECT_FALSE(info.gpu);
  EXPECT_NE(std::string(info.gpu_status).find("not requested"), std::string::npos) << info.gpu_status;
  rattn_context_free(cpu_ctx);
}

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

namespace {

// A context from a real plan file: Gemma-3-270M has sliding-window (local)
// layers, which keep their window alone and no index.
TEST(ApiPlan, FromDslFileWithLocalLayers) {
  rattn_context_params p = rattn_context_default_params();
  const std::string path = std::string(RATTN_SOURCE_DIR) + "/models/gemma3-270m.ra";
  p.plan_path = path.c_str();
  p.kernels = RATTN_KERNELS_REFERENCE;
  p.kv_storage = RATTN_F32;
  p.n_threads = 2;
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_EQ(info.n_layers, 18);
  EXPECT_EQ(info.n_global_layers, 3);
  EXPECT_EQ(info.n_q_heads, 4);
  EXPECT_EQ(info.n_kv_heads, 1);
  EXPECT_EQ(info.head_dim, 256);
  EXPECT_EQ(info.sinks, 128);
  EXPECT_EQ(info.window, 512);
  // The plan's layer 17 block: partial expansion there, whole lists on 5 and 11.
  rattn_layer_search own{}, plain{};
  ASSERT_EQ(rattn_context_get_layer_search(ctx, 17, &own), RATTN_OK);
  ASSERT_EQ(rattn_context_get_layer_search(ctx, 5, &plain), RATTN_OK);
  EXPECT_EQ(own.search_queue, 200);
  EXPECT_EQ(own.search_expand_first, 12);
  EXPECT_EQ(own.search_full_expand, 25);
  EXPECT_EQ(plain.search_queue, info.search_queue);
  EXPECT_EQ(plain.search_expand_first, 0);
  EXPECT_EQ(plain.search_seeds, own.search_seeds);

  // Layer 0 is local(512): decode attends to exactly the last 512 tokens.
  const int d = 256, hq = 4;
  const int64_t prompt = 600, steps = 3, total = prompt + steps;
  const auto k = random_normal(size_t(total) * d, 31), v = random_normal(size_t(total) * d, 32);
  const auto q = random_normal(size_t(hq) * size_t(prompt) * d, 33);
  rattn_sequence* seq = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  ASSERT_EQ(rattn_sequence_prefill(seq, 0, prompt, q.data(), k.data(), v.data(), RATTN_F32), RATTN_OK)
      << rattn_context_last_error(ctx);
  std::vector<float> out(size_t(hq) * d);
  std::vector<double> ref(d);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t t = prompt + s;
    const auto qt = random_normal(size_t(hq) * d, 100 + uint64_t(s));
    ASSERT_EQ(rattn_sequence_decode(seq, 0, qt.data(), k.data() + t * d, v.data() + t * d, RATTN_F32, out.data(), nullptr),
              RATTN_OK);
    for (int h = 0; h < hq; ++h) {
      double lse;
      rattn::testing::reference_attention(qt.data() + h * d, k.data() + (t + 1 - 512) * d, v.data() + (t + 1 - 512) * d,
                                          512, d, ref.data(), &lse);
      for (int j = 0; j < d; ++j) ASSERT_NEAR(out[size_t(h * d + j)], ref[size_t(j)], 2e-5);
    }
  }
  rattn_memory_info mem;
  ASSERT_EQ(rattn_sequence_memory(seq, &mem), RATTN_OK);
  EXPECT_EQ(mem.cpu_tokens, 0);  // a local layer offloads nothing
  rattn_sequence_free(seq);
  rattn_context_free(ctx);
}

}  // namespace
