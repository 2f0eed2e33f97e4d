#include "dsl/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/error.h"

namespace rattn::internal {

const char* tok_name(Tok t) {
  switch (t) {
    case Tok::ident: return "a name";
    case Tok::integer: return "an integer";
    case Tok::real: return "a number";
    case Tok::string: return "a string";
    case Tok::lbrace: return "'{'";
    case Tok::rbrace: return "'}'";
    case Tok::lbracket: return "'['";
    case Tok::rbracket: return "']'";
    case Tok::lparen: return "'('";
    case Tok::rparen: return "')'";
    case Tok::equals: return "'='";
    case Tok::semicolon: return "';'";
    case Tok::comma: return "','";
    case Tok::dot: return "'.'";
    case Tok::dotdot: return "'..'";
    case Tok::star: return "'*'";
    case Tok::minus: return "'-'";
    case Tok::eof: return "end of file";
  }
  return "?";
}

namespace {

std::string printable_char(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return std::string("'") + char(c) + "'";
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", unsigned(c));
  return std::string("byte ") + buf;
}

// Line `line` (1-based) around column `col`, printable characters only: at
// most kQuoteChars of it, "..." marking what was cut. `caret` gets the
// column's offset in the returned text.
std::string source_excerpt(std::string_view text, int line, int col, size_t* caret) {
  size_t pos = 0;
  for (int l = 1; l < line; ++l) {
    pos = text.find('\n', pos);
    if (pos == std::string_view::npos) return {};
    ++pos;
  }
  size_t end = text.find('\n', pos);
  if (end == std::string_view::npos) end = text.size();
  const size_t at = size_t(col - 1);
  if (at > end - pos) return {};
  size_t from = pos, to = end;
  std::string prefix, suffix;
  if (end - pos > kQuoteChars) {
    // Keep the column about a third of the way in, so what follows it shows.
    from = pos + (at > kQuoteChars / 3 ? at - kQuoteChars / 3 : 0);
    if (from > pos) prefix = "...";
    to = std::min(end, from + kQuoteChars - prefix.size());
    if (to < end) {
      to -= 3;
      suffix = "...";
    }
  }
  std::string out = prefix;
  for (size_t i = from; i < to; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c == '\t') ? ' ' : (c >= 0x20 && c < 0x7f) ? char(c) : '?';
  }
  *caret = prefix.size() + (pos + at - from);
  return out + suffix;
}

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    for (;;) {
      skip_space_and_comments();
      Token t;
      t.loc = loc_;
      if (pos_ >= text_.size()) {
        t.kind = Tok::eof;
        out.push_back(t);
        return out;
      }
      const char c = text_[pos_];
      if (is_ident_start(c)) {
        const size_t start = pos_;
        while (pos_ < text_.size() && is_ident_char(text_[pos_])) advance();
        t.kind = Tok::ident;
        t.text = std::string(text_.substr(start, pos_ - start));
      } else if (is_digit(c)) {
        lex_number(t);
      } else if (c == '"') {
        lex_string(t);
      } else {
        lex_punct(t);
      }
      out.push_back(std::move(t));
    }
  }

 private:
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  bool at_end(size_t ahead = 0) const { return pos_ + ahead >= text_.size(); }
  void advance() {
    if (text_[pos_] == '\n') {
      ++loc_.line;
      loc_.col = 1;
    } else {
      ++loc_.col;
    }
    ++pos_;
  }

  void skip_space_and_comments() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') advance();
      } else {
        return;
      }
    }
  }

  // Digits with optional '_' between digits; returns them without '_'.
  std::string digits(const char* what) {
    std::string out;
    while (!at_end() && (is_digit(peek()) || peek() == '_')) {
      if (peek() == '_' && (out.empty() || !is_digit(peek(1))))
        fail_at(file_, text_, loc_, std::string("'_' in ") + what + " must sit between two digits");
      if (peek() != '_') out += peek();
      advance();
    }
    return out;
  }

  void lex_number(Token& t) {
    const size_t start = pos_;
    std::string spelled = digits("a number");
    bool is_real = false;
    // "16..48" is a range, so a '.' starts a fraction only when a digit follows.
    if (peek() == '.' && is_digit(peek(1))) {
      is_real = true;
      advance();
      spelled += '.';
      spelled += digits("a number");
    }
    if (peek() == 'e' || peek() == 'E') {
      const size_t sign = (peek(1) == '+' || peek(1) == '-') ? 1 : 0;
      if (is_digit(peek(1 + sign))) {
        is_real = true;
        spelled += 'e';
        advance();
        if (sign) {
          spelled += peek();
          advance();
        }
        spelled += digits("an exponent");
      }
    }
    if (!at_end() && is_ident_char(peek()))
      fail_at(file_, text_, loc_,
              "unexpected " + printable_char(static_cast<unsigned char>(peek())) +
                  " after the number '" + excerpt(text_.substr(start, pos_ - start)) +
                  "' (expected a space, an operator or ';')");
    t.text = std::string(text_.substr(start, pos_ - start));
    if (is_real) {
      t.kind = Tok::real;
      errno = 0;
      const double v = std::strtod(spelled.c_str(), nullptr);
      if (errno == ERANGE && !(std::isfinite(v) && v != 0))
        fail_at(file_, text_, t.loc, "number '" + excerpt(t.text) + "' is out of range");
      if (!std::isfinite(v)) fail_at(file_, text_, t.loc, "number '" + excerpt(t.text) + "' is out of range");
      t.real_value = v;
    } else {
      t.kind = Tok::integer;
      int64_t v = 0;
      for (char d : spelled) {
        const int digit = d - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10)
          fail_at(file_, text_, t.loc,
                  "integer '" + excerpt(t.text) + "' is too large (at most 9223372036854775807)");
        v = v * 10 + digit;
      }
      t.int_value = v;
      t.real_value = double(v);
    }
  }

  void lex_string(Token& t) {
    t.kind = Tok::string;
    advance();  // opening quote
    for (;;) {
      if (at_end() || peek() == '\n' || peek() == '\r')
        fail_at(file_, text_, t.loc, "unterminated string (expected '\"' before the end of the line)");
      const unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        advance();
        return;
      }
      if (c == '\\') {
        const Loc esc = loc_;
        advance();
        const char e = at_end() ? '\0' : peek();
        switch (e) {
          case '"': t.text += '"'; break;
          case '\\': t.text += '\\'; break;
          case 'n': t.text += '\n'; break;
          case 't': t.text += '\t'; break;
          default:
            fail_at(file_, text_, esc,
                    "unknown escape in string (expected \\\", \\\\, \\n or \\t)");
        }
        advance();
        continue;
      }
      if (c < 0x20 && c != '\t')
        fail_at(file_, text_, loc_, "unexpected " + printable_char(c) + " inside a string");
      t.text += char(c);
      advance();
    }
  }

  void lex_punct(Token& t) {
    const char c = peek();
    switch (c) {
      case '{': t.kind = Tok::lbrace; break;
      case '}': t.kind = Tok::rbrace; break;
      case '[': t.kind = Tok::lbracket; break;
      case ']': t.kind = Tok::rbracket; break;
      case '(': t.kind = Tok::lparen; break;
      case ')': t.kind = Tok::rparen; break;
      case '=': t.kind = Tok::equals; break;
      case ';': t.kind = Tok::semicolon; break;
      case ',': t.kind = Tok::comma; break;
      case '*': t.kind = Tok::star; break;
      case '-': t.kind = Tok::minus; break;
      case '.':
        if (peek(1) == '.') {
          t.kind = Tok::dotdot;
          t.text = "..";
          advance();
          advance();
          return;
        }
        t.kind = Tok::dot;
        break;
      default:
        fail_at(file_, text_, loc_,
                "unexpected character " + printable_char(static_cast<unsigned char>(c)));
    }
    t.text = std::string(1, c);
    advance();
  }

  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
  Loc loc_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view text, const std::string& filename) {
  return Lexer(text, filename).run();
}

void fail_at(const std::string& filename, std::string_view text, Loc loc, const std::string& msg) {
  std::string m = filename + ":" + std::to_string(loc.line) + ":" + std::to_string(loc.col) +
                  ": error: " + msg;
  size_t caret = 0;
  const std::string line = loc.col >= 1 ? source_excerpt(text, loc.line, loc.col, &caret) : std::string();
  if (!line.empty()) m += "\n  " + line + "\n  " + std::string(caret, ' ') + "^";
  fail(Status::parse_error, m);
}

std::string excerpt(std::string_view s) {
  return s.size() <= kQuoteChars ? std::string(s) : std::string(s.substr(0, kQuoteChars - 3)) + "...";
}

std::string quoted(const std::string& name) {
  return "'" + (name.size() <= 64 ? name : name.substr(0, 61) + "...") + "'";
}

std::string describe(const Token& t) {
  switch (t.kind) {
    case Tok::eof: return "end of file";
    case Tok::ident: return quoted(t.text);
    case Tok::integer:
    case Tok::real: return "the number " + excerpt(t.text);
    case Tok::string: return "a string";
    default: return tok_name(t.kind);
  }
}

}  // namespace rattn::internal
