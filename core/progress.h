#pragma once
// Progress of a long command on stderr: on a terminal one line redrawn in
// place (a bar, the share done, elapsed time and ETA, what runs now);
// otherwise a plain line at most every 10 seconds, so logs stay readable.
#include <chrono>
#include <cstdio>
#include <string>

namespace rattn {

class Progress {
 public:
  // `total` units of work (any scale: seconds expected, items); `out` null
  // means silent.
  Progress(std::string label, double total, std::FILE* out = stderr);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Marks `units` more done and says what runs next.
  void advance(double units, const std::string& now = {});
  // A better estimate of the whole (never below what is done).
  void set_total(double total);
  // A message above the bar (a plain line either way).
  void note(const std::string& line);
  // The bar's final state and a newline on a terminal.
  void finish(const std::string& summary = {});
  double done() const { return done_; }
  double total() const { return total_; }

  // "1m05s", "12.3s"
  static std::string format_seconds(double s);

 private:
  void draw(const std::string& now);
  std::string label_;
  double total_ = 0, done_ = 0;
  std::FILE* out_ = nullptr;
  bool tty_ = false, finished_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_any_ = false;
};

}  // namespace rattn
