#include "bench/bench_util.h"

#include "core/cpu_info.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

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

}  // namespace rattn::bench
