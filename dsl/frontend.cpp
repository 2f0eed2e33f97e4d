// parse_program / load_program: lexer -> parser -> semantic checks -> IR.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "dsl/ast.h"
#include "dsl/dsl.h"
#include "dsl/lexer.h"
#include "dsl/sema.h"

namespace rattn {

Program parse_program(std::string_view text, const std::string& filename) {
  const auto tokens = internal::tokenize(text, filename);
  const auto syntax = internal::parse_syntax(tokens, text, filename);
  return internal::check_and_lower(syntax, text, filename);
}

Program load_program(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(Status::io_error, path + ": error: is a directory, not a .ra file");
  // A FIFO or device would block the open below (or never end).
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    fail(Status::io_error, path + ": error: not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::io_error, path + ": error: cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(Status::io_error, path + ": error: cannot read the file");
  return parse_program(ss.str(), path);
}

}  // namespace rattn
