// Numeric tests of the Halide kernels against a float64 reference, plus the
// kernel cache (names, disk cache, concurrent builders) and AOT build.
//
// Error measures:
//   o:      max_i |o_i - ref_i| / max_i |ref_i|          (per call, over all heads)
//   lse:    max_g |lse_g - ref_g|                        (absolute, natural log)
//   scores: max_i |s_i - ref_i| / (|q_g| |k_i|)          (an inner product's own scale)
// Two references, both float64:
//   "stored": on K/V as stored (dequantised) - the kernels' own arithmetic
//             error; <= 1e-5 for every dtype (they accumulate in fp32).
//   "input":  on the fp32 values before storage - adds the storage rounding;
//             <= 1e-5 for fp32, <= 3e-3 for fp16. bf16 keeps 8 mantissa bits
//             (rounding up to 2^-9 per element), so its bound is 1e-2.
//
// Cost: each kernel specialisation is compiled once and kept in a disk cache
// shared by this binary's test processes (<binary dir>/halide-test-cache
// unless RATTN_CACHE_DIR is set), so only the first run pays for JIT.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codegen/halide/halide_kernels.h"
#include "codegen/halide/kernel_cache.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace rattn {
namespace {

std::string binary_dir() {
  std::error_code ec;
  auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::temp_directory_path().string() : exe.parent_path().string();
}

// Shared disk cache for the numeric tests (set before any kernel is built).
const bool kCacheDirSet = [] {
  if (!std::getenv("RATTN_CACHE_DIR"))
    setenv("RATTN_CACHE_DIR", (binary_dir() + "/halide-test-cache").c_str(), 1);
  return true;
}();

constexpr double kKernelTolerance = 1e-5;
double input_tolerance(DType t) { return t == DType::f32 ? 1e-5 : t == DType::f16 ? 3e-3 : 1e-2; }

// Inputs in fp32 plus their stored copies.
struct Data {
  int d = 0, groups = 0;
  std::vector<float> q;       // groups x d
  std::vector<float> k, v;    // rows x d, before rounding to the dtype
  std::vector<float> k_stored, v_stored;  // the same after the round trip through the dtype
  RowStore ks, vs;
  // The view the references read: inputs or stored values.
  Data as_stored() const {
    Data s = *this;
    s.k = k_stored;
    s.v = v_stored;
    return s;
  }
};

Data make_data(int d, int groups, DType dtype, int64_t rows, uint32_t seed) {
  Data x;
  x.d = d;
  x.groups = groups;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  x.q.resize(size_t(groups) * d);
  // A few large query entries make the softmax peaky, as real attention is.
  for (auto& e : x.q) e = 1.5f * normal(rng);
  x.k.resize(size_t(rows) * d);
  x.v.resize(size_t(rows) * d);
  for (auto& e : x.k) e = normal(rng);
  for (auto& e : x.v) e = uni(rng);
  x.ks = RowStore(dtype, d);
  x.vs = RowStore(dtype, d);
  x.ks.append_f32(x.k.data(), rows);
  x.vs.append_f32(x.v.data(), rows);
  x.k_stored.resize(x.k.size());
  x.v_stored.resize(x.v.size());
  for (int64_t r = 0; r < rows; ++r) {
    x.ks.row_f32(r, &x.k_stored[size_t(r) * d]);
    x.vs.row_f32(r, &x.v_stored[size_t(r) * d]);
  }
  return x;
}

// float64 attention over `rows` (token row indices) on the fp32 inputs.
void reference_attention(const Data& x, const std::vector<int64_t>& rows, std::vector<double>* out,
                         std::vector<double>* lse) {
  const int d = x.d;
  out->assign(size_t(x.groups) * d, 0.0);
  lse->assign(size_t(x.groups), -std::numeric_limits<double>::infinity());
  if (rows.empty()) return;
  std::vector<double> s(rows.size());
  for (int g = 0; g < x.groups; ++g) {
    double m = -std::numeric_limits<double>::infinity();
    for (size_t i = 0; i < rows.size(); ++i) {
      double acc = 0;
      for (int j = 0; j < d; ++j) acc += double(x.q[size_t(g) * d + j]) * x.k[size_t(rows[i]) * d + j];
      s[i] = acc / std::sqrt(double(d));
      m = std::max(m, s[i]);
    }
    double denom = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const double p = std::exp(s[i] - m);
      denom += p;
      for (int j = 0; j < d; ++j) (*out)[size_t(g) * d + j] += p * x.v[size_t(rows[i]) * d + j];
    }
    for (int j = 0; j < d; ++j) (*out)[size_t(g) * d + j] /= denom;
    (*lse)[g] = m + std::log(denom);
  }
}

double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

double abs_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0;
  for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, std::abs(double(got[i]) - ref[i]));
  return err;
}

// Checks (out, lse) of `groups` heads over `rows` against both references.
void check_attention(const Data& x, int groups, const std::vector<int64_t>& rows, const std::vector<float>& out,
                     const std::vector<float>& lse, DType dtype, int n) {
  for (bool stored : {true, false}) {
    Data xg = stored ? x.as_stored() : x;
    xg.groups = groups;
    std::vector<double> ro, rl;
    reference_attention(xg, rows, &ro, &rl);
    const double tol = stored ? kKernelTolerance : input_tolerance(dtype);
    EXPECT_LE(relative_error(out, ro), tol) << (stored ? "stored" : "input") << " groups " << groups << " n " << n;
    EXPECT_LE(abs_error(lse, rl), tol) << (stored ? "stored" : "input") << " groups " << groups << " n " << n;
  }
}

// Dense attention of `groups` heads over rows [begin, begin + n), checked.
void check_dense(HalideKernels& hk, const Data& x, int groups, int64_t begin, int n, DType dtype) {
  std::vector<float> out(size_t(groups) * size_t(x.d)), lse(static_cast<size_t>(groups));
  hk.dense_attention(x.q.data(), groups, x.ks.view(), x.vs.view(), begin, begin + n, out.data(), lse.data());
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) rows[size_t(i)] = begin + i;
  check_attention(x, groups, rows, out, lse, dtype, n);
}

// Partial attention of `groups` heads over the rows `ids`, checked.
void check_partial(HalideKernels& hk, const Data& x, int groups, const std::vector<int32_t>& ids, DType dtype) {
  std::vector<float> out(size_t(groups) * size_t(x.d)), lse(static_cast<size_t>(groups));
  const int n = int(ids.size());
  hk.partial_attention(x.q.data(), groups, x.ks.view(), x.vs.view(), ids.data(), n, out.data(), lse.data());
  check_attention(x, groups, std::vector<int64_t>(ids.begin(), ids.end()), out, lse, dtype, n);
}

std::string spec_name(const KernelSpec& s) {
  return "d" + std::to_string(s.head_dim) + "_g" + std::to_string(s.group_size) + "_" + dtype_name(s.kv_dtype);
}

// One kernel set per spec per process.
HalideKernels& kernels_for(const KernelSpec& spec, const HalideSchedule& sched = {}) {
  static std::map<std::string, std::unique_ptr<HalideKernels>> sets;
  std::string key = spec_name(spec);
  for (const std::string& name : halide_kernel_names(spec, sched)) key += " " + name;
  auto& slot = sets[key];
  if (!slot) slot = make_halide_kernel_set(spec, sched);
  return *slot;
}

const int kTokenCounts[] = {1, 7, 100, 640, 4096};
constexpr int64_t kRows = 5000;

// The specialisations (what changes the generated code): every group size at
// d=128 fp16; fp32 at group sizes 1, 4, 7 and 8; every head dim with fp32 and
// fp16; bf16 at d=128 g4. Token counts are runtime values, all tested per spec.
const KernelSpec kSpecs[] = {
    {128, 1, DType::f16}, {128, 4, DType::f16}, {128, 5, DType::f16}, {128, 7, DType::f16},
    {128, 8, DType::f16}, {128, 4, DType::f32}, {128, 7, DType::f32}, {128, 4, DType::bf16},
    {64, 1, DType::f32},  {64, 5, DType::f16},  {256, 1, DType::f16}, {256, 8, DType::f32},
};

class HalideKernelsNumeric : public ::testing::TestWithParam<KernelSpec> {};

TEST_P(HalideKernelsNumeric, GatheredDotMatchesFloat64) {
  const KernelSpec spec = GetParam();
  HalideKernels& hk = kernels_for(spec);
  const Data x = make_data(spec.head_dim, spec.group_size, spec.kv_dtype, kRows, 11);
  const int d = spec.head_dim;
  std::mt19937 rng(3);
  // max |s - ref| / (|q| |k|) against keys as given (`k`).
  auto score_error = [&](const std::vector<float>& k, const std::vector<int32_t>& ids, int groups,
                         const std::vector<float>& got) {
    double err = 0;
    for (int g = 0; g < groups; ++g)
      for (size_t i = 0; i < ids.size(); ++i) {
        double dot = 0, qq = 0, kk = 0;
        for (int j = 0; j < d; ++j) {
          const double a = x.q[size_t(g) * d + j], b = k[size_t(ids[i]) * d + j];
          dot += a * b;
          qq += a * a;
          kk += b * b;
        }
        err = std::max(err, std::abs(got[size_t(g) * ids.size() + i] - dot) / std::sqrt(qq * kk));
      }
    return err;
  };
  for (int groups : {1, spec.group_size}) {
    for (int n : kTokenCounts) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (auto& id : ids) id = int32_t(rng() % kRows);  // repeats allowed
      std::vector<float> got(size_t(groups) * n);
      hk.gathered_dot(x.q.data(), groups, x.ks.view(), ids.data(), n, got.data());
      EXPECT_LE(score_error(x.k_stored, ids, groups, got), kKernelTolerance) << "groups " << groups << " n " << n;
      EXPECT_LE(score_error(x.k, ids, groups, got), input_tolerance(spec.kv_dtype)) << "groups " << groups << " n " << n;
    }
  }
}

TEST_P(HalideKernelsNumeric, PartialAttentionMatchesFloat64) {
  const KernelSpec spec = GetParam();
  HalideKernels& hk = kernels_for(spec);
  const Data x = make_data(spec.head_dim, spec.group_size, spec.kv_dtype, kRows, 12);
  std::mt19937 rng(4);
  for (int groups : {1, spec.group_size}) {
    for (int n : kTokenCounts) {
      // Distinct ids in random order, as the index returns them.
      std::vector<int32_t> all(kRows);
      for (int i = 0; i < kRows; ++i) all[size_t(i)] = i;
      std::shuffle(all.begin(), all.end(), rng);
      check_partial(hk, x, groups, std::vector<int32_t>(all.begin(), all.begin() + n), spec.kv_dtype);
    }
  }
}

TEST_P(HalideKernelsNumeric, DenseAttentionMatchesFloat64) {
  const KernelSpec spec = GetParam();
  HalideKernels& hk = kernels_for(spec);
  const Data x = make_data(spec.head_dim, spec.group_size, spec.kv_dtype, kRows, 13);
  for (int groups : {1, spec.group_size}) {
    for (int n : kTokenCounts) {
      check_dense(hk, x, groups, 3, n, spec.kv_dtype);  // not from row 0: the kernel sees an offset view
    }
  }
}

// Partial attentions over any split of all tokens, merged, equal the full
// attention (n-way merge kernel and the pairwise runtime merge, in shuffled
// order: the merge is associative and commutative).
TEST_P(HalideKernelsNumeric, MergedSplitsEqualFullAttention) {
  const KernelSpec spec = GetParam();
  HalideKernels& hk = kernels_for(spec);
  const int d = spec.head_dim, G = spec.group_size;
  const int n = 4096;
  const Data x = make_data(d, G, spec.kv_dtype, n, 14);
  std::vector<float> full(size_t(G) * d), full_lse(static_cast<size_t>(G));
  hk.dense_attention(x.q.data(), G, x.ks.view(), x.vs.view(), 0, n, full.data(), full_lse.data());
  std::mt19937 rng(5);
  for (int trial = 0; trial < 4; ++trial) {
    // A random partition of the tokens into `parts` sets (some may be empty).
    // Trial 0: four parts, the first two empty.
    const int parts = trial == 0 ? 4 : 1 + int(rng() % 6);
    std::vector<std::vector<int32_t>> sets(static_cast<size_t>(parts));
    for (int t = 0; t < n; ++t) sets[trial == 0 ? 2 + rng() % 2 : rng() % parts].push_back(t);
    std::vector<float> o_parts(size_t(parts) * G * d), l_parts(size_t(parts) * G);
    for (int p = 0; p < parts; ++p)
      hk.partial_attention(x.q.data(), G, x.ks.view(), x.vs.view(), sets[size_t(p)].data(),
                           int(sets[size_t(p)].size()), &o_parts[size_t(p) * G * d], &l_parts[size_t(p) * G]);
    std::vector<float> merged(size_t(G) * d), merged_lse(static_cast<size_t>(G));
    hk.merge_ln(o_parts.data(), l_parts.data(), parts, G, merged.data(), merged_lse.data());
    const std::vector<double> ref_o(full.begin(), full.end()), ref_l(full_lse.begin(), full_lse.end());
    EXPECT_LE(relative_error(merged, ref_o), 1e-5) << "parts " << parts;
    EXPECT_LE(abs_error(merged_lse, ref_l), 1e-5) << "parts " << parts;
    // Pairwise, in another order.
    std::vector<int> order(static_cast<size_t>(parts));
    for (int p = 0; p < parts; ++p) order[size_t(p)] = p;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> acc(size_t(G) * d, 0.0f), acc_lse(size_t(G), -std::numeric_limits<float>::infinity());
    for (int p : order) merge_partials_ln(acc.data(), acc_lse.data(), &o_parts[size_t(p) * G * d], &l_parts[size_t(p) * G], G, d);
    EXPECT_LE(relative_error(acc, ref_o), 1e-5) << "parts " << parts;
    EXPECT_LE(abs_error(acc_lse, ref_l), 1e-5) << "parts " << parts;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, HalideKernelsNumeric, ::testing::ValuesIn(kSpecs),
                         [](const ::testing::TestParamInfo<KernelSpec>& i) { return spec_name(i.param); });

// Every -inf part is ignored; all-empty gives o = 0, lse = -inf; merging is
// associative: ((a, b), c) == (a, (b, c)) == merge of all three.
TEST(HalideMerge, EmptyPartsAndAssociativity) {
  const int d = 64, H = 3;
  HalideKernels& hk = kernels_for({d, 1, DType::f32});
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> o(size_t(3) * H * d), l(size_t(3) * H);
  for (auto& e : o) e = normal(rng);
  for (auto& e : l) e = 3.0f * normal(rng);
  l[H + 1] = -std::numeric_limits<float>::infinity();  // part 1 head 1 empty
  std::vector<float> all(size_t(H) * d), all_l(static_cast<size_t>(H));
  hk.merge_ln(o.data(), l.data(), 3, H, all.data(), all_l.data());
  // ((0, 1), 2)
  std::vector<float> ab(size_t(H) * d), ab_l(static_cast<size_t>(H)), left(size_t(H) * d), left_l(static_cast<size_t>(H));
  hk.merge_ln(o.data(), l.data(), 2, H, ab.data(), ab_l.data());
  std::vector<float> pair_o(ab), pair_l(ab_l);
  pair_o.insert(pair_o.end(), o.begin() + 2 * H * d, o.end());
  pair_l.insert(pair_l.end(), l.begin() + 2 * H, l.end());
  hk.merge_ln(pair_o.data(), pair_l.data(), 2, H, left.data(), left_l.data());
  // (0, (1, 2))
  std::vector<float> bc(size_t(H) * d), bc_l(static_cast<size_t>(H)), right(size_t(H) * d), right_l(static_cast<size_t>(H));
  hk.merge_ln(o.data() + H * d, l.data() + H, 2, H, bc.data(), bc_l.data());
  std::vector<float> pair2_o(o.begin(), o.begin() + H * d), pair2_l(l.begin(), l.begin() + H);
  pair2_o.insert(pair2_o.end(), bc.begin(), bc.end());
  pair2_l.insert(pair2_l.end(), bc_l.begin(), bc_l.end());
  hk.merge_ln(pair2_o.data(), pair2_l.data(), 2, H, right.data(), right_l.data());
  const std::vector<double> ref_o(all.begin(), all.end()), ref_l(all_l.begin(), all_l.end());
  EXPECT_LE(relative_error(left, ref_o), 1e-6);
  EXPECT_LE(relative_error(right, ref_o), 1e-6);
  EXPECT_LE(abs_error(left_l, ref_l), 1e-5);
  EXPECT_LE(abs_error(right_l, ref_l), 1e-5);
  // Against float64: lse = log(sum exp(l_p)), o = sum exp(l_p - lse) o_p.
  for (int h = 0; h < H; ++h) {
    double m = -1e300;
    for (int p = 0; p < 3; ++p)
      if (std::isfinite(l[size_t(p) * H + h])) m = std::max(m, double(l[size_t(p) * H + h]));
    double tot = 0;
    for (int p = 0; p < 3; ++p)
      if (std::isfinite(l[size_t(p) * H + h])) tot += std::exp(l[size_t(p) * H + h] - m);
    EXPECT_NEAR(all_l[size_t(h)], m + std::log(tot), 1e-5);
    for (int j = 0; j < d; ++j) {
      double ref = 0;
      for (int p = 0; p < 3; ++p)
        if (std::isfinite(l[size_t(p) * H + h]))
          ref += std::exp(l[size_t(p) * H + h] - m) / tot * o[(size_t(p) * H + h) * d + j];
      EXPECT_NEAR(all[size_t(h) * d + j], ref, 1e-5);
    }
  }
  // All parts empty.
  std::vector<float> empty_l(size_t(2) * H, -std::numeric_limits<float>::infinity());
  hk.merge_ln(o.data(), empty_l.data(), 2, H, all.data(), all_l.data());
  for (int h = 0; h < H; ++h) {
    EXPECT_EQ(all_l[size_t(h)], -std::numeric_limits<float>::infinity());
    for (int j = 0; j < d; ++j) EXPECT_EQ(all[size_t(h) * d + j], 0.0f);
  }
}

// Non-default schedule knobs (small blocks, odd unroll, other widths) give
// the same numbers: many blocks, ragged last block, tails of every loop.
TEST(HalideSchedules, NonDefaultKnobsStayCorrect) {
  const KernelSpec spec{128, 4, DType::f16};
  HalideSchedule s;
  s.vector_width = 4;
  s.split = 96;
  s.unroll = 3;
  s.d_tile = 3;
  s.parallel = true;
  HalideKernels& hk = kernels_for(spec, s);
  EXPECT_EQ(hk.schedule().split, 96);
  const Data x = make_data(128, 4, DType::f16, 1000, 21);
  for (int n : {1, 95, 97, 640, 1000}) check_dense(hk, x, 4, 0, n, DType::f16);
}

// Scores folded by halves (unroll x groups a power of two) with other shapes
// than the default: fewer pairs than lanes (g1, unroll 8 at 16 lanes), narrow
// vectors, ragged blocks on the thread pool; dense and gathered attention
// against float64.
TEST(HalideSchedules, FoldedScoresStayCorrect) {
  const KernelSpec spec{128, 4, DType::f16};
  const Data x = make_data(128, 4, DType::f16, 1000, 23);
  for (int variant = 0; variant < 2; ++variant) {
    HalideSchedule s;
    s.vector_width = variant == 0 ? 16 : 8;
    s.unroll = variant == 0 ? 8 : 2;  // pairs: g1 8 or 2, g4 32 or 8
    s.split = 200;
    s.parallel = variant == 1;
    HalideKernels& hk = kernels_for(spec, s);
    for (int groups : {1, 4})
      for (int n : {1, 7, 199, 201, 1000}) {
        SCOPED_TRACE("variant " + std::to_string(variant) + " groups " + std::to_string(groups));
        check_dense(hk, x, groups, 0, n, DType::f16);
        std::vector<int32_t> ids(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 389) % 1000);
        check_partial(hk, x, groups, ids, DType::f16);
      }
  }
}

// The streaming dense kernel (wider vectors, its own split) serves ranges of
// stream_mib MiB of K + V and more; below that the cached kernel runs. Both
// match float64, on either side of the switch and with ragged blocks.
TEST(HalideSchedules, StreamingDenseKernelMatchesFloat64) {
  for (DType dtype : {DType::f16, DType::f32}) {
    const KernelSpec spec{128, 4, dtype};
    HalideSchedule s;
    s.stream_vector = 32;
    s.stream_split = 1000;
    s.stream_mib = 1;  // 1 MiB of K + V: 2048 fp16 rows, 1024 fp32 rows
    HalideKernels& hk = kernels_for(spec, s);
    ASSERT_TRUE(hk.schedule().has_streaming_kernel());
    const int64_t from = dtype == DType::f16 ? 2048 : 1024;
    const Data x = make_data(128, 4, dtype, 5000, 29);
    for (int groups : {1, 4}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " groups " + std::to_string(groups));
      EXPECT_NE(hk.dense_kernel_name(groups, from - 1), hk.dense_kernel_name(groups, from));
      EXPECT_NE(hk.dense_kernel_name(groups, from).find("_v32_s1000_"), std::string::npos)
          << hk.dense_kernel_name(groups, from);
      for (int n : {int(from) - 1, int(from), 3001, 4990}) check_dense(hk, x, groups, 7, n, dtype);
    }
  }
  // Automatic: twice the vector width from 16 lanes up, with 4096-token
  // blocks; narrower targets build no streaming kernel.
  HalideSchedule wide;
  wide.vector_width = 16;
  EXPECT_EQ(wide.resolved(128).stream_vector, 32);
  EXPECT_EQ(wide.resolved(128).stream_split, 4096);
  EXPECT_TRUE(wide.resolved(128).has_streaming_kernel());
  EXPECT_EQ(halide_kernel_names({128, 4, DType::f16}, wide).size(), 9u);
  HalideSchedule narrow;
  narrow.vector_width = 8;
  EXPECT_FALSE(narrow.resolved(128).has_streaming_kernel());
  wide.stream_mib = 0;
  EXPECT_FALSE(wide.resolved(128).has_streaming_kernel());
  EXPECT_EQ(halide_kernel_names({128, 4, DType::f16}, wide).size(), 7u);
}

TEST(HalideKernels, ThreadSafeConcurrentCalls) {
  const KernelSpec spec{128, 4, DType::f16};
  HalideKernels& hk = kernels_for(spec);
  const Data x = make_data(128, 4, DType::f16, 2000, 31);
  std::vector<float> ref(4 * 128), ref_l(4);
  hk.dense_attention(x.q.data(), 4, x.ks.view(), x.vs.view(), 0, 2000, ref.data(), ref_l.data());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> out(4 * 128), lse(4);
      for (int rep = 0; rep < 50; ++rep) {
        hk.dense_attention(x.q.data(), 4, x.ks.view(), x.vs.view(), 0, 2000, out.data(), lse.data());
        if (out != ref || lse != ref_l) ++mismatches[size_t(t)];
      }
    });
  for (auto& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(HalideKernels, BadArgumentsAreErrors) {
  HalideKernels& hk = kernels_for({128, 4, DType::f16});
  const Data x = make_data(128, 4, DType::f16, 10, 1);
  std::vector<float> out(8 * 128), lse(8), scores(100);
  std::vector<int32_t> ids{1, 2, 3};
  auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.status();
    }
    return Status::ok;
  };
  EXPECT_EQ(status_of([&] { hk.gathered_dot(x.q.data(), 3, x.ks.view(), ids.data(), 3, scores.data()); }),
            Status::invalid_argument);
  EXPECT_EQ(status_of([&] {
              hk.dense_attention(x.q.data(), 4, x.ks.view(), x.vs.view(), 5, 11, out.data(), lse.data());
            }),
            Status::invalid_argument);
  RowStore f32(DType::f32, 128);
  f32.append_f32(x.k.data(), 10);
  EXPECT_EQ(status_of([&] { hk.gathered_dot(x.q.data(), 1, f32.view(), ids.data(), 3, scores.data()); }),
            Status::invalid_argument);
  EXPECT_EQ(status_of([&] { make_halide_kernels({100, 1, DType::f16}); }), Status::unsupported);
  // Empty inputs: no work, defined results.
  hk.partial_attention(x.q.data(), 4, x.ks.view(), x.vs.view(), ids.data(), 0, out.data(), lse.data());
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[5], 0.0f);
}

TEST(HalideNames, DeterministicAndComplete) {
  HalideSchedule s;
  s.vector_width = 8;
  s.split = 1024;
  s.unroll = 2;
  s.d_tile = 2;
  s.parallel = true;
  HalideKernelConfig c{HalideKernelKind::partial_attention, 128, 4, DType::f16, s};
  EXPECT_EQ(halide_kernel_name(c), "rattn_partial_attention_d128_g4_f16_v8_s1024_u2_t2_par1");
  c.kind = HalideKernelKind::gathered_dot;
  c.kv_dtype = DType::bf16;
  EXPECT_EQ(halide_kernel_name(c), "rattn_gathered_dot_d128_g4_bf16_v8_u2");
  c.kind = HalideKernelKind::merge;
  EXPECT_EQ(halide_kernel_name(c), "rattn_merge_d128_v8");
  // A kernel set names groups 1 and the group size, and the merge.
  const auto names = halide_kernel_names({128, 4, DType::f16}, s);
  EXPECT_EQ(names.size(), 7u);
  const auto one = halide_kernel_names({64, 1, DType::f32}, s);
  EXPECT_EQ(one.size(), 4u);
}

TEST(HalideSchedule, ReadsPlanKernelKeys) {
  ConcretePlan plan;
  plan.kernel = {{"halide.vector", 16}, {"halide.split", 256}, {"halide.parallel", 1},
                 {"halide.unroll", 3}, {"halide.dtile", 2}, {"cuda.warps", 8},
                 {"halide.stream_vector", 64}, {"halide.stream_split", 2048}, {"halide.stream_mib", 100}};
  const HalideSchedule s = HalideSchedule::from_plan(plan);
  EXPECT_EQ(s.vector_width, 16);
  EXPECT_EQ(s.split, 256);
  EXPECT_TRUE(s.parallel);
  EXPECT_EQ(s.unroll, 3);
  EXPECT_EQ(s.d_tile, 2);
  EXPECT_EQ(s.stream_vector, 64);
  EXPECT_EQ(s.stream_split, 2048);
  EXPECT_EQ(s.stream_mib, 100);
  // Resolution keeps the knobs valid: the vector width divides head_dim.
  EXPECT_EQ(s.resolved(24).vector_width, 8);
  EXPECT_EQ(HalideSchedule{}.resolved(128).for_groups(4).unroll, HalideSchedule{}.resolved(128).vector_width >= 16 ? 4 : 2);
}

// A fresh cache directory: the first set compiles, a second process-level
// load comes from disk, a damaged file is rebuilt, and concurrent builders of
// the same kernels (threads and processes) all end with a loadable cache.
class HalideCacheDir : public ::testing::Test {
 protected:
  void SetUp() override {
    old_ = std::getenv("RATTN_CACHE_DIR") ? std::getenv("RATTN_CACHE_DIR") : "";
    std::string tmpl = fs::temp_directory_path().string() + "/rattn-halide-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    setenv("RATTN_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    setenv("RATTN_CACHE_DIR", old_.c_str(), 1);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  int so_files() const {
    int count = 0;
    for (auto& e : fs::directory_iterator(dir_))
      if (e.path().extension() == ".so") ++count;
    return count;
  }
  std::string dir_, old_;
};

// Kernels in a default set for `spec` (on AVX-512 hosts it includes the
// streaming dense kernels).
int set_size(const KernelSpec& spec) { return int(halide_kernel_configs(spec).size()); }

TEST_F(HalideCacheDir, CompilesThenLoadsFromDiskAndRepairs) {
  const KernelSpec spec{64, 1, DType::f32};
  halide_clear_memory_cache();
  const HalideCacheStats s0 = halide_cache_stats();
  auto a = make_halide_kernel_set(spec);
  const HalideCacheStats s1 = halide_cache_stats();
  EXPECT_EQ(s1.compiled - s0.compiled, set_size(spec));
  EXPECT_EQ(so_files(), set_size(spec));
  for (auto& e : fs::directory_iterator(dir_))
    if (e.path().extension() == ".so") {
      EXPECT_NE(e.path().filename().string().find("rattn_"), std::string::npos);
      EXPECT_NE(e.path().filename().string().find("_d64_"), std::string::npos);
    }
  halide_clear_memory_cache();
  auto b = make_halide_kernel_set(spec);
  const HalideCacheStats s2 = halide_cache_stats();
  EXPECT_EQ(s2.loaded_from_disk - s1.loaded_from_disk, set_size(spec));
  EXPECT_EQ(s2.compiled, s1.compiled);
  // Damage one file: it is rebuilt, not loaded.
  for (auto& e : fs::directory_iterator(dir_))
    if (e.path().extension() == ".so" && e.path().filename().string().find("merge") != std::string::npos)
      write_file_atomic(e.path().string(), "not a shared object");
  halide_clear_memory_cache();
  auto c = make_halide_kernel_set(spec);
  const HalideCacheStats s3 = halide_cache_stats();
  EXPECT_EQ(s3.compiled - s2.compiled, 1);
  // A damaged runtime object (linked into every new kernel) is rebuilt too.
  for (auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("halide_runtime-", 0) == 0 || (e.path().extension() == ".so" && name.find("gathered") != std::string::npos))
      write_file_atomic(e.path().string(), "damaged");
  }
  halide_clear_memory_cache();
  auto d = make_halide_kernel_set(spec);
  EXPECT_EQ(halide_cache_stats().compiled - s3.compiled, 1);
  std::vector<int32_t> ids{0, 5, 9};
  std::vector<float> sd(3), sa(3);
  const Data y = make_data(64, 1, DType::f32, 10, 3);
  d->gathered_dot(y.q.data(), 1, y.ks.view(), ids.data(), 3, sd.data());
  a->gathered_dot(y.q.data(), 1, y.ks.view(), ids.data(), 3, sa.data());
  EXPECT_EQ(sd, sa);
  // And the kernels from the three sets agree.
  const Data x = make_data(64, 1, DType::f32, 50, 2);
  std::vector<float> o1(64), o2(64), l1(1), l2(1);
  a->dense_attention(x.q.data(), 1, x.ks.view(), x.vs.view(), 0, 50, o1.data(), l1.data());
  c->dense_attention(x.q.data(), 1, x.ks.view(), x.vs.view(), 0, 50, o2.data(), l2.data());
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(l1, l2);
  halide_clear_memory_cache();
}

TEST_F(HalideCacheDir, ConcurrentProcessesShareOneCache) {
  const KernelSpec spec{64, 1, DType::f32};
  // The builders are fresh copies of this binary running only this test (a
  // plain fork of this process, which already runs threads, is not supported
  // by ThreadSanitizer); the variable below makes them builders of dir_.
  if (const char* shared = std::getenv("RATTN_TEST_BUILDER_CACHE")) {
    fs::remove_all(dir_);
    setenv("RATTN_CACHE_DIR", shared, 1);
    int rc = 0;
    try {
      auto k = make_halide_kernel_set(spec);
      const Data x = make_data(64, 1, DType::f32, 20, 2);
      std::vector<float> o(64), l(1);
      k->dense_attention(x.q.data(), 1, x.ks.view(), x.vs.view(), 0, 20, o.data(), l.data());
      rc = std::isfinite(l[0]) ? 0 : 2;
    } catch (...) {
      rc = 1;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  halide_clear_memory_cache();
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back("RATTN_TEST_BUILDER_CACHE=" + dir_);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=HalideCacheDir.ConcurrentProcessesShareOneCache";
  char* argv[] = {self.data(), filter.data(), nullptr};
  std::vector<pid_t> kids;
  for (int p = 0; p < 2; ++p) {
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(so_files(), set_size(spec));
  // No scratch directories or temp files left behind.
  for (auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name.rfind(".tmp", 0) != 0) << name;
  }
  // This process loads every kernel from the disk cache.
  const HalideCacheStats s0 = halide_cache_stats();
  auto k = make_halide_kernel_set(spec);
  EXPECT_EQ(halide_cache_stats().loaded_from_disk - s0.loaded_from_disk, set_size(spec));
  EXPECT_EQ(halide_cache_stats().compiled, s0.compiled);
  halide_clear_memory_cache();
}

HalideKernelConfig merge_config() {
  for (const auto& c : halide_kernel_configs({64, 1, DType::f32}, HalideSchedule{}))
    if (c.kind == HalideKernelKind::merge) return c;
  throw std::runtime_error("no merge kernel in the set");
}

std::vector<std::string> scratch_entries(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.find(".tmp.") != std::string::npos) out.push_back(name);
  }
  return out;
}

// The compiler driver's output reaches the log callback, not stderr; the
// build fails with the output's end in its message and leaves no scratch
// directory behind.
TEST_F(HalideCacheDir, CompilerErrorsGoThroughTheLog) {
  const std::string fake = dir_ + "/fake-cxx";
  write_file_atomic(fake, "#!/bin/sh\necho 'fake-cxx: error: no linker today' >&2\necho 'fake-cxx: second line'\nexit 3\n");
  fs::permissions(fake, fs::perms::owner_all);
  setenv("RATTN_CXX", fake.c_str(), 1);
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> seen;
  set_log_sink([&](LogLevel level, const char* text) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(level, text);
  });
  // Whatever reaches fd 2 meanwhile lands in a file.
  const std::string err_path = dir_ + "/stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ::dup2(fd, 2);
  ::close(fd);
  halide_clear_memory_cache();
  std::string message;
  Status status = Status::ok;
  try {
    internal::get_kernel(merge_config());
  } catch (const Error& e) {
    message = e.what();
    status = e.status();
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  set_log_sink(nullptr);
  unsetenv("RATTN_CXX");
  halide_clear_memory_cache();

  EXPECT_EQ(status, Status::internal);
  EXPECT_NE(message.find("exit status 3"), std::string::npos) << message;
  EXPECT_NE(message.find("fake-cxx: error: no linker today"), std::string::npos) << message;
  bool logged = false;
  for (const auto& [level, text] : seen)
    logged |= level == LogLevel::error && text.find("fake-cxx: error: no linker today") != std::string::npos &&
              text.find("fake-cxx: second line") != std::string::npos;
  EXPECT_TRUE(logged) << seen.size() << " log messages";
  EXPECT_EQ(read_file(err_path).find("fake-cxx"), std::string::npos) << read_file(err_path);
  EXPECT_TRUE(scratch_entries(dir_).empty());
  EXPECT_EQ(so_files(), 0);
}

// Scratch left by killed builds goes when the cache is opened: only entries
// older than 10 minutes whose process is gone (or older than a day).
TEST_F(HalideCacheDir, StaleScratchOfKilledBuildsIsRemoved) {
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string d = std::to_string(dead), me = std::to_string(::getpid());
  const auto now = fs::file_time_type::clock::now();
  auto make = [&](const std::string& name, std::chrono::minutes age, bool directory) {
    const fs::path p = fs::path(dir_) / name;
    if (directory) {
      fs::create_directories(p);
      write_file_atomic((p / "kernel.o").string(), "partial");
    } else {
      write_file_atomic(p.string(), "partial");
    }
    fs::last_write_time(p, now - age);
  };
  using std::chrono::minutes;
  make(".tmp-" + d + "-aaaaaa", minutes(60), true);             // dead, old: removed
  make("k.so.tmp." + d + ".0.12345", minutes(60), false);       // dead, old: removed
  make(".tmp-" + me + "-cccccc", minutes(48 * 60), true);       // alive, older than a day: removed
  make(".tmp-" + d + "-bbbbbb", minutes(1), true);              // dead but young: kept
  make(".tmp-" + me + "-dddddd", minutes(60), true);            // alive: kept
  make("notes.tmp", minutes(60), false);                        // not scratch: kept
  halide_clear_memory_cache();
  internal::get_kernel(merge_config());  // the first open of this cache cleans it
  auto left = scratch_entries(dir_);
  std::vector<std::string> kept{".tmp-" + d + "-bbbbbb", ".tmp-" + me + "-dddddd"};
  std::sort(left.begin(), left.end());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(left, kept);
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "notes.tmp"));
  EXPECT_EQ(internal::remove_stale_scratch(dir_), 0);
  halide_clear_memory_cache();
}

TEST_F(HalideCacheDir, AheadOfTimeLibrary) {
  HalideSchedule s;
  const auto files = compile_halide_kernels_aot({64, 1, DType::f32}, s, dir_ + "/aot");
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(fs::path(files[0]).filename().string(), "librattn_kernels.a");
  for (const auto& f : files) EXPECT_GT(fs::file_size(f), 0u) << f;
  // The header declares the kernel; the archive holds its symbol.
  const auto names = halide_kernel_names({64, 1, DType::f32}, s);
  const std::string header = read_file(dir_ + "/aot/" + names[0] + ".h");
  EXPECT_NE(header.find("int " + names[0] + "("), std::string::npos);
  const std::string archive = read_file(files[0]);
  for (const auto& n : names) EXPECT_NE(archive.find(n + "_argv"), std::string::npos) << n;
  EXPECT_NE(archive.find("halide_malloc"), std::string::npos);
}

}  // namespace
}  // namespace rattn
