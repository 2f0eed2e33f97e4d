#pragma once
// Shared pieces of every benchmark: the machine description put in each JSON
// report, and a monotonic clock.
#include <chrono>
#include <string>

#include <boost/json.hpp>

namespace rattn::bench {

// {"cpu": model name, "cores": online cores, "hostname": ...}
boost::json::object machine_info();

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Pretty-prints a JSON value (two-space indent) followed by a newline.
std::string to_pretty_json(const boost::json::value& v);

}  // namespace rattn::bench
