#pragma once
// The pieces of the subcommands' option parsing: option values read as
// whole numbers, and lists cut at a separator. Errors are usage errors
// (exit status 2) that name the command and the option.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace rattn::cli {

// The whole of `s` as a decimal integer or a number; nullopt when `s` is
// empty or has anything after the number.
std::optional<int64_t> to_int(const std::string& s);
std::optional<double> to_double(const std::string& s);

// `s` cut at each `sep`; empty items are dropped unless `keep_empty`.
std::vector<std::string> split(const std::string& s, char sep = ',', bool keep_empty = false);

// The value `s` of option `opt` of `command` as an integer in [lo, hi], else
// the usage error "<command>: error: <opt> expects an integer[ >= lo | in
// [lo, hi]], got '<s>'" (the bounds said as far as they are given).
int64_t int_arg(const std::string& command, const std::string& opt, const std::string& s,
                int64_t lo = std::numeric_limits<int64_t>::min(), int64_t hi = std::numeric_limits<int64_t>::max());

// The value `s` of option `opt` as a number, else the usage error
// "<command>: error: <opt> expects a number, got '<s>'".
double real_arg(const std::string& command, const std::string& opt, const std::string& s);

}  // namespace rattn::cli
