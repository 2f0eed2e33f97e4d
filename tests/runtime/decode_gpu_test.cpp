// The static set on a GPU: the backend's split begin/finish, a stand-in
// backend mirroring the static set one row per step, and the real GPU
// (when present) against the CPU path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu_kernels.h"
#include "runtime/runtime.h"
#include "tests/runtime/decode_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::cpp_config;
using rattn::testing::decode_run;
using rattn::testing::StandInCounters;
using rattn::testing::StandInGpu;
using rattn::testing::temp_path;
using Stream = rattn::testing::TokenStream;

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

}  // namespace
