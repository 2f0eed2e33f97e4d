// Reference kernels and the merge against a float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/cpu_kernels.h"

using namespace rattn;

namespace {

struct Attn64 {
  std::vector<double> out;
  double lse;
};

Attn64 attention64(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<int>& rows, int d) {
  std::vector<double> s;
  double m = -INFINITY;
  for (int r : rows) {
    double acc = 0;
    for (int j = 0; j < d; ++j) acc += double(q[j]) * k[size_t(r) * d + j];
    acc /= std::sqrt(double(d));
    s.push_back(acc);
    m = std::max(m, acc);
  }
  Attn64 a{std::vector<double>(d, 0.0), -INFINITY};
  double den = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    double p = std::exp(s[i] - m);
    den += p;
    for (int j = 0; j < d; ++j) a.out[j] += p * v[size_t(rows[i]) * d + j];
  }
  if (den > 0) {
    for (auto& x : a.out) x /= den;
    a.lse = m + std::log(den);
  }
  return a;
}

}  // namespace

TEST(ReferenceKernels, PartialAttentionSplitsMergeToFullAttention) {
  const int d = 64, T = 300, G = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(G) * d), k(size_t(T) * d), v(size_t(T) * d);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  RowStore ks(DType::f32, d), vs(DType::f32, d);
  ks.append_f32(k.data(), T);
  vs.append_f32(v.data(), T);
  auto kern = make_reference_kernels({d, G, DType::f32});

  std::vector<int32_t> part_a, part_b;
  for (int i = 0; i < T; ++i) (i % 3 == 0 ? part_a : part_b).push_back(i);
  std::vector<float> oa(size_t(G) * d), ob(size_t(G) * d), la(G), lb(G);
  kern->partial_attention(q.data(), G, ks.view(), vs.view(), part_a.data(), int(part_a.size()), oa.data(), la.data());
  kern->partial_attention(q.data(), G, ks.view(), vs.view(), part_b.data(), int(part_b.size()), ob.data(), lb.data());
  merge_partials_ln(oa.data(), la.data(), ob.data(), lb.data(), G, d);
  std::vector<float> od(size_t(G) * d), ld(G);
  kern->dense_attention(q.data(), G, ks.view(), vs.view(), 0, T, od.data(), ld.data());

  std::vector<int> all(T);
  for (int i = 0; i < T; ++i) all[i] = i;
  for (int g = 0; g < G; ++g) {
    std::vector<float> qg(q.begin() + g * d, q.begin() + (g + 1) * d);
    Attn64 ref = attention64(qg, k, v, all, d);
    EXPECT_NEAR(la[g], ref.lse, 1e-5 * std::abs(ref.lse) + 1e-5);
    EXPECT_NEAR(ld[g], ref.lse, 1e-5 * std::abs(ref.lse) + 1e-5);
    for (int j = 0; j < d; ++j) {
      EXPECT_NEAR(oa[size_t(g) * d + j], ref.out[j], 1e-5);
      EXPECT_NEAR(od[size_t(g) * d + j], ref.out[j], 1e-5);
    }
  }
}

TEST(ReferenceKernels, EmptyPartialIsTheMergeIdentity) {
  const int d = 8;
  auto kern = make_reference_kernels({d, 1, DType::f32});
  RowStore ks(DType::f32, d), vs(DType::f32, d);
  std::vector<float> q(d, 1.0f), o(d, 5.0f), l(1, 0.0f);
  kern->partial_attention(q.data(), 1, ks.view(), vs.view(), nullptr, 0, o.data(), l.data());
  EXPECT_EQ(l[0], -INFINITY);
  for (float x : o) EXPECT_EQ(x, 0.0f);
  std::vector<float> o2(d, 2.0f), l2(1, 1.5f);
  merge_partials_ln(o2.data(), l2.data(), o.data(), l.data(), 1, d);
  EXPECT_EQ(l2[0], 1.5f);
  EXPECT_EQ(o2[3], 2.0f);
  merge_partials_ln(o.data(), l.data(), o2.data(), l2.data(), 1, d);
  EXPECT_EQ(l[0], 1.5f);
  EXPECT_EQ(o[3], 2.0f);
}

TEST(ReferenceKernels, GatheredDotMatchesFloat64) {
  const int d = 128, T = 50, G = 4;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  std::vector<float> q(size_t(G) * d), k(size_t(T) * d);
  for (auto& x : q) x = nd(rng);
  for (auto& x : k) x = nd(rng);
  RowStore ks(DType::f16, d);
  ks.append_f32(k.data(), T);
  auto kern = make_reference_kernels({d, G, DType::f16});
  std::vector<int32_t> ids = {49, 0, 7, 7, 23};
  std::vector<float> s(size_t(G) * ids.size());
  kern->gathered_dot(q.data(), G, ks.view(), ids.data(), int(ids.size()), s.data());
  std::vector<float> row(d);
  for (int g = 0; g < G; ++g)
    for (size_t i = 0; i < ids.size(); ++i) {
      ks.row_f32(ids[i], row.data());
      double ref = 0;
      for (int j = 0; j < d; ++j) ref += double(q[size_t(g) * d + j]) * row[j];
      EXPECT_NEAR(s[g * ids.size() + i], ref, 1e-4 * (1 + std::abs(ref)));
    }
}
