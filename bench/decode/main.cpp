// Standalone `rattn bench decode` (bin/rattn-bench-decode): the same entry
// point as the CLI subcommand, built from the runtime alone so the decode
// bench does not need every other component's CLI to link.
#include <cstdio>
#include <exception>

#include "tools/rattn/commands.h"

int main(int argc, char** argv) {
  try {
    return rattn::cli::bench_decode_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
