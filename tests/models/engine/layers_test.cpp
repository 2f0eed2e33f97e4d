// The forward pass's pieces against plain float64 references: RMSNorm,
// rotate-half RoPE, GeGLU's gelu_tanh, blockwise causal / sliding-window GQA
// attention, and the oneDNN matrix product.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "models/engine/gemma.h"
#include "models/engine/matmul.h"

namespace rattn::engine {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(Layers, MatmulBothLayoutsWithStridesAndAccumulate) {
  const int M = 37, N = 53, K = 70, lda = 75, ldb_t = 72, ldb_n = 60, ldc = 58;
  auto A = randn(size_t(M) * lda, 1), Bt = randn(size_t(N) * ldb_t, 2), Bn = randn(size_t(K) * ldb_n, 3);
  std::vector<float> C(size_t(M) * ldc, 0.0f), C2(size_t(M) * ldc, 1.0f);
  matmul(M, N, K, A.data(), lda, Bt.data(), ldb_t, true, C.data(), ldc);
  matmul(M, N, K, A.data(), lda, Bn.data(), ldb_n, false, C2.data(), ldc, 0.5f, 1.0f);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double t = 0, n = 0;
      for (int k = 0; k < K; ++k) {
        t += double(A[size_t(i * lda + k)]) * Bt[size_t(j * ldb_t + k)];
        n += double(A[size_t(i * lda + k)]) * Bn[size_t(k * ldb_n + j)];
      }
      ASSERT_NEAR(C[size_t(i * ldc + j)], t, 1e-4 * (1 + std::fabs(t)));
      ASSERT_NEAR(C2[size_t(i * ldc + j)], 1.0 + 0.5 * n, 1e-4 * (1 + std::fabs(n)));
    }
}

TEST(Layers, RmsNorm) {
  const int rows = 5, n = 64;
  auto x = randn(size_t(rows * n), 4, 3.0f), w = randn(size_t(n), 5);
  std::vector<float> y(x.size());
  internal::rms_norm_rows(x.data(), w.data(), y.data(), rows, n, 1e-6f);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int j = 0; j < n; ++j) ss += double(x[size_t(r * n + j)]) * x[size_t(r * n + j)];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
    for (int j = 0; j < n; ++j) ASSERT_NEAR(y[size_t(r * n + j)], x[size_t(r * n + j)] * inv * w[size_t(j)], 1e-5);
  }
}

TEST(Layers, RopeRotateHalfPairsIWithIPlusHalf) {
  const int heads = 3, d = 16, n_pos = 4;
  const int64_t pos0 = 30000;  // large positions: angles must be computed accurately
  const double base = 1e6;
  auto x = randn(size_t(n_pos * heads * d), 6);
  auto y = x;
  internal::rope_neox(y.data(), n_pos, heads, d, pos0, float(base));
  for (int p = 0; p < n_pos; ++p)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const size_t o = size_t((p * heads + h) * d);
        const double a = double(pos0 + p) * std::pow(base, -2.0 * i / d);
        const double x0 = x[o + size_t(i)], x1 = x[o + size_t(i + d / 2)];
        ASSERT_NEAR(y[o + size_t(i)], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
        ASSERT_NEAR(y[o + size_t(i + d / 2)], x0 * std::sin(a) + x1 * std::cos(a), 1e-5);
      }
}

TEST(Layers, GeluTanh) {
  for (double x : {-5.0, -1.0, -0.1, 0.0, 0.3, 1.0, 4.0}) {
    const double want = 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    EXPECT_NEAR(internal::gelu_tanh(float(x)), want, 1e-6);
  }
}

// Queries at positions [q0, q0+nq), `heads` heads sharing one KV head.
void check_attention(int64_t q0, int64_t nq, int window) {
  const int heads = 4, d = 32;
  const int64_t total = q0 + nq;
  const float scale = 1.0f / std::sqrt(float(d));
  auto q = randn(size_t(nq * heads * d), 7), k = randn(size_t(total * d), 8), v = randn(size_t(total * d), 9);
  std::vector<float> out(size_t(nq * heads * d));
  internal::causal_attention(q.data(), heads * d, nq, heads, d, q0, k.data(), v.data(), d, window, scale,
                             out.data(), heads * d);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t p = q0 + i;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    for (int h = 0; h < heads; ++h) {
      const float* qv = &q[size_t((i * heads + h) * d)];
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j = lo; j <= p; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qv[c]) * k[size_t(j * d + c)];
        s.push_back(dot * scale);
        mx = std::max(mx, s.back());
      }
      double sum = 0;
      for (double& e : s) sum += (e = std::exp(e - mx));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (int64_t j = lo; j <= p; ++j) o += s[size_t(j - lo)] / sum * v[size_t(j * d + c)];
        ASSERT_NEAR(out[size_t((i * heads + h) * d + c)], o, 2e-5) << "pos " << p << " head " << h;
      }
    }
  }
}

TEST(Layers, CausalAttentionFromStart) { check_attention(0, 300, 0); }
TEST(Layers, CausalAttentionWithCachedPrefix) { check_attention(200, 150, 0); }
TEST(Layers, SlidingWindowAttention) { check_attention(100, 300, 64); }
TEST(Layers, SingleTokenDecodeAttention) {
  check_attention(400, 1, 0);
  check_attention(400, 1, 128);
}

}  // namespace
}  // namespace rattn::engine
