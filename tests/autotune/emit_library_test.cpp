// emit_deployable_library's names and refusals (fast paths, no compile). The
// emitted library end to end is tests/deploy/deploy_test.py.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "autotune/emit_library.h"
#include "core/error.h"
#include "dsl/dsl.h"

namespace fs = std::filesystem;
using namespace rattn;

namespace {

const char* kPlan =
    "model \"Tiny\" { layers = 1; q_heads = 2; kv_heads = 1; head_dim = 64; kv_dtype = f16;"
    " rope_base = 10000; context = 1024; }\nplan { sinks = 4; window = 16; top_k = 16; }\n";

Status status_of(const std::function<void()>& f, std::string* what) {
  try {
    f();
  } catch (const Error& e) {
    *what = e.what();
    return e.status();
  }
  return Status::ok;
}

}  // namespace

TEST(EmitLibrary, SanitisesModelNames) {
  EXPECT_EQ(sanitise_model_name("Llama-3-8B-Instruct-262k"), "llama_3_8b_instruct_262k");
  EXPECT_EQ(sanitise_model_name("  Gemma-3 (270M)  "), "gemma_3_270m");
  EXPECT_EQ(sanitise_model_name("already_fine_9"), "already_fine_9");
  EXPECT_EQ(sanitise_model_name("--"), "");
  EXPECT_EQ(sanitise_model_name(""), "");
}

TEST(EmitLibrary, RefusesBadNamesArchsAndAMissingRuntime) {
  const Program prog = parse_program(kPlan, "tiny.ra");
  const std::string out = (fs::temp_directory_path() / ("rattn-emit-test-" + std::to_string(::getpid()))).string();
  EmitLibraryOptions o;
  o.out_dir = out;
  std::string what;

  o.model_name = "***";
  EXPECT_EQ(status_of([&] { emit_deployable_library(prog, kPlan, o); }, &what), Status::invalid_argument);
  EXPECT_NE(what.find("no letters or digits"), std::string::npos) << what;

  o.model_name = "";
  o.gpu_arch = "sm_1";
  EXPECT_EQ(status_of([&] { emit_deployable_library(prog, kPlan, o); }, &what), Status::invalid_argument);
  EXPECT_NE(what.find("GPU arch 'sm_1' is not one of"), std::string::npos) << what;

  // The embedded plan text must parse.
  o.gpu_arch = "none";
  EXPECT_NE(status_of([&] { emit_deployable_library(prog, "plan { top_k = ; }", o); }, &what), Status::ok);

  // No recorded runtime where RATTN_LIB_DIR points.
  const char* old = std::getenv("RATTN_LIB_DIR");
  const std::string saved = old ? old : "";
  setenv("RATTN_LIB_DIR", fs::temp_directory_path().c_str(), 1);
  EXPECT_EQ(status_of([&] { emit_deployable_library(prog, kPlan, o); }, &what), Status::not_found);
  EXPECT_NE(what.find("rattn_embed/link.txt is missing"), std::string::npos) << what;
  if (old) setenv("RATTN_LIB_DIR", saved.c_str(), 1);
  else unsetenv("RATTN_LIB_DIR");
  EXPECT_FALSE(fs::exists(out + "/lib/librattn_tiny.so"));
  std::error_code ec;
  fs::remove_all(out, ec);
}
