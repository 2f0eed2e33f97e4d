#include "bench/bench_util.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "core/cpu_info.h"

namespace rattn::bench {

boost::json::object machine_info() {
  boost::json::object m;
  m["cpu"] = rattn::cpu_model();
  m["cores"] = long(std::thread::hardware_concurrency());
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) == 0) m["hostname"] = host;
  // Timings on a shared machine only mean something next to its load.
  std::ifstream loadavg("/proc/loadavg");
  double load1 = 0;
  if (loadavg >> load1) m["load_average_1m"] = load1;
  return m;
}

static void pretty(std::ostringstream& os, const boost::json::value& v, int indent) {
  const std::string pad(size_t(indent) * 2, ' ');
  if (v.is_object()) {
    const auto& o = v.get_object();
    if (o.empty()) { os << "{}"; return; }
    os << "{\n";
    size_t i = 0;
    for (const auto& kv : o) {
      os << pad << "  " << boost::json::serialize(boost::json::value(kv.key())) << ": ";
      pretty(os, kv.value(), indent + 1);
      os << (++i < o.size() ? ",\n" : "\n");
    }
    os << pad << "}";
  } else if (v.is_array()) {
    const auto& a = v.get_array();
    if (a.empty()) { os << "[]"; return; }
    os << "[\n";
    for (size_t i = 0; i < a.size(); ++i) {
      os << pad << "  ";
      pretty(os, a[i], indent + 1);
      os << (i + 1 < a.size() ? ",\n" : "\n");
    }
    os << pad << "]";
  } else {
    os << boost::json::serialize(v);
  }
}

std::string to_pretty_json(const boost::json::value& v) {
  std::ostringstream os;
  pretty(os, v, 0);
  os << "\n";
  return os.str();
}

Bandwidth measure_bandwidth(int threads, size_t n, double min_time) {
  std::vector<double> a(n, 1.0), b(n, 2.0), c(n, 0.5);
  auto run = [&](auto body) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const size_t lo = n * size_t(t) / size_t(threads), hi = n * size_t(t + 1) / size_t(threads);
        body(lo, hi);
      });
    for (auto& th : pool) th.join();
  };
  const double copy =
      time_it([&] { run([&](size_t lo, size_t hi) { for (size_t i = lo; i < hi; ++i) c[i] = a[i]; }); }, min_time).min_s;
  const Timing triad = time_it([&] {
    run([&](size_t lo, size_t hi) { for (size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0 * c[i]; });
  }, min_time);
  if (a[n / 2] < 0) std::printf("%f", a[0]);  // keep the loops
  Bandwidth bw;
  bw.copy_gbs = 2.0 * sizeof(double) * double(n) / copy / 1e9;
  bw.triad_gbs = 3.0 * sizeof(double) * double(n) / triad.min_s / 1e9;
  bw.triad_gbs_median = 3.0 * sizeof(double) * double(n) / triad.median_s / 1e9;
  return bw;
}

}  // namespace rattn::bench
