#pragma once
// Front end of the attention-layout language (*.ra): text -> checked IR.
// The language is described in docs/dsl.md.
#include <cstddef>
#include <string>
#include <string_view>

#include "dsl/ir.h"

namespace rattn {

// The largest .ra text parse_program and load_program accept (also quoted in
// docs/dsl.md): a longer one is refused before it is read or lexed.
inline constexpr size_t kMaxSourceBytes = size_t(1) << 20;

// Parses and checks `text` (a leading UTF-8 byte order mark is skipped). On any error throws rattn::Error(Status::parse_error)
// whose message is "file:line:col: error: <what was expected>" (followed by the
// offending source line and a caret).
Program parse_program(std::string_view text, const std::string& filename);
// Reads and parses a file (io_error if it cannot be read).
Program load_program(const std::string& path);

// A domain as the DSL writes it: "128", "16..48 step 8", "16..256 step *2",
// "{1, 2, 4}", each with " default v" when one was chosen.
std::string format_domain(const ParamDomain& d);
// A number for people: whole numbers in full, others to six significant digits.
std::string format_number(double v);

// The program as DSL text that parses back to the same model, plan (the
// parameters that differ from the defaults, layer blocks included) and
// target: what `rattn tune` writes. Comments and the layout are not kept.
std::string format_program(const Program& program);

}  // namespace rattn
