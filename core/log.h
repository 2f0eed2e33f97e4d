#pragma once
// The library's log: one process-wide sink (rattn_log_set), stderr by default.
#include <functional>
#include <string>

namespace rattn {

enum class LogLevel : int { debug = 0, info = 1, warn = 2, error = 3 };
using LogSink = std::function<void(LogLevel level, const char* text)>;

// nullptr restores the default sink (stderr, warn and above).
void set_log_sink(LogSink sink);
// Serialised: sinks see one call at a time.
void log_message(LogLevel level, const std::string& text);

}  // namespace rattn
