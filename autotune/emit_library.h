#pragma once
// The deployable library: one shared object holding the whole runtime (the C
// API of librattn, include/rattn.h), a plan, the plan's Halide kernels
// compiled ahead of time for this CPU and for a baseline x86-64 CPU, and its
// CUDA kernels as CUBIN + PTX. It needs no compiler and no JIT where it runs
// (docs/deploy.md).
//
//   OUT/lib/librattn_<model>.so
//   OUT/include/rattn.h, rattn.hpp
//   OUT/lib/cmake/rattn_<model>/rattn_<model>Config.cmake   (rattn_<model>::rattn_<model>)
//   OUT/lib/pkgconfig/rattn_<model>.pc                      (with an rpath)
//
// Emitting needs this machine's C++ compiler (c++, or $RATTN_CXX), NVRTC for
// the GPU kernels, and what the build recorded in <build>/lib/rattn_embed
// (found next to the running executable, or in $RATTN_LIB_DIR/rattn_embed).
#include <functional>
#include <string>
#include <vector>

#include "dsl/ir.h"

namespace rattn {

struct EmitLibraryOptions {
  std::string out_dir;     // created if missing; existing files are replaced
  std::string model_name;  // "" = the plan's model name; sanitised (sanitise_model_name)
  std::string gpu_arch = "sm_90";  // CUDA arch of the embedded CUBIN (sm_75 ... sm_120), or "none"
  std::string baseline_target = "x86-64-linux-sse41";  // Halide target of the portable kernel set
  std::function<void(const std::string&)> log;           // progress lines; may be empty
  // Progress (done, total, what runs now) in compiled kernels (a GPU module,
  // the payload and the link count one each); may be empty.
  std::function<void(double, double, const std::string&)> progress;
};

struct EmitLibraryResult {
  std::string model;    // the sanitised name
  std::string library;  // OUT/lib/librattn_<model>.so
  std::vector<std::string> files;          // every file written (library first)
  std::vector<std::string> kernel_sets;    // "host (TARGET)", "baseline (TARGET)"
  std::vector<std::string> gpu_modules;    // module URIs embedded
};

// Writes the library for `plan` (`plan_text` is the .ra text that parsed into
// it; the library embeds it and a context created without a plan uses it).
// Throws rattn::Error with a clear message: not_found when the runtime
// archive or the compiler is missing, invalid_argument for a bad name or arch.
EmitLibraryResult emit_deployable_library(const Program& plan, const std::string& plan_text,
                                          const EmitLibraryOptions& options);

// Lower case, every run of characters outside [a-z0-9] as one '_', no '_' at
// either end: "Llama-3-8B-Instruct (262K)" -> "llama_3_8b_instruct_262k".
std::string sanitise_model_name(const std::string& name);

}  // namespace rattn
