// Plain scalar loops behind the CpuKernels interface.
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu_kernels.h"

namespace rattn {

void merge_partials_ln(float* out_a, float* lse_a, const float* out_b, const float* lse_b,
                       int heads, int d) {
  for (int h = 0; h < heads; ++h) {
    const float la = lse_a[h], lb = lse_b[h];
    if (lb == -std::numeric_limits<float>::infinity()) continue;
    if (la == -std::numeric_limits<float>::infinity()) {
      for (int j = 0; j < d; ++j) out_a[h * d + j] = out_b[h * d + j];
      lse_a[h] = lb;
      continue;
    }
    const float m = std::max(la, lb);
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float inv = 1.0f / (wa + wb);
    for (int j = 0; j < d; ++j) out_a[h * d + j] = (wa * out_a[h * d + j] + wb * out_b[h * d + j]) * inv;
    lse_a[h] = m + std::log(wa + wb);
  }
}

namespace {

class ReferenceKernels final : public CpuKernels {
 public:
  explicit ReferenceKernels(const KernelSpec& spec) : spec_(spec) {}
  const KernelSpec& spec() const override { return spec_; }

  void gathered_dot(const float* q, int groups, const RowsView& keys, const int32_t* ids, int n,
                    float* scores) override {
    const int d = keys.dim;
    thread_local std::vector<float> row_;
    row_.resize(size_t(d));
    for (int i = 0; i < n; ++i) {
      to_f32(keys.dtype, keys.row(ids[i]), row_.data(), size_t(d));
      for (int g = 0; g < groups; ++g) {
        float s = 0;
        for (int j = 0; j < d; ++j) s += q[g * d + j] * row_[size_t(j)];
        scores[size_t(g) * size_t(n) + size_t(i)] = s;
      }
    }
  }

  void partial_attention(const float* q, int groups, const RowsView& keys, const RowsView& values,
                         const int32_t* ids, int n, float* out, float* lse) override {
    run(q, groups, keys, values, n, [&](int i) { return int64_t(ids[i]); }, out, lse);
  }

  void dense_attention(const float* q, int groups, const RowsView& keys, const RowsView& values,
                       int64_t begin, int64_t end, float* out, float* lse) override {
    if (end < begin) fail(Status::invalid_argument, "dense_attention: end < begin");
    run(q, groups, keys, values, end - begin, [&](int64_t i) { return begin + i; }, out, lse);
  }

 private:
  template <class RowOf>
  void run(const float* q, int groups, const RowsView& keys, const RowsView& values, int64_t n,
           RowOf row_of, float* out, float* lse) {
    const int d = keys.dim;
    const float scale = 1.0f / std::sqrt(float(d));
    thread_local std::vector<float> row_, scores_;
    row_.resize(size_t(d));
    scores_.resize(size_t(n));
    for (int g = 0; g < groups; ++g) {
      const float* qg = q + size_t(g) * size_t(d);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < n; ++i) {
        to_f32(keys.dtype, keys.row(row_of(i)), row_.data(), size_t(d));
        float s = 0;
        for (int j = 0; j < d; ++j) s += qg[j] * row_[size_t(j)];
        s *= scale;
        scores_[size_t(i)] = s;
        m = std::max(m, s);
      }
      float* o = out + size_t(g) * size_t(d);
      for (int j = 0; j < d; ++j) o[j] = 0;
      if (n == 0) {
        lse[g] = -std::numeric_limits<float>::infinity();
        continue;
      }
      float denom = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float p = std::exp(scores_[size_t(i)] - m);
        denom += p;
        to_f32(values.dtype, values.row(row_of(i)), row_.data(), size_t(d));
        for (int j = 0; j < d; ++j) o[j] += p * row_[size_t(j)];
      }
      for (int j = 0; j < d; ++j) o[j] /= denom;
      lse[g] = m + std::log(denom);
    }
  }

  KernelSpec spec_;
};

}  // namespace

std::unique_ptr<CpuKernels> make_reference_kernels(const KernelSpec& spec) {
  return std::make_unique<ReferenceKernels>(spec);
}

}  // namespace rattn
