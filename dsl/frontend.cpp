// parse_program / load_program: lexer -> parser -> semantic checks -> IR.
#include <cmath>
#include <cstdio>
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
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::io_error, path + ": error: cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(Status::io_error, path + ": error: cannot read the file");
  return parse_program(ss.str(), path);
}

namespace {
std::string num(double v) {
  if (std::fabs(v) < 9e15 && v == std::floor(v)) return std::to_string(int64_t(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
}  // namespace

std::string format_domain(const ParamDomain& d) {
  std::string out;
  switch (d.kind) {
    case ParamDomain::Kind::fixed: out = d.values.empty() ? "?" : num(d.values[0]); break;
    case ParamDomain::Kind::set:
      out = "{";
      for (size_t i = 0; i < d.values.size(); ++i) out += (i ? ", " : "") + num(d.values[i]);
      out += "}";
      break;
    case ParamDomain::Kind::range:
      out = num(d.lo) + ".." + num(d.hi);
      if (d.geometric) out += " step *" + num(d.step);
      else if (d.step != 1) out += " step " + num(d.step);
      break;
  }
  if (d.preferred) out += " default " + num(*d.preferred);
  return out;
}

}  // namespace rattn
