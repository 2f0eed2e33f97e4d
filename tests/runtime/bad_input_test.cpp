// Bad numbers through the C API: a NaN, an Inf, a value beyond the storage
// dtype or beyond 2^40 in q, k or v is refused with RATTN_INVALID_ARGUMENT
// naming the layer, tensor, head and token, and the sequence stays exactly as
// it was (its saved bytes are identical), so the caller can retry.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "rattn.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::random_normal;

constexpr int kHq = 4, kHkv = 2, kDim = 16;
constexpr int64_t kPrompt = 2600;  // > 2048 offloaded keys: a real graph index, not an exact scan
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct Prompt {
  std::vector<float> q, k, v;
  explicit Prompt(uint64_t seed)
      : q(random_normal(size_t(kHq) * kPrompt * kDim, seed)),
        k(random_normal(size_t(kHkv) * kPrompt * kDim, seed + 1)),
        v(random_normal(size_t(kHkv) * kPrompt * kDim, seed + 2)) {}
  // Element `e` of token `t` of head `h` in a [heads][kPrompt][kDim] tensor.
  static size_t at(int h, int64_t t, int e) { return (size_t(h) * kPrompt + size_t(t)) * kDim + size_t(e); }
};

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    rattn_context_params p = rattn_context_default_params();
    p.n_layers = 2;
    p.n_q_heads = kHq;
    p.n_kv_heads = kHkv;
    p.head_dim = kDim;
    p.sinks = 4;
    p.window = 16;
    p.top_k = 8;
    p.search_queue = 24;
    p.graph_degree = 8;
    p.query_neighbors = 8;
    p.kernels = RATTN_KERNELS_REFERENCE;
    p.use_gpu = false;
    p.n_threads = 2;
    ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    ASSERT_EQ(rattn_sequence_create(ctx, &seq), RATTN_OK);
  }
  void TearDown() override {
    rattn_sequence_free(seq);
    rattn_context_free(ctx);
  }
  std::string saved_bytes() {
    const std::string path = ::testing::TempDir() + "rattn_bad_input_" + std::to_string(::getpid()) + ".seq";
    EXPECT_EQ(rattn_sequence_save(seq, path.c_str()), RATTN_OK) << rattn_context_last_error(ctx);
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::remove(path.c_str());
    return bytes;
  }
  void expect_refused(rattn_status got, const std::string& needle) {
    EXPECT_EQ(got, RATTN_INVALID_ARGUMENT) << rattn_status_string(got);
    const std::string msg = rattn_context_last_error(ctx);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
    EXPECT_NE(msg.find("nothing was changed"), std::string::npos) << "message: " << msg;
  }
  rattn_status prefill(int layer, const Prompt& p, rattn_dtype t = RATTN_F32) {
    return rattn_sequence_prefill(seq, layer, kPrompt, p.q.data(), p.k.data(), p.v.data(), t);
  }
  rattn_context* ctx = nullptr;
  rattn_sequence* seq = nullptr;
};

TEST_F(BadInput, PrefillRefusesEachKindOfBadValueAndAcceptsTheCorrectedRetry) {
  const Prompt good(11);
  ASSERT_EQ(prefill(0, good), RATTN_OK) << rattn_context_last_error(ctx);
  const std::string before = saved_bytes();
  struct Case {
    char tensor;
    int head;
    int64_t token;
    int element;
    float value;
    const char* why;
  };
  const Case cases[] = {
      {'k', 1, 17, 3, kNaN, "value nan"},
      {'q', 2, kPrompt - 1, 0, kNaN, "value nan"},
      {'v', 0, 2000, 15, kInf, "value inf"},
      {'v', 1, 5, 1, -kInf, "value -inf"},
      {'k', 0, 900, 7, 1e30f, "value 1e+30 overflows the f16 storage (largest finite 65504)"},
      {'v', 0, 1, 0, 70000.0f, "value 70000 overflows the f16 storage"},
      {'q', 0, 3, 2, 1e13f, "value 1e+13 exceeds rattn's input range (|x| < 2^40)"},
  };
  for (const Case& c : cases) {
    Prompt bad = good;
    std::vector<float>& t = c.tensor == 'q' ? bad.q : c.tensor == 'k' ? bad.k : bad.v;
    t[Prompt::at(c.head, c.token, c.element)] = c.value;
    SCOPED_TRACE(std::string(1, c.tensor) + " " + c.why);
    expect_refused(prefill(1, bad), "layer 1, " + std::string(1, c.tensor) + " head " + std::to_string(c.head) +
                                        ", token " + std::to_string(c.token) + ", element " +
                                        std::to_string(c.element) + ": " + c.why);
    EXPECT_EQ(rattn_sequence_n_tokens(seq, 1), 0);
  }
  // Every value NaN: refused at the first.
  Prompt all_nan = good;
  std::fill(all_nan.k.begin(), all_nan.k.end(), kNaN);
  expect_refused(prefill(1, all_nan), "k head 0, token 0, element 0: value nan");
  EXPECT_EQ(saved_bytes(), before);
  // The largest value fp16 holds is accepted; the retry with good data works.
  Prompt edge = good;
  edge.v[Prompt::at(1, 100, 4)] = 65504.0f;
  EXPECT_EQ(prefill(1, edge), RATTN_OK) << rattn_context_last_error(ctx);
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 1), kPrompt);
}

TEST_F(BadInput, Fp16AndBf16InputsAreCheckedToo) {
  const Prompt good(21);
  for (const rattn_dtype t : {RATTN_F16, RATTN_BF16}) {
    std::vector<uint16_t> q(good.q.size()), k(good.k.size()), v(good.v.size());
    const bool half = t == RATTN_F16;
    auto cvt = [&](const std::vector<float>& src, std::vector<uint16_t>& dst) {
      for (size_t i = 0; i < src.size(); ++i) dst[i] = half ? rattn::f32_to_f16(src[i]) : rattn::f32_to_bf16(src[i]);
    };
    cvt(good.q, q);
    cvt(good.k, k);
    cvt(good.v, v);
    v[Prompt::at(1, 40, 2)] = half ? uint16_t(0x7c00) : uint16_t(0x7f80);  // +Inf
    expect_refused(rattn_sequence_prefill(seq, 0, kPrompt, q.data(), k.data(), v.data(), t),
                   "v head 1, token 40, element 2: value inf");
    v[Prompt::at(1, 40, 2)] = half ? uint16_t(0x3c00) : uint16_t(0x3f80);  // 1.0
    if (!half) {
      // bf16 reaches past fp16's range: 2^17 cannot be stored as fp16.
      k[Prompt::at(0, 7, 1)] = uint16_t(0x4800);
      expect_refused(rattn_sequence_prefill(seq, 0, kPrompt, q.data(), k.data(), v.data(), t),
                     "k head 0, token 7, element 1: value 131072 overflows the f16 storage");
      k[Prompt::at(0, 7, 1)] = uint16_t(0x3f80);
    }
    q[Prompt::at(3, 0, 0)] = half ? uint16_t(0x7e00) : uint16_t(0x7fc0);  // NaN
    expect_refused(rattn_sequence_prefill(seq, 0, kPrompt, q.data(), k.data(), v.data(), t),
                   "q head 3, token 0, element 0: value nan");
    EXPECT_EQ(rattn_sequence_n_tokens(seq, 0), 0);
  }
}

TEST_F(BadInput, DecodeRefusesBadValuesAndTheNextGoodStepMatchesAnUntouchedCopy) {
  const Prompt good(31);
  ASSERT_EQ(prefill(0, good), RATTN_OK) << rattn_context_last_error(ctx);
  ASSERT_EQ(prefill(1, good), RATTN_OK) << rattn_context_last_error(ctx);
  rattn_sequence* copy = nullptr;
  ASSERT_EQ(rattn_sequence_clone(seq, &copy), RATTN_OK);
  const std::string before = saved_bytes();
  const auto q = random_normal(size_t(kHq) * kDim, 41), k = random_normal(size_t(kHkv) * kDim, 42),
             v = random_normal(size_t(kHkv) * kDim, 43);
  std::vector<float> out(size_t(kHq) * kDim, -7.0f), lse(kHq, -7.0f);
  for (int which = 0; which < 3; ++which) {
    auto bq = q, bk = k, bv = v;
    (which == 0 ? bq : which == 1 ? bk : bv)[size_t(kDim) + 5] = which == 2 ? 1e30f : kNaN;
    const std::string tensor = which == 0 ? "q" : which == 1 ? "k" : "v";
    expect_refused(rattn_sequence_decode(seq, 1, bq.data(), bk.data(), bv.data(), RATTN_F32, out.data(), lse.data()),
                   "decode: layer 1, " + tensor + " head 1, token " + std::to_string(kPrompt) + ", element 5");
    EXPECT_EQ(out[0], -7.0f) << "a refused step wrote its output";
  }
  EXPECT_EQ(rattn_sequence_n_tokens(seq, 1), kPrompt);
  EXPECT_EQ(saved_bytes(), before);
  // A batch with one bad sequence decodes none.
  auto bad_q = q;
  bad_q[3] = kInf;
  rattn_sequence* both[] = {copy, seq};
  const void* qs[] = {q.data(), bad_q.data()};
  const void* ks[] = {k.data(), k.data()};
  const void* vs[] = {v.data(), v.data()};
  std::vector<float> out2(out.size());
  float* outs[] = {out2.data(), out.data()};
  expect_refused(rattn_sequence_decode_batch(both, 2, 1, qs, ks, vs, RATTN_F32, outs, nullptr),
                 "decode_batch: sequence 1: decode: layer 1, q head 0");
  EXPECT_EQ(rattn_sequence_n_tokens(copy, 1), kPrompt);
  // The same good steps on the refused sequence and its untouched copy agree bit for bit.
  std::vector<float> a(out.size()), b(out.size());
  for (int step = 0; step < 40; ++step) {
    const auto sq = random_normal(size_t(kHq) * kDim, 100 + 3 * uint64_t(step));
    const auto sk = random_normal(size_t(kHkv) * kDim, 101 + 3 * uint64_t(step));
    const auto sv = random_normal(size_t(kHkv) * kDim, 102 + 3 * uint64_t(step));
    ASSERT_EQ(rattn_sequence_decode(seq, 1, sq.data(), sk.data(), sv.data(), RATTN_F32, a.data(), nullptr), RATTN_OK);
    ASSERT_EQ(rattn_sequence_decode(copy, 1, sq.data(), sk.data(), sv.data(), RATTN_F32, b.data(), nullptr), RATTN_OK);
    ASSERT_EQ(a, b) << "step " << step;
    for (float x : a) ASSERT_TRUE(std::isfinite(x));
  }
  rattn_sequence_free(copy);
}

TEST_F(BadInput, ARefusedChunkKeepsTheEarlierChunks) {
  const Prompt good(51);
  const int64_t half = kPrompt / 2;
  auto chunk = [&](const Prompt& p, int64_t first, int64_t n) {
    std::vector<float> q, k, v;
    for (int h = 0; h < kHq; ++h)
      q.insert(q.end(), p.q.begin() + long(Prompt::at(h, first, 0)), p.q.begin() + long(Prompt::at(h, first + n, 0)));
    for (int h = 0; h < kHkv; ++h) {
      k.insert(k.end(), p.k.begin() + long(Prompt::at(h, first, 0)), p.k.begin() + long(Prompt::at(h, first + n, 0)));
      v.insert(v.end(), p.v.begin() + long(Prompt::at(h, first, 0)), p.v.begin() + long(Prompt::at(h, first + n, 0)));
    }
    return rattn_sequence_prefill_chunk(seq, 0, n, q.data(), k.data(), v.data(), RATTN_F32);
  };
  Prompt bad = good;
  // A refused first chunk leaves no prompt behind: there is nothing to end.
  bad.v[Prompt::at(0, 3, 0)] = kInf;
  expect_refused(chunk(bad, 0, half), "v head 0, token 3");
  EXPECT_EQ(rattn_sequence_prefill_end(seq, 0), RATTN_INVALID_ARGUMENT);
  EXPECT_NE(std::string(rattn_context_last_error(ctx)).find("has no chunks"), std::string::npos);
  bad = good;
  ASSERT_EQ(chunk(good, 0, half), RATTN_OK);
  bad.k[Prompt::at(1, half + 10, 0)] = kNaN;
  // Tokens are numbered from the prompt's start, not the chunk's.
  expect_refused(chunk(bad, half, kPrompt - half), "k head 1, token " + std::to_string(half + 10));
  ASSERT_EQ(chunk(good, half, kPrompt - half), RATTN_OK);
  ASSERT_EQ(rattn_sequence_prefill_end(seq, 0), RATTN_OK) << rattn_context_last_error(ctx);
  // The same as one prefill of the good prompt.
  rattn_sequence* whole = nullptr;
  ASSERT_EQ(rattn_sequence_create(ctx, &whole), RATTN_OK);
  ASSERT_EQ(rattn_sequence_prefill(whole, 0, kPrompt, good.q.data(), good.k.data(), good.v.data(), RATTN_F32),
            RATTN_OK);
  const auto q = random_normal(size_t(kHq) * kDim, 61), k = random_normal(size_t(kHkv) * kDim, 62),
             v = random_normal(size_t(kHkv) * kDim, 63);
  std::vector<float> a(size_t(kHq) * kDim), b(a.size());
  ASSERT_EQ(rattn_sequence_decode(seq, 0, q.data(), k.data(), v.data(), RATTN_F32, a.data(), nullptr), RATTN_OK);
  ASSERT_EQ(rattn_sequence_decode(whole, 0, q.data(), k.data(), v.data(), RATTN_F32, b.data(), nullptr), RATTN_OK);
  EXPECT_EQ(a, b);
  rattn_sequence_free(whole);
}

}  // namespace
