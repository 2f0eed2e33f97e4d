// libFuzzer target: the DSL front end on arbitrary bytes, and the memory plan
// and the printed form of whatever parses. Any outcome other than a Program or a
// rattn::Error(parse_error) with a "fuzz.ra:L:C: error: " message is a bug
// (sanitizers catch the rest).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "dsl/dsl.h"
#include "dsl/memory_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const rattn::Program p = rattn::parse_program(text, "fuzz.ra");
    // A parsed program must be internally consistent.
    if (int(p.model.layers.size()) != p.model.num_layers) std::abort();
    if (p.model.num_kv_heads <= 0 || p.model.num_q_heads % p.model.num_kv_heads != 0) std::abort();
    (void)rattn::default_concrete_plan(p.plan);
    // Printed back to DSL (`rattn tune -o`), it parses and prints the same.
    const std::string printed = rattn::format_program(p);
    if (rattn::format_program(rattn::parse_program(printed, "printed.ra")) != printed) std::abort();
    // What `rattn inspect` does with it: only a checked 64-bit overflow may throw.
    try {
      const rattn::MemoryPlan m = rattn::plan_memory(p, p.model.max_context);
      if (rattn::format_report(p, m).empty()) std::abort();
      (void)rattn::report_json(p, m);
    } catch (const rattn::Error& e) {
      if (e.status() != rattn::Status::invalid_argument || !std::strstr(e.what(), "overflows")) {
        std::fprintf(stderr, "unexpected inspect error: %s\n", e.what());
        std::abort();
      }
    }
  } catch (const rattn::Error& e) {
    const char* prefix = "fuzz.ra:";
    if (e.status() != rattn::Status::parse_error || std::strncmp(e.what(), prefix, std::strlen(prefix)) != 0 ||
        !std::strstr(e.what(), ": error: ")) {
      std::fprintf(stderr, "bad diagnostic: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
