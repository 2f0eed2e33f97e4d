#include "core/log.h"

#include <cstdio>
#include <mutex>

namespace rattn {
namespace {
std::mutex& log_mutex() {
  static std::mutex m;
  return m;
}
LogSink& sink_slot() {
  static LogSink s;
  return s;
}
}  // namespace

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(log_mutex());
  sink_slot() = std::move(sink);
}

void log_message(LogLevel level, const std::string& text) {
  std::lock_guard<std::mutex> lock(log_mutex());
  if (sink_slot()) {
    sink_slot()(level, text.c_str());
  } else if (level >= LogLevel::warn) {
    std::fprintf(stderr, "rattn: %s\n", text.c_str());
  }
}

}  // namespace rattn
