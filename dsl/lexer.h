#pragma once
// Tokens of the attention-layout language (*.ra). Internal to the front end.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rattn::internal {

struct Loc {
  int line = 1;
  int col = 1;
};

enum class Tok {
  ident,    // [A-Za-z_][A-Za-z0-9_]*
  integer,  // 123, 262_144
  real,     // 1.5, 1e6, 2.5e-3
  string,   // "..." with \" \\ \n \t escapes
  lbrace, rbrace, lbracket, rbracket, lparen, rparen,
  equals, semicolon, comma, dot, dotdot, star, minus,
  eof,
};

// Human name of a token kind for "expected ..." messages, e.g. "';'".
const char* tok_name(Tok t);

struct Token {
  Tok kind = Tok::eof;
  Loc loc;
  std::string text;      // identifier, string contents (unescaped), or literal spelling
  int64_t int_value = 0; // integer
  double real_value = 0; // integer and real
};

// Turns source text into tokens; throws Error(parse_error) with
// "file:line:col: error: ..." on a bad character, an unterminated string or a
// literal out of range. Comments run from '#' to the end of the line.
std::vector<Token> tokenize(std::string_view text, const std::string& filename);

// The one place diagnostics are formatted: "file:line:col: error: msg",
// followed by the offending source line (at most kQuoteChars of it, around
// the column) and a caret when `text` has it.
[[noreturn]] void fail_at(const std::string& filename, std::string_view text, Loc loc,
                          const std::string& msg);

// The most characters of source one diagnostic quotes: a longer literal or
// line is cut and marked with "...", so a 10 MB number is not echoed whole.
inline constexpr size_t kQuoteChars = 80;

// Source text for a message: at most kQuoteChars characters.
std::string excerpt(std::string_view s);

// A name in quotes for a message, shortened past 64 characters.
std::string quoted(const std::string& name);

// How a token looks in a message: "'layers'", "'='", "end of file", "the number 12".
std::string describe(const Token& t);

}  // namespace rattn::internal
