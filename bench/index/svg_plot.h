#pragma once
// A hand-written SVG line chart: recall (y, linear 0..1) against the share of
// keys scored (x, log scale), one polyline per method.
#include <string>
#include <utility>
#include <vector>

namespace rattn::bench {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (scored fraction, recall)
};

std::string recall_plot_svg(const std::vector<PlotSeries>& series, const std::string& title);

}  // namespace rattn::bench
