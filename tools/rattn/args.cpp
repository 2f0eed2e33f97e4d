#include "tools/rattn/args.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace rattn::cli {

std::optional<int64_t> to_int(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end) return std::nullopt;
  return int64_t(v);
}

std::optional<double> to_double(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end) return std::nullopt;
  return v;
}

std::vector<std::string> split(const std::string& s, char sep, bool keep_empty) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (keep_empty || !item.empty()) out.push_back(item);
  return out;
}

int64_t int_arg(const std::string& command, const std::string& opt, const std::string& s, int64_t lo, int64_t hi) {
  const std::optional<int64_t> v = to_int(s);
  if (v && *v >= lo && *v <= hi) return *v;
  std::string bounds;
  if (hi != std::numeric_limits<int64_t>::max())
    bounds = " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  else if (lo != std::numeric_limits<int64_t>::min())
    bounds = " >= " + std::to_string(lo);
  usage_fail(command + ": error: " + opt + " expects an integer" + bounds + ", got '" + s + "'");
}

double real_arg(const std::string& command, const std::string& opt, const std::string& s) {
  const std::optional<double> v = to_double(s);
  if (!v) usage_fail(command + ": error: " + opt + " expects a number, got '" + s + "'");
  return *v;
}

}  // namespace rattn::cli
