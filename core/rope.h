#pragma once
// Rotary position embedding (RoPE): pair (a, b) of frequency i - a = i,
// b = i + d/2 (NeoX "rotate half") or a = 2i, b = 2i + 1 (GPT-J) - turns by
// position * base^(-2i/d). Angles and products in float64, vectors in float.
#include <cmath>
#include <cstdint>
#include <vector>

namespace rattn {

// The angles of one position (or shift), reused over many vectors.
class RopeAngles {
 public:
  RopeAngles(int dim, double position, double base) : dim_(dim) {
    const int half = dim / 2;
    cos_.resize(static_cast<size_t>(half));
    sin_.resize(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
      const double theta = position * std::pow(base, -2.0 * double(i) / double(dim));
      cos_[size_t(i)] = std::cos(theta);
      sin_[size_t(i)] = std::sin(theta);
    }
  }
  // out = in rotated; in == out is allowed. An odd last dimension is copied.
  void rotate(const float* in, float* out, bool interleaved) const {
    const int half = dim_ / 2;
    if (dim_ % 2 != 0) out[dim_ - 1] = in[dim_ - 1];
    for (int i = 0; i < half; ++i) {
      const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
      const double x = in[a], y = in[b];
      out[a] = float(x * cos_[size_t(i)] - y * sin_[size_t(i)]);
      out[b] = float(x * sin_[size_t(i)] + y * cos_[size_t(i)]);
    }
  }

 private:
  int dim_;
  std::vector<double> cos_, sin_;
};

}  // namespace rattn
