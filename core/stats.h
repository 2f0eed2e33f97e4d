#pragma once
// Order statistics shared by the measurements (the tuner's error tails, the
// eval's KL and bootstrap intervals).
#include <algorithm>
#include <cstddef>
#include <vector>

namespace rattn {

// The p-quantile (linear interpolation between order statistics), p in
// [0, 1]; 0 for none.
inline double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 1.0) * double(v.size() - 1);
  const size_t i = size_t(pos);
  if (i + 1 >= v.size()) return v.back();
  return v[i] + (pos - double(i)) * (v[i + 1] - v[i]);
}

}  // namespace rattn
