// `rattn emit FILE.ra --target halide`: prints every Halide pipeline of the
// model's kernel set (definitions and loop nest, from Halide); optionally
// builds the AOT library.
#include <cstdio>
#include <cstring>
#include <string>

#include "codegen/halide/halide_kernels.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {

namespace {
const char* kUsage =
    "usage: rattn emit FILE.ra --target halide [--kernel NAME] [--aot DIR] [--halide-target T]\n"
    "  Prints each Halide pipeline of FILE's kernel set (specialised for the model's\n"
    "  head dim, GQA group size and KV dtype, scheduled from the plan's default\n"
    "  kernel.halide.* values) with its Funcs' definitions and its loop nest,\n"
    "  both as Halide holds them.\n"
    "  --kernel NAME       print only kernels whose name contains NAME\n"
    "  --aot DIR           also compile every kernel ahead of time into DIR\n"
    "                      (objects, C headers, librattn_kernels.a)\n"
    "  --halide-target T   Halide target for --aot (default host)\n";

[[noreturn]] void usage_error(const std::string& what) {
  usage_fail("rattn emit --target halide: error: " + what);
}
}  // namespace

int emit_halide_main(int argc, char** argv) {
  std::string file, filter, aot_dir, halide_target = "host";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) usage_error(std::string(flag) + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--kernel") {
      filter = value("--kernel");
    } else if (a == "--aot") {
      aot_dir = value("--aot");
    } else if (a == "--halide-target") {
      halide_target = value("--halide-target");
    } else if (!a.empty() && a[0] == '-') {
      usage_error("unknown option '" + a + "'");
    } else if (file.empty()) {
      file = a;
    } else {
      usage_error("more than one input file ('" + file + "' and '" + a + "')");
    }
  }
  if (file.empty()) usage_error("missing FILE.ra");
  const Program prog = load_program(file);
  KernelSpec spec;
  spec.head_dim = prog.model.head_dim;
  spec.group_size = prog.model.group_size();
  spec.kv_dtype = prog.model.kv_dtype;
  const HalideSchedule sched = HalideSchedule::from_plan(default_concrete_plan(prog.plan));
  std::printf("# model %s: head_dim %d, group %d, kv %s; %s\n", prog.model.name.c_str(), spec.head_dim,
              spec.group_size, dtype_name(spec.kv_dtype), halide_fingerprint().c_str());
  std::printf("# every lse is the natural logarithm; scores scaled by 1/sqrt(head_dim)\n");
  for (const auto& c : halide_kernel_configs(spec, sched)) {
    if (!filter.empty() && halide_kernel_name(c).find(filter) == std::string::npos) continue;
    std::printf("\n%s", describe_halide_kernel(c).c_str());
  }
  if (!aot_dir.empty()) {
    const auto files = compile_halide_kernels_aot(spec, sched, aot_dir, "rattn_kernels", halide_target);
    std::printf("\n# ahead-of-time build for %s:\n", halide_target.c_str());
    for (const auto& f : files) std::printf("#   %s\n", f.c_str());
  }
  return 0;
}

}  // namespace rattn::cli
