// libFuzzer target: the DSL front end on arbitrary bytes. Any outcome other
// than a Program or a rattn::Error(parse_error) with a "fuzz.ra:L:C: error: "
// message is a bug (sanitizers catch the rest).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "dsl/dsl.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const rattn::Program p = rattn::parse_program(text, "fuzz.ra");
    // A parsed program must be internally consistent.
    if (int(p.model.layers.size()) != p.model.num_layers) std::abort();
    if (p.model.num_kv_heads <= 0 || p.model.num_q_heads % p.model.num_kv_heads != 0) std::abort();
    (void)rattn::default_concrete_plan(p.plan);
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
