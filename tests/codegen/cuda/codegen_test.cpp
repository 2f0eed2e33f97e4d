// Lowering passes, diagnostics, names, NVRTC, the disk cache, the models'
// kernels and the GPU loader.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/temp_dir.h"
#include "codegen/cuda/gpu_backend.h"
#include "codegen/cuda/model_kernels.h"
#include "codegen/cuda/print_cuda.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "tests/runtime/test_util.h"
#include "tools/rattn/commands.h"

namespace rattn::cuda {
namespace {

namespace fs = std::filesystem;

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("rattn-cuda-test") {}
};

// Sets an environment variable for the scope of a test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

DecodeAttentionParams llama_params() {
  DecodeAttentionParams p;
  p.head_dim = 128;
  p.group_size = 4;
  return p;
}

std::string error_of(const std::function<void()>& f, Status* status = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (status) *status = e.status();
    return e.what();
  }
  return "<no error>";
}

TEST(CudaLowering, RunsEveryPassInOrderAndPrintsTheIrAfterEach) {
  std::vector<std::string> seen;
  std::vector<std::string> dumps;
  const KernelModule m = lower_decode_attention(llama_params(), [&](const std::string& pass, const KernelModule& ir) {
    seen.push_back(pass);
    dumps.push_back(print_ir(ir));
  });
  const std::vector<std::string> want = {"lower_from_plan",   "check_specialisation", "map_threads",
                                         "pipeline_kv_tiles", "split_kv_length",      "plan_shared_memory",
                                         "name_kernels"};
  EXPECT_EQ(seen, want);
  // Each pass leaves a mark in the dump.
  EXPECT_EQ(dumps[0].find("mapping"), std::string::npos);
  EXPECT_NE(dumps[2].find("mapping threads=128 lanes_per_token=16"), std::string::npos) << dumps[2];
  EXPECT_NE(dumps[3].find("stage_prologue stages=2"), std::string::npos) << dumps[3];
  EXPECT_EQ(dumps[3].find("kernel merge"), std::string::npos);
  EXPECT_NE(dumps[4].find("kernel merge"), std::string::npos) << dumps[4];
  EXPECT_NE(dumps[4].find("store_partial"), std::string::npos);
  EXPECT_NE(dumps[5].find("shared warp_acc"), std::string::npos);
  EXPECT_NE(dumps[6].find("module rattn_decode_hd128_g4_f16_contig_t32_w4_s4_v8_st2_sm90"), std::string::npos);
}

TEST(CudaLowering, ThreadMappingFollowsHeadDimAndVectorWidth) {
  DecodeAttentionParams p = llama_params();
  p.head_dim = 256;
  p.vec = 4;
  p.warps = 2;
  p.tile = 16;
  const KernelModule m = lower_decode_attention(p);
  EXPECT_EQ(m.mapping.lanes_per_token, 32);
  EXPECT_EQ(m.mapping.chunks_per_lane, 2);
  EXPECT_EQ(m.mapping.tokens_per_pass, 2);
  EXPECT_EQ(m.mapping.tokens_per_slot, 8);
  // K + V tiles: 2 stages x 16 tokens x 256 x 2 bytes x 2; the merge scratch is smaller.
  EXPECT_EQ(find_kernel(m, KernelRole::partial)->shared_bytes, 2 * 16 * 256 * 2 * 2);
}

TEST(CudaLowering, SingleSplitHasNoMergeKernelAndStoresFinalResults) {
  DecodeAttentionParams p = llama_params();
  p.splits = 1;
  const GeneratedModule g = generate_module(p);
  EXPECT_EQ(g.module.kernels.size(), 1u);
  EXPECT_EQ(g.source.find("_merge("), std::string::npos);
  EXPECT_NE(g.source.find("// store_final"), std::string::npos);
}

TEST(CudaLowering, NamesSpellOutEverySpecialisation) {
  std::set<std::string> names;
  DecodeAttentionParams base = llama_params();
  names.insert(module_uri(base));
  auto vary = [&](auto f) {
    DecodeAttentionParams p = base;
    f(p);
    EXPECT_TRUE(names.insert(module_uri(p)).second) << module_uri(p);
  };
  vary([](auto& p) { p.head_dim = 64; });
  vary([](auto& p) { p.group_size = 5; });
  vary([](auto& p) { p.kv_dtype = DType::bf16; });
  vary([](auto& p) { p.layout = KvLayout::paged; });
  vary([](auto& p) { p.layout = KvLayout::paged; p.page_size = 32; });
  vary([](auto& p) { p.tile = 64; });
  vary([](auto& p) { p.warps = 8; });
  vary([](auto& p) { p.splits = 8; });
  vary([](auto& p) { p.vec = 4; });
  vary([](auto& p) { p.stages = 3; });
  vary([](auto& p) { p.arch = "sm_80"; });
  // Deterministic: same parameters, same name and text.
  EXPECT_EQ(generate_module(base).source, generate_module(base).source);
  const GeneratedModule g = generate_module(base);
  EXPECT_NE(g.source.find("extern \"C\" __global__ void __launch_bounds__(128)\n" + g.module.name + "_partial("),
            std::string::npos);
}

TEST(CudaDiagnostics, EachBadSpecialisationIsRejectedWithItsReason) {
  struct Bad {
    std::function<void(DecodeAttentionParams&)> edit;
    std::string text;
  };
  const std::vector<Bad> cases = {
      {[](auto& p) { p.head_dim = 96; }, "head_dim 96 is not supported (expected 64, 128 or 256)"},
      {[](auto& p) { p.group_size = 0; }, "GQA group size 0 is not supported (expected 1..64"},
      {[](auto& p) { p.group_size = 65; }, "GQA group size 65 is not supported"},
      {[](auto& p) { p.kv_dtype = DType::f32; }, "KV dtype f32 is not supported"},
      {[](auto& p) { p.arch = "sm_61"; }, "unknown GPU arch 'sm_61'"},
      {[](auto& p) { p.warps = 3; }, "cuda.warps=3 (expected 1, 2, 4 or 8)"},
      {[](auto& p) { p.vec = 16; }, "cuda.vec=16 (expected 2, 4 or 8"},
      {[](auto& p) { p.splits = 0; }, "cuda.splits=0 (expected 1..64)"},
      {[](auto& p) { p.stages = 5; }, "cuda.stages=5 (expected 1..4)"},
      {[](auto& p) { p.tile = 48; }, "cuda.tile=48 (expected a power of two in 8..256)"},
      {[](auto& p) { p.layout = KvLayout::paged; p.page_size = 12; }, "page size 12"},
      {[](auto& p) { p.warps = 8; p.tile = 8; }, "cuda.tile=8 must be a multiple of the tokens a block reads at once (16"},
      {[](auto& p) { p.warps = 1; p.vec = 8; p.head_dim = 64; p.group_size = 8; p.tile = 256; },
       "scores in registers (more than 256)"},
      {[](auto& p) { p.head_dim = 256; p.tile = 256; p.stages = 4; p.warps = 8; p.arch = "sm_86"; },
       "bytes of shared memory but sm_86 allows"},
  };
  for (const auto& c : cases) {
    DecodeAttentionParams p = llama_params();
    c.edit(p);
    Status st = Status::ok;
    const std::string msg = error_of([&] { lower_decode_attention(p); }, &st);
    EXPECT_NE(msg.find(c.text), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind("cuda codegen: error: ", 0), 0u) << msg;
    EXPECT_EQ(st, Status::invalid_argument);
  }
}

TEST(CudaDiagnostics, PlanKnobsAreReadAndCheckedFromTheKernelMap) {
  ModelLayout model;
  model.head_dim = 128;
  model.num_q_heads = 32;
  model.num_kv_heads = 8;
  ConcretePlan plan;
  plan.kernel = {{"cuda.splits", 8}, {"cuda.warps", 8}, {"halide.vector", 16}};
  const KernelModule m = lower_decode_attention(model, plan, LowerOptions{});
  EXPECT_EQ(m.params.splits, 8);
  EXPECT_EQ(m.params.warps, 8);
  EXPECT_EQ(m.params.group_size, 4);
  plan.kernel = {{"cuda.tiles", 8}};
  EXPECT_NE(error_of([&] { lower_decode_attention(model, plan, LowerOptions{}); }).find("unknown knob 'cuda.tiles'"),
            std::string::npos);
  plan.kernel = {{"cuda.splits", 2.5}};
  EXPECT_NE(error_of([&] { lower_decode_attention(model, plan, LowerOptions{}); }).find("must be an integer"),
            std::string::npos);
  model.num_kv_heads = 0;
  plan.kernel.clear();
  EXPECT_NE(error_of([&] { lower_decode_attention(model, plan, LowerOptions{}); }).find("group size 0"),
            std::string::npos);
}

// ---- NVRTC ------------------------------------------------------------------

TEST(CudaNvrtc, CompilesToPtxAndCubinForEachArch) {
  const GeneratedModule g = generate_module(llama_params());
  for (const std::string arch : {"sm_80", "sm_86", "sm_89", "sm_90"}) {
    CompileOptions o;
    o.arch = arch;
    const CompiledModule c = nvrtc_compile(g.module.name, g.source, o);
    EXPECT_EQ(c.cubin.compare(0, 4, "\x7f" "ELF"), 0) << arch;
    EXPECT_NE(c.ptx.find(".entry " + g.module.name + "_partial"), std::string::npos) << arch;
    EXPECT_NE(c.ptx.find(".entry " + g.module.name + "_merge"), std::string::npos) << arch;
    EXPECT_NE(c.ptx.find(".target " + arch), std::string::npos) << arch;
    // cp.async is used on sm_80+.
    EXPECT_NE(c.ptx.find("cp.async"), std::string::npos) << arch;
  }
}

TEST(CudaNvrtc, BadTextAndBadArchAreErrorsWithTheLog) {
  CompileOptions o;
  const std::string msg = error_of([&] { nvrtc_compile("broken", "extern \"C\" __global__ void k() { nope; }", o); });
  EXPECT_NE(msg.find("does not compile for sm_90"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nope"), std::string::npos) << msg;
  o.arch = "sm_1";
  EXPECT_NE(error_of([&] { nvrtc_compile("k", "extern \"C\" __global__ void k() {}", o); }).find("nvrtc: k"),
            std::string::npos);
}

// ---- the disk cache ---------------------------------------------------------

TEST(CudaCache, MissCompilesHitLoadsAndCorruptEntriesAreRebuilt) {
  TempDir dir;
  KernelCache cache(dir.path.string());
  const GeneratedModule g = generate_module(llama_params());
  CompileOptions o;
  const CompiledModule first = cache.get_or_compile(g.module.name, g.source, o);
  EXPECT_FALSE(first.from_cache);
  const std::string entry = cache.entry_path(g.module.name, g.source, o);
  EXPECT_EQ(first.cache_path, entry);
  EXPECT_EQ(fs::path(entry).parent_path().filename(), g.module.name);  // the URI is the folder
  const CompiledModule second = cache.get_or_compile(g.module.name, g.source, o);
  EXPECT_TRUE(second.from_cache);
  EXPECT_EQ(second.cubin, first.cubin);
  EXPECT_EQ(second.ptx, first.ptx);
  // Other options or another text are other entries.
  o.arch = "sm_80";
  EXPECT_NE(cache.entry_path(g.module.name, g.source, o), entry);
  EXPECT_NE(cache.entry_path(g.module.name, g.source + " ", CompileOptions{}), entry);
  // A damaged entry is not trusted: it is rebuilt.
  std::string bytes = read_file(entry);
  bytes[bytes.size() / 2] ^= 0x55;
  write_file_atomic(entry, bytes);
  CompiledModule probe;
  EXPECT_FALSE(cache.lookup(g.module.name, g.source, CompileOptions{}, &probe));
  const CompiledModule rebuilt = cache.get_or_compile(g.module.name, g.source, CompileOptions{});
  EXPECT_FALSE(rebuilt.from_cache);
  EXPECT_TRUE(cache.lookup(g.module.name, g.source, CompileOptions{}, &probe));
}

TEST(CudaCache, DisabledJitMakesAMissAnErrorButServesHits) {
  TempDir dir;
  KernelCache cache(dir.path.string());
  const GeneratedModule g = generate_module(llama_params());
  {
    ScopedEnv env("RATTN_DISABLE_JIT", "1");
    Status st = Status::ok;
    const std::string msg = error_of([&] { cache.get_or_compile(g.module.name, g.source, CompileOptions{}); }, &st);
    EXPECT_EQ(st, Status::not_found) << msg;
    EXPECT_NE(msg.find("RATTN_DISABLE_JIT"), std::string::npos) << msg;
  }
  cache.get_or_compile(g.module.name, g.source, CompileOptions{});
  ScopedEnv env("RATTN_DISABLE_JIT", "1");
  EXPECT_TRUE(cache.get_or_compile(g.module.name, g.source, CompileOptions{}).from_cache);
}

TEST(CudaCache, TwoProcessesCompilingTheSameKernelBothSucceedAndLeaveOneEntry) {
  TempDir dir;
  DecodeAttentionParams p = llama_params();
  p.group_size = 3;  // not built by other tests in this process
  const GeneratedModule g = generate_module(p);
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < 2; ++i) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 0) ::_exit(3);  // released together when the pipe closes
      try {
        KernelCache cache(dir.path.string());
        const CompiledModule m = cache.get_or_compile(g.module.name, g.source, CompileOptions{});
        ::_exit(m.from_cache ? 11 : 10);
      } catch (...) {
        ::_exit(1);
      }
    }
    kids.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);  // start both
  std::vector<int> codes;
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    codes.push_back(WEXITSTATUS(status));
  }
  std::sort(codes.begin(), codes.end());
  EXPECT_EQ(codes, (std::vector<int>{10, 11})) << "exactly one process compiles, the other loads its entry";
  int entries = 0, others = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir.path)) {
    if (!f.is_regular_file()) continue;
    const std::string ext = f.path().extension().string();
    if (ext == ".bin") ++entries;
    else if (ext != ".lock") ++others;
  }
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(others, 0) << "temporary files left behind";
  KernelCache cache(dir.path.string());
  CompiledModule m;
  ASSERT_TRUE(cache.lookup(g.module.name, g.source, CompileOptions{}, &m));
  EXPECT_EQ(m.cubin.compare(0, 4, "\x7f" "ELF"), 0);
}

// ---- every model in models/ -------------------------------------------------

class ModelKernels : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelKernels, EveryModelCompilesToCubin) {
  const std::string arch = GetParam();
  const char* src = std::getenv("RATTN_SOURCE_DIR");
  const fs::path models = fs::path(src ? src : RATTN_SOURCE_DIR) / "models";
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(models))
    if (f.path().extension() == ".ra") files.push_back(f.path());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "no models in " << models;
  TempDir dir;
  KernelCache cache(dir.path.string());
  CompileOptions o;
  o.arch = arch;
  const auto t0 = std::chrono::steady_clock::now();
  // Every model's modules; models sharing a specialisation share its module.
  std::vector<GeneratedModule> all;
  std::set<std::string> names;
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    const Program program = load_program(f.string());
    auto modules = generate_model_kernels(program, default_concrete_plan(program.plan), arch, 16);
    ASSERT_EQ(modules.size(), 2u);
    for (auto& g : modules)
      if (names.insert(g.module.name).second) all.push_back(std::move(g));
  }
  int compiled = 0;
  const auto results = compile_modules(cache, all, o);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(results[i].cubin.compare(0, 4, "\x7f" "ELF"), 0) << all[i].module.name;
    EXPECT_NE(results[i].ptx.find(".entry " + all[i].module.name + "_partial"), std::string::npos);
    compiled += !results[i].from_cache;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("models", int(files.size()));
  RecordProperty("distinct_modules_compiled", compiled);
  RecordProperty("seconds", std::to_string(s));
  std::printf("%zu models, %d distinct modules compiled for %s in %.2f s\n", files.size(), compiled,
              arch.c_str(), s);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelKernels, ::testing::Values("sm_80", "sm_89", "sm_90"));

// ---- GPU loader -------------------------------------------------------------

// Relative errors of a GPU result for one query against float64 attention
// over fp16 rows [0, rows) of k/v ([rows, d]): |lse - ref| / max(1, |ref|)
// and max |out - ref| / max |ref|.
struct GpuError {
  double lse, out;
};
GpuError error_against_float64(const float* q, const uint16_t* k, const uint16_t* v, int64_t rows, int d,
                               const float* out, float lse, DType dtype = DType::f16) {
  std::vector<float> kf(size_t(rows) * size_t(d)), vf(kf.size());
  for (size_t i = 0; i < kf.size(); ++i) {
    kf[i] = dtype == DType::bf16 ? bf16_to_f32(k[i]) : f16_to_f32(k[i]);
    vf[i] = dtype == DType::bf16 ? bf16_to_f32(v[i]) : f16_to_f32(v[i]);
  }
  std::vector<double> ref(static_cast<size_t>(d));
  double ref_lse = 0;
  rattn::testing::reference_attention(q, kf.data(), vf.data(), rows, d, ref.data(), &ref_lse);
  double scale = 0, err = 0;
  for (int x = 0; x < d; ++x) {
    scale = std::max(scale, std::fabs(ref[size_t(x)]));
    err = std::max(err, std::fabs(out[x] - ref[size_t(x)]));
  }
  return {std::fabs(lse - ref_lse) / std::max(1.0, std::fabs(ref_lse)), err / scale};
}

// The backend for a spec, compiled into `dir` (a fresh NVRTC cache); splits 0
// keeps the generator's default.
std::unique_ptr<GpuAttention> open_for_test(int head_dim, int group, DType dtype, const TempDir& dir, int splits = 0) {
  KernelSpec spec;
  spec.head_dim = head_dim;
  spec.group_size = group;
  spec.kv_dtype = dtype;
  GpuAttentionOptions o;
  o.cache_dir = dir.path.string();
  if (splits) o.knobs["cuda.splits"] = splits;
  return open_gpu_attention(spec, o);
}

// A static set on the host as the backend takes it: per head, `capacity`
// rows of N(0, 1) values in fp16 or bf16.
struct HostSet {
  int heads, d;
  DType dtype;
  std::vector<std::vector<uint16_t>> k, v;
  HostSet(int heads_, int64_t capacity, int d_, DType dtype_, std::mt19937& rng)
      : heads(heads_), d(d_), dtype(dtype_), k(size_t(heads_), std::vector<uint16_t>(size_t(capacity) * size_t(d_))),
        v(k) {
    for (int h = 0; h < heads; ++h)
      for (int64_t r = 0; r < capacity; ++r) fill_row(h, r, rng);
  }
  void fill_row(int h, int64_t row, std::mt19937& rng) {
    std::normal_distribution<float> nd;
    for (int x = 0; x < d; ++x) {
      k[size_t(h)][size_t(row * d + x)] = half(nd(rng));
      v[size_t(h)][size_t(row * d + x)] = half(nd(rng));
    }
  }
  uint16_t half(float x) const { return dtype == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x); }
  // Views of rows [0, rows) of every head's keys (values).
  std::vector<RowsView> keys(int64_t rows) const { return views(k, rows); }
  std::vector<RowsView> values(int64_t rows) const { return views(v, rows); }
  void upload(GpuAttention& gpu, int64_t rows, int64_t capacity) const {
    const std::vector<RowsView> kv = keys(rows), vv = values(rows);
    gpu.upload_static_set(heads, kv.data(), vv.data(), capacity);
  }
  // The worst errors, over every head and query of `group`, of a GPU result
  // against float64 attention over rows [0, rows).
  GpuError worst_error(int group, int64_t rows, const std::vector<float>& q, const std::vector<float>& out,
                       const std::vector<float>& lse) const {
    GpuError worst{0, 0};
    for (int h = 0; h < heads; ++h)
      for (int g = 0; g < group; ++g) {
        const size_t qi = size_t(h * group + g);
        const GpuError e = error_against_float64(q.data() + qi * size_t(d), k[size_t(h)].data(), v[size_t(h)].data(),
                                                 rows, d, out.data() + qi * size_t(d), lse[qi], dtype);
        worst = {std::max(worst.lse, e.lse), std::max(worst.out, e.out)};
      }
    return worst;
  }

 private:
  std::vector<RowsView> views(const std::vector<std::vector<uint16_t>>& x, int64_t rows) const {
    std::vector<RowsView> out;
    for (const auto& h : x) out.push_back({h.data(), dtype, rows, d});
    return out;
  }
};

// Queries of `heads` x `group` heads, N(0, scale^2).
std::vector<float> random_queries(int heads, int group, int d, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(heads) * size_t(group) * size_t(d));
  for (auto& x : q) x = scale * nd(rng);
  return q;
}

// The split count the runtime picks for a static set (when the plan names
// none): 4 to 64 (the generator's range), more for longer sets, fewer for
// more heads (their blocks fill the GPU together), the generator accepts
// every value, and the points measured best on an H100 (docs/performance.md).
TEST(GpuOptions, StaticSetSplitsFollowTheSetAndTheHeads) {
  ModelLayout model;
  model.head_dim = 128;
  model.num_kv_heads = 1;
  model.num_q_heads = 4;
  model.kv_dtype = DType::f16;
  const std::vector<int64_t> sizes = {1, 640, 4224, 16512, 131072, int64_t(1) << 24};
  for (int heads : {1, 2, 8, 64}) {
    int previous = 0;
    for (int64_t rows : sizes) {
      const int splits = static_set_splits(rows, heads);
      EXPECT_GE(splits, std::max(previous, 4)) << rows << " rows, " << heads << " heads";
      EXPECT_LE(splits, 64) << rows;
      if (heads > 1) {
        EXPECT_LE(splits, static_set_splits(rows, heads / 2)) << rows << " rows, " << heads << " heads";
      }
      previous = splits;
      ConcretePlan plan;
      plan.kernel["cuda.splits"] = splits;
      EXPECT_NO_THROW(lower_decode_attention(model, plan, LowerOptions{})) << rows;
    }
  }
  EXPECT_EQ(static_set_splits(640, 8), 4);       // 27.3 us; 8 splits 26.5, 32 splits 41.7
  EXPECT_EQ(static_set_splits(4224, 8), 17);     // 16 splits 41.2 us; 4 splits 70.2
  EXPECT_EQ(static_set_splits(131072, 8), 33);   // 32 splits 343 us; 4 splits 1594
  EXPECT_EQ(static_set_splits(131072, 1), 64);   // 137 us; 32 splits 223
}

TEST(CudaGpu, WithoutAGpuOpenReturnsNullAndSaysWhy) {
  std::string why;
  if (gpu_present(&why)) GTEST_SKIP() << "a GPU is present; the no-GPU path is not exercised";
  EXPECT_FALSE(why.empty());
  std::string why2;
  EXPECT_EQ(open_gpu_attention(KernelSpec{}, {}, &why2), nullptr);
  EXPECT_EQ(why2, why);
}

TEST(CudaGpu, PartialAttentionOnTheGpuMatchesFloat64) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  for (int group : {1, 4, 5, 8}) {
    TempDir dir;
    auto gpu = open_for_test(128, group, DType::f16, dir);
    ASSERT_NE(gpu, nullptr);
    const int heads = 2, rows = 640;
    std::mt19937 rng(7 + group);
    const HostSet set(heads, rows, 128, DType::f16, rng);
    set.upload(*gpu, rows, rows);
    const std::vector<float> q = random_queries(heads, group, 128, rng);
    std::vector<float> out(q.size()), lse(size_t(heads * group));
    gpu->partial_attention(q.data(), out.data(), lse.data());
    const GpuError e = set.worst_error(group, rows, q, out, lse);
    EXPECT_LE(e.lse, 3e-3) << "group " << group;
    EXPECT_LE(e.out, 3e-3) << "group " << group;
  }
}

// Every shape the generator covers, on the GPU: head dims 64 / 128 / 256,
// fp16 and bf16 rows, groups 1, 3, 4, 5 (Qwen3-14B), 7 (Qwen2.5-7B), 8, 12
// and 16 (GLM-4-9B),
// the default split count and 1 and 7 (a
// split boundary inside a tile), over sets of 1, 37, 640 and 3001 rows (tile
// and split tails) - against float64. An empty set gives out 0, lse -inf.
TEST(CudaGpu, EveryShapeMatchesFloat64) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  TempDir dir;
  std::mt19937 rng(17);
  int modules = 0;
  for (int D : {64, 128, 256})
    for (DType dtype : {DType::f16, DType::bf16})
      for (int group : {1, 3, 4, 5, 7, 8, 12, 16})
        for (int splits : {0, 1, 7}) {
          const std::string what = "d " + std::to_string(D) + " " + dtype_name(dtype) + " group " +
                                   std::to_string(group) + " splits " + std::to_string(splits);
          SCOPED_TRACE(what);
          auto gpu = open_for_test(D, group, dtype, dir, splits);
          ASSERT_NE(gpu, nullptr);
          ++modules;
          const int heads = 2;
          for (int64_t rows : {int64_t(0), int64_t(1), int64_t(37), int64_t(640), int64_t(3001)}) {
            if (rows == 3001 && (group == 3 || splits == 1)) continue;  // keeps the sweep short
            const HostSet set(heads, rows, D, dtype, rng);
            set.upload(*gpu, rows, std::max<int64_t>(rows, 1));
            const std::vector<float> q = random_queries(heads, group, D, rng, 2.0f);  // sharp: errors in the max show
            std::vector<float> out(q.size(), 7.0f), lse(size_t(heads * group));
            gpu->partial_attention(q.data(), out.data(), lse.data());
            if (rows == 0) {
              for (const float l : lse) EXPECT_TRUE(std::isinf(l) && l < 0) << l;
              for (const float x : out) ASSERT_EQ(x, 0.0f);
              continue;
            }
            const GpuError e = set.worst_error(group, rows, q, out, lse);
            EXPECT_LE(e.out, 3e-3) << "rows " << rows;
            EXPECT_LE(e.lse, 3e-3) << "rows " << rows;
          }
        }
  EXPECT_EQ(modules, 3 * 2 * 8 * 3);
}

// Streams of the same kernels share one loaded module: a stream keeps
// working after the others are gone (the module stays loaded while one
// holds it), and a stream opened after all were closed loads it again.
TEST(CudaGpu, StreamsShareOneModuleAndOutliveEachOther) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  TempDir dir;
  const int heads = 1, rows = 50, D = 64, G = 2;
  std::mt19937 rng(23);
  const HostSet set(heads, rows, D, DType::f16, rng);
  const std::vector<float> q = random_queries(heads, G, D, rng);
  std::vector<float> out(q.size()), lse(size_t(heads * G));
  auto check_stream = [&](GpuAttention& gpu, const char* what) {
    set.upload(gpu, rows, rows);
    gpu.partial_attention(q.data(), out.data(), lse.data());
    const GpuError e = set.worst_error(G, rows, q, out, lse);
    EXPECT_LE(std::max(e.out, e.lse), 3e-3) << what;
  };
  std::vector<std::unique_ptr<GpuAttention>> streams;
  for (int i = 0; i < 16; ++i) streams.push_back(open_for_test(D, G, DType::f16, dir));
  for (auto& s : streams) ASSERT_NE(s, nullptr);
  check_stream(*streams[0], "first");
  streams.erase(streams.begin(), streams.end() - 1);  // all but the last closed
  check_stream(*streams[0], "the last one left");
  streams.clear();
  auto again = open_for_test(D, G, DType::f16, dir);
  ASSERT_NE(again, nullptr);
  check_stream(*again, "reopened");
}

// The static set as the runtime keeps it on the GPU: uploaded once with room
// for sinks + window rows, then one row per head written per decode step
// (sinks and window filling up, then the window as a ring, each new token
// overwriting the oldest). After every step the GPU's partial attention must
// match float64 attention over the host's copy of the set.
TEST(CudaGpu, StaticSetUpdatedInPlaceMatchesFloat64) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  TempDir dir;
  const int heads = 3, D = 128, G = 4;
  auto gpu = open_for_test(D, G, DType::f16, dir);
  ASSERT_NE(gpu, nullptr);
  const int64_t sinks = 8, window = 56, capacity = sinks + window, prompt = 5;
  std::mt19937 rng(11);
  // Host copy of the set; rows [0, filled) live.
  HostSet set(heads, capacity, D, DType::f16, rng);
  int64_t filled = prompt;
  set.upload(*gpu, filled, capacity);
  EXPECT_EQ(gpu->rows(), prompt);

  auto check_against_host = [&](int step) {
    const std::vector<float> q = random_queries(heads, G, D, rng);
    std::vector<float> out(q.size()), lse(size_t(heads * G));
    gpu->partial_attention(q.data(), out.data(), lse.data());
    const GpuError e = set.worst_error(G, filled, q, out, lse);
    EXPECT_LE(e.lse, 3e-3) << "step " << step;
    EXPECT_LE(e.out, 3e-3) << "step " << step;
  };
  check_against_host(-1);

  // Steps as the runtime takes them: sinks fill, then the window, then the
  // ring wraps twice and a bit.
  int64_t sinks_filled = std::min(prompt, sinks), window_filled = prompt - sinks_filled, ring_head = 0;
  std::vector<const void*> krow(heads), vrow(heads);
  for (int step = 0; step < int(capacity + 2 * window + 7); ++step) {
    int64_t slot;
    if (sinks_filled < sinks) {
      slot = sinks_filled++;
    } else if (window_filled < window) {
      slot = sinks + window_filled++;
    } else {
      slot = sinks + ring_head;
      ring_head = (ring_head + 1) % window;
    }
    ASSERT_LE(slot, filled);
    for (int h = 0; h < heads; ++h) {
      set.fill_row(h, slot, rng);
      krow[size_t(h)] = set.k[size_t(h)].data() + size_t(slot * D);
      vrow[size_t(h)] = set.v[size_t(h)].data() + size_t(slot * D);
    }
    gpu->update_static_row(slot, krow.data(), vrow.data());
    filled = std::max(filled, slot + 1);
    ASSERT_EQ(gpu->rows(), filled);
    if (step % 5 == 0 || step > int(capacity + 2 * window)) check_against_host(step);
  }
  EXPECT_EQ(filled, capacity);
  // Rows outside the set are refused with a message, not written.
  EXPECT_THROW(gpu->update_static_row(capacity, krow.data(), vrow.data()), Error);
  EXPECT_THROW(gpu->update_static_row(-1, krow.data(), vrow.data()), Error);
  set.upload(*gpu, prompt, prompt);  // a smaller set: no room to append
  EXPECT_EQ(gpu->rows(), prompt);
  EXPECT_THROW(gpu->update_static_row(prompt, krow.data(), vrow.data()), Error);
  EXPECT_THROW(set.upload(*gpu, prompt, prompt - 1), Error);
}

// The step's split form: begin queues the work and returns, finish waits.
// A row written between them (the next step's token) is queued behind the
// attention, so that attention sees the set as it was at begin; the next one
// sees the row. A begin left without its finish (an exception in the caller)
// is waited for by the next begin; a finish without a begin is refused.
TEST(CudaGpu, BeginFinishMatchesFloat64AndOrdersRowUpdates) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << "no GPU: " << why;
  TempDir dir;
  const int heads = 2, D = 128, G = 4;
  auto gpu = open_for_test(D, G, DType::f16, dir);
  ASSERT_NE(gpu, nullptr);
  const int64_t capacity = 300, prompt = 250;
  std::mt19937 rng(5);
  HostSet set(heads, capacity, D, DType::f16, rng);
  auto& k = set.k;
  auto& v = set.v;
  set.upload(*gpu, prompt, capacity);
  auto random_queries = [&] { return rattn::cuda::random_queries(heads, G, D, rng, 3.0f); };  // peaked: a changed row shows
  // Worst error of (out, lse) against float64 attention over the host's rows [0, rows) of every head.
  auto worst_error = [&](const std::vector<float>& q, const std::vector<float>& out, const std::vector<float>& lse,
                         int64_t rows) {
    const GpuError e = set.worst_error(G, rows, q, out, lse);
    return std::max(e.out, e.lse);
  };
  std::vector<float> out(size_t(heads * G * D)), lse(size_t(heads * G));
  const std::vector<float> q1 = random_queries();
  gpu->begin_partial_attention(q1.data());
  // The host may change its copy of the set now: the row goes to the GPU
  // behind the queued attention. Row `prompt` is appended; row 7 replaced by
  // a key equal to a scaled query, so that the replaced row dominates q1's
  // attention if the update were applied early.
  const int64_t replaced = 7;
  std::vector<uint16_t> old_k7(k[0].begin() + replaced * D, k[0].begin() + (replaced + 1) * D);
  std::vector<uint16_t> old_v7(v[0].begin() + replaced * D, v[0].begin() + (replaced + 1) * D);
  for (int x = 0; x < D; ++x) {
    k[0][size_t(replaced * D + x)] = f32_to_f16(q1[size_t(x)]);
    v[0][size_t(replaced * D + x)] = f32_to_f16(10.0f);
  }
  std::vector<const void*> krow(heads), vrow(heads);
  for (int h = 0; h < heads; ++h) {
    krow[size_t(h)] = k[size_t(h)].data() + size_t(replaced * D);
    vrow[size_t(h)] = v[size_t(h)].data() + size_t(replaced * D);
  }
  gpu->update_static_row(replaced, krow.data(), vrow.data());
  for (int h = 0; h < heads; ++h) {
    krow[size_t(h)] = k[size_t(h)].data() + size_t(prompt * D);
    vrow[size_t(h)] = v[size_t(h)].data() + size_t(prompt * D);
  }
  gpu->update_static_row(prompt, krow.data(), vrow.data());
  gpu->finish_partial_attention(out.data(), lse.data());
  {  // q1 against the set as it was at begin: the old row 7, no row `prompt`
    std::vector<uint16_t> new_k7(k[0].begin() + replaced * D, k[0].begin() + (replaced + 1) * D);
    std::vector<uint16_t> new_v7(v[0].begin() + replaced * D, v[0].begin() + (replaced + 1) * D);
    std::copy(old_k7.begin(), old_k7.end(), k[0].begin() + replaced * D);
    std::copy(old_v7.begin(), old_v7.end(), v[0].begin() + replaced * D);
    EXPECT_LE(worst_error(q1, out, lse, prompt), 3e-3);
    std::copy(new_k7.begin(), new_k7.end(), k[0].begin() + replaced * D);
    std::copy(new_v7.begin(), new_v7.end(), v[0].begin() + replaced * D);
    // Against the updated set q1's answer is far off: the check can fail.
    EXPECT_GT(worst_error(q1, out, lse, prompt + 1), 1e-1);
  }
  // The next attention sees both rows.
  const std::vector<float> q2 = random_queries();
  gpu->partial_attention(q2.data(), out.data(), lse.data());
  EXPECT_EQ(gpu->rows(), prompt + 1);
  EXPECT_LE(worst_error(q2, out, lse, prompt + 1), 3e-3);
  // A begin without its finish, then a whole begin/finish: the second's answer.
  const std::vector<float> q3 = random_queries(), q4 = random_queries();
  gpu->begin_partial_attention(q3.data());
  gpu->begin_partial_attention(q4.data());
  gpu->finish_partial_attention(out.data(), lse.data());
  EXPECT_LE(worst_error(q4, out, lse, prompt + 1), 3e-3);
  EXPECT_THROW(gpu->finish_partial_attention(out.data(), lse.data()), Error);
  // A re-upload drops an unfinished begin.
  gpu->begin_partial_attention(q3.data());
  set.upload(*gpu, prompt, capacity);
  EXPECT_THROW(gpu->finish_partial_attention(out.data(), lse.data()), Error);
}

}  // namespace
}  // namespace rattn::cuda

// ---- the CLI entry point ----------------------------------------------------
namespace rattn::cuda {
namespace {

int run_emit(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return cli::emit_main(int(argv.size()), argv.data());  // the dispatcher, as `rattn emit` runs it
}

TEST(CudaEmitCommand, HelpDescribesTheOptions) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_emit({"emit", "--target", "cuda", "--help"}), 0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  for (const char* opt : {"--arch", "--ptx", "--cubin", "--print-ir-after-all", "--time", "--knob", "--layout"})
    EXPECT_NE(out.find(opt), std::string::npos) << opt;
}

TEST(CudaEmitCommand, TimeReportsColdCompileAndWarmLoadAsJson) {
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(run_emit({"emit", "--target", "cuda", "--synthetic", "--layout", "contiguous", "--knob",
                      "cuda.splits=1", "--time"}),
            0);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\"modules\": 1, \"compiled\": 1"), std::string::npos) << out;
  EXPECT_NE(out.find("\"cold_compile_s\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"warm_load_s\""), std::string::npos) << out;
}

}  // namespace
}  // namespace rattn::cuda
