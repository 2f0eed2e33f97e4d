// `rattn bench index --build-sizes`: the graph built on the first n context
// keys (with the first n training queries) for each n, its wall and process
// CPU seconds and the training kNN's share, and the growth exponent between
// consecutive sizes, log(t2 / t1) / log(n2 / n1).
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "bench/bench_util.h"
#include "bench/index/index_phases.h"
#include "runtime/index/projected_graph.h"

namespace rattn::bench {

namespace json = boost::json;

namespace {

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

}  // namespace

void IndexRun::build_sweep() {
  json::array sizes;
  double prev_n = 0, prev_wall = 0, prev_cpu = 0;
  for (const int64_t n : o.build_sizes) {
    if (n > N) usage_error("--build-sizes: " + std::to_string(n) + " is more than the " + std::to_string(N) + " context keys");
    const RowsView sub{keys.data, keys.dtype, n, keys.dim};
    const double load0 = load_average(), w0 = seconds_now(), c0 = process_cpu_seconds();
    const auto index = build_projected_graph(sub, ds.train.data(), n, o.graph);
    const double wall = seconds_now() - w0, cpu = process_cpu_seconds() - c0;
    const GraphInfo gi = projected_graph_info(*index);
    json::object s;
    s["keys"] = n;
    s["build_seconds"] = wall;
    s["build_cpu_seconds"] = cpu;
    s["load_average_before"] = load0;
    s["load_average_after"] = load_average();
    s["knn_partitions"] = gi.knn_partitions;
    s["knn_scanned_fraction"] = gi.knn_scanned_fraction;
    for (const BuildPhase& ph : gi.build_phases)
      if (ph.name == "training_knn") {
        s["knn_seconds"] = ph.seconds;
        s["knn_cpu_seconds"] = ph.cpu_seconds;
      }
    char line[256];
    std::snprintf(line, sizeof line, "build sweep: %lld keys: %.2f s (cpu %.2f s), kNN %lld partitions, %.2f%% scored, load %.1f",
                  static_cast<long long>(n), wall, cpu, static_cast<long long>(gi.knn_partitions),
                  100 * gi.knn_scanned_fraction, load0);
    std::string text = line;
    if (prev_n > 0) {
      const double span = std::log(double(n) / prev_n);
      s["exponent_wall"] = std::log(wall / prev_wall) / span;
      s["exponent_cpu"] = std::log(cpu / prev_cpu) / span;
      std::snprintf(line, sizeof line, "; exponent from %lld keys: %.3f (cpu %.3f)", static_cast<long long>(prev_n),
                    s["exponent_wall"].as_double(), s["exponent_cpu"].as_double());
      text += line;
    }
    log(text);
    prev_n = double(n);
    prev_wall = wall;
    prev_cpu = cpu;
    sizes.push_back(std::move(s));
  }
  sweep_report["sizes"] = std::move(sizes);
}

}  // namespace rattn::bench
