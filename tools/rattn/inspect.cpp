// `rattn inspect FILE.ra [--context N] [--json]`
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_util.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "dsl/memory_plan.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {
namespace {

constexpr const char* kUsage =
    "usage: rattn inspect FILE.ra [--context N] [--json]\n"
    "\n"
    "Checks an attention-layout file (docs/dsl.md) and prints the model's layout\n"
    "and its memory plan at N tokens, per layer (identical layers grouped) and in\n"
    "total: KV bytes of the static set (sinks + window; on the GPU when the target\n"
    "has one), offloaded KV bytes and the index estimate on the CPU, what full\n"
    "attention would keep, and the number of indexes (global layers x query heads).\n"
    "Tunable plan parameters are shown by their defaults.\n"
    "\n"
    "options:\n"
    "  --context N   context length in tokens (default: the model's context)\n"
    "  --json        print one JSON object instead of the report\n"
    "  --help        this text\n";

[[noreturn]] void usage_error(const std::string& msg) {
  usage_fail("rattn inspect: error: " + msg + " (see rattn inspect --help)");
}

int64_t parse_tokens(const char* s) {
  if (!*s) usage_error("--context expects a token count, got ''");
  int64_t v = 0;
  for (const char* p = s; *p; ++p) {
    if (*p < '0' || *p > '9') usage_error(std::string("--context expects a token count, got '") + s + "'");
    if (v > (INT64_MAX - (*p - '0')) / 10) usage_error(std::string("--context value '") + s + "' is too large");
    v = v * 10 + (*p - '0');
  }
  if (v < 1) usage_error("--context must be at least 1");
  return v;
}

}  // namespace

int inspect_main(int argc, char** argv) {
  std::string file;
  int64_t context = 0;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!std::strcmp(a, "--help") || !std::strcmp(a, "-h")) {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!std::strcmp(a, "--json")) {
      json = true;
    } else if (!std::strcmp(a, "--context")) {
      if (i + 1 >= argc) usage_error("--context expects a token count");
      context = parse_tokens(argv[++i]);
    } else if (!std::strncmp(a, "--context=", 10)) {
      context = parse_tokens(a + 10);
    } else if (a[0] == '-' && a[1] != '\0') {
      usage_error(std::string("unknown option '") + a + "'");
    } else if (file.empty()) {
      file = a;
    } else {
      usage_error("expects one file, got '" + file + "' and '" + a + "'");
    }
  }
  if (file.empty()) usage_error("expects a FILE.ra");
  const Program program = load_program(file);
  if (context == 0) context = program.model.max_context;
  if (context > program.model.max_context)
    usage_error("--context " + std::to_string(context) + " exceeds the context of " + program.model.name + " (" +
                std::to_string(program.model.max_context) + ")");
  const MemoryPlan mem = plan_memory(program, context);
  if (json) std::fputs(bench::to_pretty_json(report_json(program, mem)).c_str(), stdout);
  else std::fputs(format_report(program, mem).c_str(), stdout);
  return 0;
}

}  // namespace rattn::cli
