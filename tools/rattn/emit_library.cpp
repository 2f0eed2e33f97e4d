// `rattn emit FILE.ra --target library -o OUT`: the deployable library
// (autotune/emit_library.h, docs/deploy.md).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "autotune/emit_library.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "dsl/dsl.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {

namespace {
const char* kUsage =
    "usage: rattn emit FILE.ra --target library -o OUT [--gpu sm_XX|none] [--name NAME]\n"
    "  Writes a shared library holding the rattn runtime (librattn's C API,\n"
    "  include/rattn.h), FILE's plan, its Halide kernels compiled for this CPU\n"
    "  and for a baseline x86-64 CPU, and its CUDA kernels as CUBIN + PTX:\n"
    "    OUT/lib/librattn_NAME.so, OUT/include/rattn.h,\n"
    "    OUT/lib/cmake/rattn_NAME/rattn_NAMEConfig.cmake, OUT/lib/pkgconfig/rattn_NAME.pc\n"
    "  A context created with no plan uses the embedded one; no compiler or JIT\n"
    "  is needed where the library runs (docs/deploy.md).\n"
    "  -o, --out OUT        output directory\n"
    "  --gpu ARCH           CUDA arch of the embedded CUBIN (default sm_90), or none\n"
    "  --name NAME          library name (default: the model's name), sanitised to [a-z0-9_]\n"
    "  --baseline-target T  Halide target of the portable kernel set (default x86-64-linux-sse41)\n"
    "  A progress bar goes to stderr (plain lines at most every 10 s when not a terminal).\n";

[[noreturn]] void usage_error(const std::string& what) {
  usage_fail("rattn emit --target library: error: " + what);
}
}  // namespace

int emit_library_main(int argc, char** argv) {
  std::string file;
  EmitLibraryOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) usage_error(std::string(flag) + " expects a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "-o" || a == "--out") {
      o.out_dir = value("-o");
    } else if (a == "--gpu") {
      o.gpu_arch = value("--gpu");
    } else if (a == "--name") {
      o.model_name = value("--name");
    } else if (a == "--baseline-target") {
      o.baseline_target = value("--baseline-target");
    } else if (!a.empty() && a[0] == '-') {
      usage_error("unknown option '" + a + "'");
    } else if (file.empty()) {
      file = a;
    } else {
      usage_error("more than one input file ('" + file + "' and '" + a + "')");
    }
  }
  if (file.empty()) usage_error("missing FILE.ra");
  if (o.out_dir.empty()) usage_error("missing -o OUT");
  if (!o.model_name.empty() && sanitise_model_name(o.model_name).empty())
    usage_error("--name '" + o.model_name + "' has no letters or digits");
  const Program prog = load_program(file);
  const std::string text = read_file(file);
  // The bar on stderr; the log lines go above it when both share a terminal.
  Progress bar("rattn emit", 1);
  const bool same_terminal = ::isatty(::fileno(stdout)) && ::isatty(::fileno(stderr));
  o.log = [&](const std::string& line) {
    if (same_terminal) bar.note(line);
    else std::printf("%s\n", line.c_str()), std::fflush(stdout);
  };
  o.progress = [&](double done, double total, const std::string& now) {
    bar.set_total(total);
    bar.advance(done - bar.done(), now);
  };
  std::printf("rattn emit: library for %s\n", prog.model.name.c_str());
  std::fflush(stdout);
  const EmitLibraryResult r = emit_deployable_library(prog, text, o);
  bar.finish(std::to_string(r.files.size()) + " files");
  std::printf("rattn emit: wrote %s\n", r.library.c_str());
  for (size_t i = 1; i < r.files.size(); ++i) std::printf("  %s\n", r.files[i].c_str());
  std::printf("  CPU kernel sets:");
  for (const auto& s : r.kernel_sets) std::printf(" %s;", s.c_str());
  std::printf("\n  GPU modules: %zu%s\n", r.gpu_modules.size(), o.gpu_arch == "none" ? " (--gpu none)" : "");
  return 0;
}

}  // namespace rattn::cli
