// `rattn emit FILE.ra --target halide|cuda|library ...`: hands over to the generator.
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "tools/rattn/commands.h"

int rattn::cli::emit_main(int argc, char** argv) {
  std::string target;
  bool help = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) help = true;
    else if (!std::strcmp(argv[i], "--target") && i + 1 < argc) target = argv[i + 1];
    else if (!std::strncmp(argv[i], "--target=", 9)) target = argv[i] + 9;
  }
  // Each generator documents its own options: `emit --target cuda --help`.
  if (target == "halide") return emit_halide_main(argc, argv);
  if (target == "cuda") return emit_cuda_main(argc, argv);
  if (target == "library") return emit_library_main(argc, argv);
  if (help) {
    std::printf(
        "usage: rattn emit FILE.ra --target halide|cuda|library [options]\n"
        "  --target halide   print each Halide pipeline and its schedule (see --target halide --help)\n"
        "  --target cuda     print the CUDA C++ kernels (see --target cuda --help)\n"
        "  --target library  write a deployable shared library (see --target library --help)\n");
    return 0;
  }
  rattn::usage_fail("rattn emit: error: --target must be 'halide', 'cuda' or 'library'" +
                  (target.empty() ? std::string(" (missing)") : " (got '" + target + "')"));
}
