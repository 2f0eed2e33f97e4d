#pragma once
// Shared pieces of every benchmark: the machine description put in each JSON
// report, a monotonic clock, the process's CPU clock, a mean and a median,
// repeated timing, STREAM.
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "core/clock.h"

namespace rattn::bench {

// {"cpu": model name, "cores": online cores, "hostname": ...}
boost::json::object machine_info();

// CPU seconds of the whole process: every thread that works on a timed call
// (the caller and the pool's workers; idle workers sleep) is counted, so a
// difference is the call's total CPU work and barely depends on how busy a
// shared machine is.
inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The mean; 0 for none.
inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

// The median (of the two middle values for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

struct Timing {
  double min_s = 0, median_s = 0;
  int reps = 0;
};

// Runs f once to warm up, then repeatedly for about min_time seconds (at
// least 3 times, at most 100000); the fastest and the median run.
template <class F>
Timing time_it(F&& f, double min_time) {
  f();  // warm up caches and lazy initialisation
  std::vector<double> t;
  const double start = seconds_now();
  while (t.size() < 3 || (seconds_now() - start < min_time && t.size() < 100000)) {
    const double a = seconds_now();
    f();
    t.push_back(seconds_now() - a);
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2], int(t.size())};
}

// Pretty-prints a JSON value (two-space indent) followed by a newline.
std::string to_pretty_json(const boost::json::value& v);

// STREAM-like copy and triad over three arrays of `n` doubles (far larger
// than the caches) on `threads` threads, the fastest run of time_it for
// each; bytes counted as STREAM does (copy 2
// arrays, triad 3).
struct Bandwidth {
  double copy_gbs = 0, triad_gbs = 0;
  double triad_gbs_median = 0;  // the median run's: a shared machine's fastest run can be far from its typical one
};
Bandwidth measure_bandwidth(int threads, size_t n, double min_time);

}  // namespace rattn::bench
