#pragma once
// Front end of the attention-layout language (*.ra): text -> checked IR.
#include <string>
#include <string_view>

#include "dsl/ir.h"

namespace rattn {

// Parses and checks `text`. On any error throws rattn::Error(Status::parse_error)
// whose message is "file:line:col: error: <what was expected>".
Program parse_program(std::string_view text, const std::string& filename);
// Reads and parses a file (io_error if it cannot be read).
Program load_program(const std::string& path);

}  // namespace rattn
