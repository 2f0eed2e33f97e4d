// parse_program / load_program: lexer -> parser -> semantic checks -> IR.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "dsl/ast.h"
#include "dsl/dsl.h"
#include "dsl/lexer.h"
#include "dsl/sema.h"

namespace rattn {

namespace {

// A UTF-8 byte order mark some editors write first; it is no part of the text.
constexpr std::string_view kBom = "\xEF\xBB\xBF";

[[noreturn]] void too_large(const std::string& filename, uintmax_t bytes) {
  internal::fail_at(filename, {}, internal::Loc{1, 1},
                    "the file is " + std::to_string(bytes) + " bytes; a .ra file may have at most " +
                        std::to_string(kMaxSourceBytes) + " (1 MiB)");
}

}  // namespace

Program parse_program(std::string_view text, const std::string& filename) {
  // Refused before lexing: every later stage is then bounded by the cap.
  if (text.size() > kMaxSourceBytes) too_large(filename, text.size());
  if (text.substr(0, kBom.size()) == kBom) text.remove_prefix(kBom.size());
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
  // A regular file too large is refused without reading it.
  if (std::filesystem::is_regular_file(path, ec)) {
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxSourceBytes) too_large(path, size);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::io_error, path + ": error: cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(Status::io_error, path + ": error: cannot read the file");
  return parse_program(ss.str(), path);
}

}  // namespace rattn
