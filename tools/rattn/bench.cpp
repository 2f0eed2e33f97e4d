// `rattn bench index|kernels|decode ...`
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "tools/rattn/commands.h"

int rattn::cli::bench_main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::printf(
        "usage: rattn bench <index|kernels|decode> [options] [--json]\n"
        "  index    the attention-aware index against hnswlib, faiss IVF and exact search\n"
        "  kernels  CPU kernels against scalar loops and oneDNN\n"
        "  decode   the decode step against full attention\n"
        "`rattn bench <name> --help` lists each benchmark's options.\n");
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "index")) return bench_index_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "kernels")) return bench_kernels_main(argc - 1, argv + 1);
  if (!std::strcmp(argv[1], "decode")) return bench_decode_main(argc - 1, argv + 1);
  rattn::usage_fail(std::string("rattn bench: error: unknown benchmark '") + argv[1] +
                  "' (expected index, kernels or decode)");
}
