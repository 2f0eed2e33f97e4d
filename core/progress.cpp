#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace rattn {

Progress::Progress(std::string label, double total, std::FILE* out)
    : label_(std::move(label)), total_(std::max(total, 1e-9)), out_(out), start_(std::chrono::steady_clock::now()) {
  tty_ = out_ && ::isatty(::fileno(out_));
}

Progress::~Progress() {
  if (tty_ && drawn_ && !finished_) std::fputc('\n', out_);
}

std::string Progress::format_seconds(double s) {
  char buf[32];
  if (!(s >= 0) || s > 1e7) return "?";
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

void Progress::draw(const std::string& now) {
  if (!out_) return;
  const double frac = std::clamp(done_ / total_, 0.0, 1.0);
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string eta = frac > 0.01 ? format_seconds(elapsed * (1 - frac) / frac) : "?";
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = int(std::lround(frac * kWidth));
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::string tail = now.substr(0, 60);
    std::fprintf(out_, "\r\033[K%s [%s] %3d%% %s ETA %s %s", label_.c_str(), bar.c_str(), int(frac * 100),
                 format_seconds(elapsed).c_str(), eta.c_str(), tail.c_str());
    drawn_ = true;
  } else {
    std::fprintf(out_, "%s: %3d%% (%s, ETA %s)%s%s\n", label_.c_str(), int(frac * 100),
                 format_seconds(elapsed).c_str(), eta.c_str(), now.empty() ? "" : ": ", now.c_str());
  }
  std::fflush(out_);
}

void Progress::set_total(double total) { total_ = std::max({total, done_, 1e-9}); }

void Progress::advance(double units, const std::string& now) {
  done_ += units;
  // A terminal redraws at most 10 times a second; a log gets a line at most
  // every 10 seconds.
  const auto t = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(t - last_draw_).count();
  if (drawn_any_ && since < (tty_ ? 0.1 : 10.0)) return;
  last_draw_ = t;
  drawn_any_ = true;
  draw(now);
}

void Progress::note(const std::string& line) {
  if (!out_) return;
  if (tty_ && drawn_) std::fputs("\r\033[K", out_);
  std::fprintf(out_, "%s: %s\n", label_.c_str(), line.c_str());
  drawn_ = false;
}

void Progress::finish(const std::string& summary) {
  if (finished_ || !out_) return;
  done_ = total_;
  draw(summary);
  if (tty_) std::fputc('\n', out_);
  finished_ = true;
}

}  // namespace rattn
