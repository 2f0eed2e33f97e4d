// rattn: one binary, one subcommand per job.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "tools/rattn/commands.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int, char**);
};

const Command kCommands[] = {
    {"inspect", "print a model's attention layout and memory plan", rattn::cli::inspect_main},
    {"emit", "print generated kernels (--target halide|cuda)", rattn::cli::emit_main},
    {"bench", "benchmarks: index, kernels, decode (JSON)", rattn::cli::bench_main},
    {"capture", "run a GGUF model over a text and write calibration data", rattn::cli::capture_main},
    {"eval", "accuracy of rattn against full attention on a real model", rattn::cli::eval_main},
    {"tune", "pick each layer's decode searches (and the index build knobs) on calibration data", rattn::cli::tune_main},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: rattn <command> [options]\n       rattn --version\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-9s %s\n", c.name, c.summary);
  std::fprintf(f,
               "\n`rattn <command> --help` describes each command.\n"
               "\nexit status: 0 ok, 1 error, 2 usage error (bad command line), 3 target not met\n"
               "(rattn tune).\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-V")) {
    std::printf("rattn %s\nHalide %s\nCUDA toolkit %s\ngit commit %s\n", RATTN_VERSION, RATTN_HALIDE_VERSION,
                RATTN_CUDA_VERSION, RATTN_GIT_COMMIT);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const rattn::UsageError& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    } catch (const rattn::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rattn %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "rattn: error: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
