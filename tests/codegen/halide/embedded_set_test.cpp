// The deployable library's CPU dispatch: which embedded kernel set a CPU
// runs (by Halide target features), and the Halide cache's refusal to
// compile with RATTN_DISABLE_JIT set. The library end to end is
// tests/deploy/deploy_test.py.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "codegen/halide/halide_kernels.h"
#include "codegen/halide/kernel_cache.h"
#include "core/error.h"

namespace fs = std::filesystem;
using namespace rattn;
using namespace rattn::internal;

namespace {

const char* kAvx2 = "x86-64-linux-avx-avx2-f16c-fma-sse41";
const char* kSse41 = "x86-64-linux-sse41";

const embedded::KernelSet kSets[] = {
    {"host", "x86-64-linux-avx-avx2-f16c-fma-sse41", 8, nullptr, 0},
    {"baseline", "x86-64-linux-sse41", 4, nullptr, 0},
};

using Names = std::vector<std::string>;

}  // namespace

TEST(EmbeddedSet, MissingFeaturesAreTheTargetsFeaturesTheHostLacks) {
  EXPECT_EQ(missing_target_features(kAvx2, "x86-64-linux-avx-avx2-avx512-f16c-fma-sse41"), Names{});
  EXPECT_EQ(missing_target_features(kAvx2, kAvx2), Names{});
  EXPECT_EQ(missing_target_features(kAvx2, kSse41), (Names{"avx", "avx2", "f16c", "fma"}));
  EXPECT_EQ(missing_target_features(kSse41, "x86-64-linux"), Names{"sse41"});
  // Another architecture or OS: nothing of the set runs.
  EXPECT_EQ(missing_target_features(kSse41, "arm-64-linux-arm_dot_prod"), Names{"architecture x86-64-linux"});
  EXPECT_EQ(missing_target_features(kSse41, "x86-64-osx-sse41"), Names{"architecture x86-64-linux"});
}

TEST(EmbeddedSet, AutoTakesTheFirstSetThatRuns) {
  EmbeddedChoice c = choose_embedded_set(kSets, 2, "x86-64-linux-avx-avx2-avx512-f16c-fma-sse41", "auto");
  ASSERT_NE(c.set, nullptr);
  EXPECT_STREQ(c.set->label, "host");
  EXPECT_EQ(c.warning, "");
  // A CPU without AVX2: the baseline, saying what the host set needs.
  c = choose_embedded_set(kSets, 2, "x86-64-linux-sse41", "auto");
  ASSERT_NE(c.set, nullptr);
  EXPECT_STREQ(c.set->label, "baseline");
  EXPECT_NE(c.warning.find("missing avx, avx2, f16c, fma"), std::string::npos) << c.warning;
  // "host" is a preference, never a crash on a CPU lacking its features.
  c = choose_embedded_set(kSets, 2, "x86-64-linux-sse41", "host");
  ASSERT_NE(c.set, nullptr);
  EXPECT_STREQ(c.set->label, "baseline");
  EXPECT_FALSE(c.warning.empty());
}

TEST(EmbeddedSet, BaselineAndJitAreHonoured) {
  EmbeddedChoice c = choose_embedded_set(kSets, 2, kAvx2, "baseline");
  ASSERT_NE(c.set, nullptr);
  EXPECT_STREQ(c.set->label, "baseline");
  EXPECT_EQ(c.warning, "");
  c = choose_embedded_set(kSets, 2, kAvx2, "jit");
  EXPECT_EQ(c.set, nullptr);
  EXPECT_EQ(c.warning, "");
}

TEST(EmbeddedSet, UnknownPreferenceWarnsAndNothingRunsWarns) {
  EmbeddedChoice c = choose_embedded_set(kSets, 2, kAvx2, "fastest");
  ASSERT_NE(c.set, nullptr);
  EXPECT_STREQ(c.set->label, "host");
  EXPECT_NE(c.warning.find("RATTN_CPU_KERNELS=fastest"), std::string::npos) << c.warning;
  c = choose_embedded_set(kSets, 2, "arm-64-linux", "auto");
  EXPECT_EQ(c.set, nullptr);
  EXPECT_NE(c.warning.find("No embedded kernel set runs here"), std::string::npos) << c.warning;
  c = choose_embedded_set(nullptr, 0, kAvx2, "auto");
  EXPECT_EQ(c.set, nullptr);
  EXPECT_EQ(c.warning, "");
}

TEST(EmbeddedSet, PlainLibraryHasNoEmbeddedSet) {
  EXPECT_EQ(embedded::payload(), nullptr);
  EXPECT_EQ(embedded_kernel_set(), nullptr);
  EXPECT_EQ(embedded_kernel_set_name(), "");
  EXPECT_EQ(find_embedded_kernel("rattn_merge_d64_v8"), nullptr);
}

TEST(EmbeddedSet, DisabledJitRefusesToCompileAMissingKernel) {
  std::string tmpl = fs::temp_directory_path().string() + "/rattn-nojit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const char* old_cache = std::getenv("RATTN_CACHE_DIR");
  const std::string saved = old_cache ? old_cache : "";
  setenv("RATTN_CACHE_DIR", tmpl.c_str(), 1);
  setenv("RATTN_DISABLE_JIT", "1", 1);
  halide_clear_memory_cache();
  try {
    make_halide_kernel_set(KernelSpec{24, 3, DType::f16});
    ADD_FAILURE() << "compiled with RATTN_DISABLE_JIT set";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::not_found);
    EXPECT_NE(std::string(e.what()).find("RATTN_DISABLE_JIT is set"), std::string::npos) << e.what();
  }
  unsetenv("RATTN_DISABLE_JIT");
  if (old_cache) setenv("RATTN_CACHE_DIR", saved.c_str(), 1);
  else unsetenv("RATTN_CACHE_DIR");
  // Nothing was built there.
  int so = 0;
  for (auto& e : fs::directory_iterator(tmpl)) so += e.path().extension() == ".so";
  EXPECT_EQ(so, 0);
  std::error_code ec;
  fs::remove_all(tmpl, ec);
}
