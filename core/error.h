#pragma once
// One error type for all of rattn's C++ code: a status plus a message.
#include <stdexcept>
#include <string>

namespace rattn {

enum class Status : int {
  ok = 0,
  invalid_argument = 1,  // bad argument, wrong shape, null pointer
  parse_error = 2,       // malformed DSL text
  io_error = 3,          // file could not be read or written
  corrupt_data = 4,      // truncated / bad checksum / bad magic
  unsupported = 5,       // valid request this build cannot serve
  not_found = 6,         // e.g. kernel missing from cache with JIT disabled
  internal = 7,
  out_of_memory = 8,     // a memory need checked before a large allocation
};

const char* status_name(Status s);

class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  Status status() const { return status_; }

 private:
  Status status_;
};

[[noreturn]] inline void fail(Status s, const std::string& msg) { throw Error(s, msg); }

// A mistake on the command line (unknown option, missing or bad value),
// found before any work starts: `rattn` exits 2 on it, 1 on other errors.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(Status::invalid_argument, message) {}
};

[[noreturn]] inline void usage_fail(const std::string& msg) { throw UsageError(msg); }

}  // namespace rattn
