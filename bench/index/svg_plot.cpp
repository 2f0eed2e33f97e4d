#include "bench/index/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace rattn::bench {
namespace {

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

}  // namespace

std::string recall_plot_svg(const std::vector<PlotSeries>& series, const std::string& title) {
  const double W = 760, H = 480, left = 70, right = 190, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  // x range: decades covering every point (log10 of the scored fraction).
  double lo = 0, hi = 0;
  bool any = false;
  for (const auto& s : series)
    for (const auto& p : s.points)
      if (p.first > 0) {
        const double l = std::log10(p.first);
        lo = any ? std::min(lo, l) : l;
        hi = any ? std::max(hi, l) : l;
        any = true;
      }
  lo = std::floor(any ? lo : -3.0);
  hi = std::max(std::ceil(any ? hi : 0.0), lo + 1);
  const auto X = [&](double f) { return left + (std::log10(std::max(f, 1e-12)) - lo) / (hi - lo) * pw; };
  const auto Y = [&](double r) { return top + (1.0 - std::clamp(r, 0.0, 1.0)) * ph; };
  static const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#7f7f7f", "#9467bd", "#ff7f0e"};

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << num(left + pw / 2) << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">" << escape(title)
    << "</text>\n";
  // Grid and ticks.
  for (int r = 0; r <= 10; ++r) {
    const double y = Y(r / 10.0);
    o << "<line x1=\"" << num(left) << "\" y1=\"" << num(y) << "\" x2=\"" << num(left + pw) << "\" y2=\"" << num(y)
      << "\" stroke=\"#e0e0e0\"/>\n";
    if (r % 2 == 0)
      o << "<text x=\"" << num(left - 8) << "\" y=\"" << num(y + 4) << "\" text-anchor=\"end\">" << r / 10.0 << "</text>\n";
  }
  for (int e = int(lo); e <= int(hi); ++e) {
    for (int m = 1; m < 10 && (e < int(hi) || m == 1); ++m) {
      const double x = X(m * std::pow(10.0, e));
      o << "<line x1=\"" << num(x) << "\" y1=\"" << num(top) << "\" x2=\"" << num(x) << "\" y2=\"" << num(top + ph)
        << "\" stroke=\"" << (m == 1 ? "#c0c0c0" : "#f0f0f0") << "\"/>\n";
    }
    char lab[32];
    const double v = std::pow(10.0, e) * 100.0;
    std::snprintf(lab, sizeof lab, v < 1 ? "%.1f%%" : "%.0f%%", v);
    o << "<text x=\"" << num(X(std::pow(10.0, e))) << "\" y=\"" << num(top + ph + 18) << "\" text-anchor=\"middle\">"
      << lab << "</text>\n";
  }
  o << "<rect x=\"" << num(left) << "\" y=\"" << num(top) << "\" width=\"" << num(pw) << "\" height=\"" << num(ph)
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  o << "<text x=\"" << num(left + pw / 2) << "\" y=\"" << num(H - 15)
    << "\" text-anchor=\"middle\">keys scored per query (share of all keys, log scale)</text>\n";
  o << "<text transform=\"translate(18," << num(top + ph / 2) << ") rotate(-90)\" text-anchor=\"middle\">recall@100</text>\n";
  // Series.
  for (size_t i = 0; i < series.size(); ++i) {
    const char* c = colors[i % 6];
    std::vector<std::pair<double, double>> pts = series[i].points;
    std::sort(pts.begin(), pts.end());
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"2\" points=\"";
    for (const auto& p : pts) o << num(X(p.first)) << "," << num(Y(p.second)) << " ";
    o << "\"/>\n";
    for (const auto& p : pts)
      o << "<circle cx=\"" << num(X(p.first)) << "\" cy=\"" << num(Y(p.second)) << "\" r=\"3\" fill=\"" << c << "\"/>\n";
    const double ly = top + 16 + 20 * double(i);
    o << "<line x1=\"" << num(left + pw + 12) << "\" y1=\"" << num(ly) << "\" x2=\"" << num(left + pw + 32) << "\" y2=\""
      << num(ly) << "\" stroke=\"" << c << "\" stroke-width=\"2\"/>\n";
    o << "<text x=\"" << num(left + pw + 38) << "\" y=\"" << num(ly + 4) << "\">" << escape(series[i].name) << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace rattn::bench
