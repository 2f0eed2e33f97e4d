// The exact emitted CUDA text, compiled for the host against simt_emu.h (see
// emu_gen.cpp), against a float64 reference. Tolerance: max |o - ref| over a
// head's output <= 3e-3 * max |ref| of that head (relative to the row's scale),
// and |lse - ref| <= 3e-3 * max(1, |ref|). K/V are rounded to the storage dtype
// first, so the tolerance covers only the kernel's own fp32 arithmetic.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "codegen/cuda/model_kernels.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "tests/codegen/cuda/emu_registry.h"
#include "tests/codegen/cuda/simt_emu_launch.h"

namespace rattn {
namespace {

using cuda::DecodeAttentionParams;
using cuda::KvLayout;

struct StaticSet {
  int64_t sinks = 0, window = 0;
};

// K/V of `heads` KV heads over a context whose static set is [0, sinks) and
// [window_begin, window_begin + window); the tokens between are loud garbage
// that would wreck the result if the kernel read them.
struct KvData {
  std::vector<uint16_t> k, v;
  std::vector<int> page_table;
  long long head_stride = 0, window_begin = 0;
  std::vector<float> q;             // [heads][G][D]
  std::vector<double> ref_o, ref_lse;  // [heads][G][D], [heads][G]
};

KvData make_data(const DecodeAttentionParams& p, int heads, StaticSet set, uint32_t seed) {
  const int D = p.head_dim, G = p.group_size;
  const int64_t gap = 37;
  KvData data;
  data.window_begin = set.sinks + gap;
  const int64_t context = data.window_begin + set.window;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto store = [&](float x) { return p.kv_dtype == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x); };
  auto load = [&](uint16_t b) { return double(p.kv_dtype == DType::bf16 ? bf16_to_f32(b) : f16_to_f32(b)); };
  auto in_static_set = [&](int64_t pos) {
    return pos < set.sinks || (pos >= data.window_begin && pos < context);
  };
  // Row r of head h holds position pos; fill it.
  std::vector<uint16_t> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(D));
  auto fill_row = [&](int64_t pos) {
    const float loud = in_static_set(pos) ? 1.f : 300.f;
    const float boost = pos % 7 == 0 ? 2.5f : 1.f;  // uneven scores exercise the running max
    for (int x = 0; x < D; ++x) {
      krow[size_t(x)] = store(normal(rng) * boost * loud);
      vrow[size_t(x)] = store(normal(rng) * loud);
    }
  };
  std::vector<std::vector<double>> kf(static_cast<size_t>(heads)), vf(static_cast<size_t>(heads));  // static set, per head
  if (p.layout == KvLayout::contiguous) {
    data.head_stride = context;
    data.k.resize(size_t(heads * context * D) + 8);
    data.v.resize(data.k.size());
  } else {
    const long long pages = (context + p.page_size - 1) / p.page_size;
    data.head_stride = std::max(1LL, pages);
    const int pool = int(heads * data.head_stride + 3);
    std::vector<int> ids(static_cast<size_t>(pool));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    data.page_table.assign(ids.begin(), ids.begin() + heads * data.head_stride);
    data.k.resize(size_t(pool) * size_t(p.page_size) * size_t(D) + 8);
    data.v.resize(data.k.size());
  }
  for (int h = 0; h < heads; ++h)
    for (int64_t pos = 0; pos < context; ++pos) {
      fill_row(pos);
      int64_t row;
      if (p.layout == KvLayout::contiguous) {
        row = h * context + pos;
      } else {
        row = int64_t(data.page_table[size_t(h * data.head_stride + pos / p.page_size)]) * p.page_size +
              pos % p.page_size;
      }
      std::copy(krow.begin(), krow.end(), data.k.begin() + row * D);
      std::copy(vrow.begin(), vrow.end(), data.v.begin() + row * D);
      if (in_static_set(pos))
        for (int x = 0; x < D; ++x) {
          kf[size_t(h)].push_back(load(krow[size_t(x)]));
          vf[size_t(h)].push_back(load(vrow[size_t(x)]));
        }
    }
  data.q.resize(size_t(heads * G * D));
  for (auto& x : data.q) x = normal(rng);
  // float64 reference.
  const int64_t n = set.sinks + set.window;
  data.ref_o.assign(size_t(heads * G * D), 0.0);
  data.ref_lse.assign(size_t(heads * G), -std::numeric_limits<double>::infinity());
  for (int h = 0; h < heads; ++h)
    for (int g = 0; g < G; ++g) {
      if (n == 0) continue;
      const float* qg = &data.q[size_t((h * G + g) * D)];
      std::vector<double> s(static_cast<size_t>(n));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        double dot = 0;
        for (int x = 0; x < D; ++x) dot += double(qg[x]) * kf[size_t(h)][size_t(i * D + x)];
        s[size_t(i)] = dot / std::sqrt(double(D));
        mx = std::max(mx, s[size_t(i)]);
      }
      double sum = 0;
      for (double si : s) sum += std::exp(si - mx);
      const double lse = mx + std::log(sum);
      data.ref_lse[size_t(h * G + g)] = lse;
      for (int64_t i = 0; i < n; ++i) {
        const double w = std::exp(s[size_t(i)] - lse);
        for (int x = 0; x < D; ++x)
          data.ref_o[size_t((h * G + g) * D + x)] += w * vf[size_t(h)][size_t(i * D + x)];
      }
    }
  return data;
}

struct Result {
  std::vector<float> o, lse;
};

Result run_emulated(const emu_test::EmuModule& m, const cuda::KernelModule& lowered, const KvData& d,
                    int heads, StaticSet set) {
  const auto& p = m.params;
  const int G = p.group_size, D = p.head_dim;
  Result r;
  r.o.assign(size_t(heads * G * D), std::nanf(""));
  r.lse.assign(size_t(heads * G), std::nanf(""));
  const cuda::KernelDef* partial = cuda::find_kernel(lowered, cuda::KernelRole::partial);
  std::vector<float> o_ws, lse_ws;
  float* o_dst = r.o.data();
  float* lse_dst = r.lse.data();
  if (m.merge) {
    o_ws.assign(size_t(heads * p.splits * G * D), std::nanf(""));
    lse_ws.assign(size_t(heads * p.splits * G), std::nanf(""));
    o_dst = o_ws.data();
    lse_dst = lse_ws.data();
  }
  const int* pt = d.page_table.empty() ? nullptr : d.page_table.data();
  emu::launch(m.partial, dim3(unsigned(p.splits), unsigned(heads), unsigned(lowered.mapping.group_blocks)),
              dim3(unsigned(partial->block_threads)),
              size_t(partial->shared_bytes), d.q.data(), d.k.data(), d.v.data(), pt, d.head_stride,
              int(set.sinks), int(set.window), d.window_begin, o_dst, lse_dst);
  if (m.merge) {
    const cuda::KernelDef* merge = cuda::find_kernel(lowered, cuda::KernelRole::merge);
    emu::launch(m.merge, dim3(1, unsigned(heads)), dim3(unsigned(merge->block_threads)), 0,
                static_cast<const float*>(o_ws.data()), static_cast<const float*>(lse_ws.data()),
                r.o.data(), r.lse.data());
  }
  return r;
}

const emu_test::EmuModule& module_at(size_t i) {
  const auto& all = emu_test::modules();
  const std::string want = cuda::module_uri(emu_test::covered_specialisations().at(i));
  for (const auto& m : all)
    if (m.name == want) return m;
  throw std::runtime_error("emulated module " + want + " was not built into this test");
}

class EmulatedKernel : public testing::TestWithParam<std::tuple<size_t, int>> {};

TEST_P(EmulatedKernel, MatchesFloat64Reference) {
  const auto [index, total] = GetParam();
  const emu_test::EmuModule& m = module_at(index);
  // The compiled text is what the generator emits today.
  const cuda::GeneratedModule now = cuda::generate_module(m.params);
  ASSERT_EQ(now.module.name, m.name);
  ASSERT_EQ(fnv1a64(now.source.data(), now.source.size()), m.text_hash)
      << "the emulated text is stale: rebuild codegen_cuda_emu_test";
  StaticSet set;
  switch (total) {
    case 0: set = {0, 0}; break;
    case 1: set = {0, 1}; break;
    case 31: set = {4, 27}; break;
    case 200: set = {16, 184}; break;
    case 640: set = {128, 512}; break;
    case 4096: set = {128, 3968}; break;
    default: FAIL() << "no static set for " << total;
  }
  const int heads = total >= 4096 ? 1 : 2;
  const KvData data = make_data(m.params, heads, set, uint32_t(index * 131 + total));
  const Result r = run_emulated(m, now.module, data, heads, set);
  const int G = m.params.group_size, D = m.params.head_dim;
  double worst = 0;
  for (int hg = 0; hg < heads * G; ++hg) {
    const double ref_lse = data.ref_lse[size_t(hg)];
    if (std::isinf(ref_lse)) {
      EXPECT_TRUE(std::isinf(r.lse[size_t(hg)]) && r.lse[size_t(hg)] < 0) << "row " << hg;
      for (int x = 0; x < D; ++x) EXPECT_EQ(r.o[size_t(hg * D + x)], 0.f);
      continue;
    }
    EXPECT_NEAR(r.lse[size_t(hg)], ref_lse, 3e-3 * std::max(1.0, std::fabs(ref_lse))) << "row " << hg;
    double scale = 0, err = 0;
    for (int x = 0; x < D; ++x) {
      scale = std::max(scale, std::fabs(data.ref_o[size_t(hg * D + x)]));
      const double o = r.o[size_t(hg * D + x)];
      err = std::isfinite(o) ? std::max(err, std::fabs(o - data.ref_o[size_t(hg * D + x)])) : 1e30;
    }
    const double rel = err / std::max(scale, 1e-12);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 3e-3) << "row " << hg;
  }
  RecordProperty("max_rel_error", std::to_string(worst));
}

std::string case_name(const testing::TestParamInfo<std::tuple<size_t, int>>& info) {
  // By value: the list is a temporary.
  const auto p = emu_test::covered_specialisations().at(std::get<0>(info.param));
  std::string n = cuda::module_uri(p) + "_n" + std::to_string(std::get<1>(info.param));
  return n.substr(std::string("rattn_decode_").size());
}

INSTANTIATE_TEST_SUITE_P(
    Covered, EmulatedKernel,
    testing::Combine(testing::Range(size_t(0), emu_test::covered_specialisations().size()),
                     testing::Values(0, 1, 31, 200, 640, 4096)),
    case_name);

// The texts proven above also build for the device: NVRTC to CUBIN (the
// cp.async path, 4/8/16-byte copies and wait depths 0..3 only exist there).
TEST(EmulatedKernels, SameTextsCompileWithNvrtc) {
  std::vector<cuda::GeneratedModule> all;
  for (const auto& p : emu_test::covered_specialisations()) all.push_back(cuda::generate_module(p));
  const std::string dir = testing::TempDir() + "rattn-emu-nvrtc-" + std::to_string(::getpid());
  cuda::KernelCache cache(dir);
  cuda::CompileOptions o;
  o.arch = "sm_90";
  const auto compiled = cuda::compile_modules(cache, all, o);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(compiled[i].cubin.compare(0, 4, "\x7f" "ELF"), 0) << all[i].module.name;
    EXPECT_NE(compiled[i].ptx.find("cp.async.wait_group"), std::string::npos) << all[i].module.name;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(EmulatedKernels, EveryCoveredSpecialisationIsBuilt) {
  EXPECT_EQ(emu_test::modules().size(), emu_test::covered_specialisations().size());
  std::vector<int> groups(65, 0);
  for (const auto& p : emu_test::covered_specialisations()) groups[size_t(p.group_size)]++;
  for (int g : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32}) EXPECT_GT(groups[size_t(g)], 0) << "group size " << g << " not covered";
  // Group 16 at head_dim 128 and 256, over several splits and warps.
  for (int d : {128, 256}) {
    bool multi = false;
    for (const auto& p : emu_test::covered_specialisations())
      multi |= p.group_size == 16 && p.head_dim == d && p.splits > 1 && p.warps > 1;
    EXPECT_TRUE(multi) << "head_dim " << d;
  }
}

}  // namespace
}  // namespace rattn
