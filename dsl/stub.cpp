// Placeholder until the DSL front end lands (issue 2).
#include "core/error.h"
#include "dsl/dsl.h"
#include "tools/rattn/commands.h"
namespace rattn {
Program parse_program(std::string_view, const std::string& filename) {
  fail(Status::unsupported, filename + ": the DSL parser is not built yet");
}
Program load_program(const std::string& path) { return parse_program({}, path); }
}  // namespace rattn
int rattn::cli::inspect_main(int, char**) { rattn::fail(rattn::Status::unsupported, "inspect: not built yet"); }
