// `rattn emit FILE.ra --target halide|cuda|library ...`: hands over to the generator.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "tools/rattn/commands.h"

int rattn::cli::emit_main(int argc, char** argv) {
  std::string target;
  bool help = false;
  // The generator gets the arguments without --target: it parses only its own.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) help = true;
    if (!std::strcmp(argv[i], "--target") && i + 1 < argc) target = argv[++i];
    else if (!std::strncmp(argv[i], "--target=", 9)) target = argv[i] + 9;
    else rest.push_back(argv[i]);
  }
  const int n = int(rest.size());
  rest.push_back(nullptr);
  // Each generator documents its own options: `emit --target cuda --help`.
  if (target == "halide") return emit_halide_main(n, rest.data());
  if (target == "cuda") return emit_cuda_main(n, rest.data());
  if (target == "library") return emit_library_main(n, rest.data());
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
