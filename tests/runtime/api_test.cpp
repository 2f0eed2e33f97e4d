// The C API's contracts: errors come back as statuses with messages (null
// pointers, wrong shapes, bad call order, truncated or corrupted files),
// save/load round trips exactly, and a context from a plan file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "rattn.h"
#include "tests/runtime/api_fixture.h"
#include "tests/runtime/test_util.h"

namespace {

using namespace rattn::testing::api;

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
  EXPECT_EQ(info.insert_batch, 16);
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
