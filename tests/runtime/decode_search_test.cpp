// The search knobs reach the decode step: search grouping (search_many) and
// shared traversal codes give the per-head outputs; the plan's and each
// layer's decode-search values (patience, code dims, seeds, partial
// expansion) reach the searches, through the C++ and the C API.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "rattn.h"
#include "runtime/runtime.h"
#include "tests/runtime/api_test_util.h"
#include "tests/runtime/decode_test_util.h"
#include "tests/runtime/test_util.h"

namespace {

using rattn::testing::cpp_config;
using rattn::testing::decode_run;
using rattn::testing::prefill_prompt;
using rattn::testing::temp_path;
using Stream = rattn::testing::TokenStream;

TEST(DecodeGrouping, AutomaticChoiceKeepsEveryThreadBusy) {
  EXPECT_EQ(rattn::searches_per_item(4, 1, 1), 4);  // one thread: the whole group in one item
  EXPECT_EQ(rattn::searches_per_item(4, 1, 2), 2);  // two threads: two items of two
  EXPECT_EQ(rattn::searches_per_item(4, 1, 4), 1);
  EXPECT_EQ(rattn::searches_per_item(4, 1, 16), 1);
  EXPECT_EQ(rattn::searches_per_item(4, 8, 8), 4);  // Llama-3-8B layer on 8 threads
  EXPECT_EQ(rattn::searches_per_item(4, 8, 16), 2);
  EXPECT_EQ(rattn::searches_per_item(6, 1, 2), 3);
  EXPECT_EQ(rattn::searches_per_item(6, 1, 4), 1);  // 6 / 4 is no divisor: one head per item
  EXPECT_EQ(rattn::searches_per_item(1, 4, 1), 1);
  auto c = cpp_config(4, 1, 16, 4, 8);
  c.searches_per_item = 3;  // does not divide the group of 4
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  c.searches_per_item = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The group's searches in one item (search_many) give exactly the outputs of
// one item per query head, through the projected graph and with insertion:
// one prefilled state, loaded into runtimes that differ only in grouping.
TEST(DecodeGrouping, GroupedSearchesEqualPerHeadItems) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 60;
  const int64_t prompt = 2200;  // 2180 offloaded keys: above the graph threshold (2048)
  Stream s(hq, hkv, d, prompt + steps, 5);
  const std::string path = temp_path("grouping");
  {
    auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
    rattn::Sequence seq(rt);
    prefill_prompt(seq, s, prompt);
    seq.save(path);
  }
  std::vector<std::vector<float>> runs;
  for (int per_item : {1, 2, 4}) {
    for (int threads : {1, 3}) {
      auto c = cpp_config(hq, hkv, d, sinks, window);
      c.searches_per_item = per_item;
      c.threads = threads;
      auto seq = rattn::Sequence::load(std::make_shared<const rattn::Runtime>(c), path);
      seq->set_profiling(true);
      runs.push_back(decode_run(*seq, s, prompt, steps));
      const rattn::DecodeProfile prof = seq->profile();
      EXPECT_EQ(prof.steps, steps);
      EXPECT_GT(prof.search_ms, 0);
      EXPECT_GT(prof.insert_ms, 0);  // tokens left the window and were inserted
      EXPECT_GE(prof.total_ms, prof.prepare_ms + prof.merge_ms);
    }
  }
  std::remove(path.c_str());
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), runs[0].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[0].data(), runs[0].size() * sizeof(float)), 0) << "run " << i;
  }
  // Not a vacuous equality: the outputs are finite and not all zero.
  double norm = 0;
  for (float x : runs[0]) norm += double(x) * x;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 1.0);
}

// With traversal codes, a GQA group's indexes walk one set of codes per KV
// head, which the decode step updates before its work items insert and
// search: the outputs equal those of indexes with codes of their own,
// whatever the grouping and thread count (per-head items on 3 threads search
// one group's indexes while another item inserts into its own), and the
// memory counts the codes once per KV head instead of once per index.
TEST(DecodeGrouping, SharedTraversalCodesEqualOwnCodes) {
  const int hq = 8, hkv = 2, d = 32, sinks = 4, window = 16, steps = 60;
  const int64_t prompt = 2200;
  Stream s(hq, hkv, d, prompt + steps, 9);
  const std::string path = temp_path("shared-codes");
  {
    auto rt = std::make_shared<const rattn::Runtime>(cpp_config(hq, hkv, d, sinks, window));
    rattn::Sequence seq(rt);
    prefill_prompt(seq, s, prompt);
    seq.save(path);
  }
  struct Variant {
    bool share;
    int per_item, threads, insert_batch;
  };
  std::vector<std::vector<float>> runs;
  std::vector<uint64_t> index_bytes;
  for (const Variant& v : {Variant{false, 4, 1, 1}, Variant{true, 4, 1, 1}, Variant{true, 1, 3, 1},
                           Variant{true, 2, 2, 1}, Variant{false, 1, 3, 5}, Variant{true, 1, 3, 5}}) {
    SCOPED_TRACE(::testing::Message() << "share " << v.share << " per item " << v.per_item << " threads "
                                      << v.threads << " insert batch " << v.insert_batch);
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.share_traversal_codes = v.share;
    c.searches_per_item = v.per_item;
    c.threads = v.threads;
    c.insert_batch = v.insert_batch;
    auto seq = rattn::Sequence::load(std::make_shared<const rattn::Runtime>(c), path);
    runs.push_back(decode_run(*seq, s, prompt, steps));
    index_bytes.push_back(seq->memory().index_bytes);
  }
  std::remove(path.c_str());
  // A fresh prefill shares them too (not only a load).
  std::vector<float> fresh[2];
  for (int share = 0; share < 2; ++share) {
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.share_traversal_codes = share == 1;
    rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
    prefill_prompt(seq, s, prompt);
    fresh[share] = decode_run(seq, s, prompt, steps);
  }
  ASSERT_EQ(fresh[1].size(), fresh[0].size());
  EXPECT_EQ(std::memcmp(fresh[1].data(), fresh[0].data(), fresh[0].size() * sizeof(float)), 0);
  // Runs 0-3 insert every step, 4-5 in batches of 5 (other tokens pending,
  // so other outputs): each against the own-codes run of its batch size.
  for (size_t i = 1; i < runs.size(); ++i) {
    const size_t base = i < 4 ? 0 : 4;
    if (i == base) continue;
    ASSERT_EQ(runs[i].size(), runs[base].size());
    EXPECT_EQ(std::memcmp(runs[i].data(), runs[base].data(), runs[base].size() * sizeof(float)), 0) << "run " << i;
  }
  double norm = 0;
  for (float x : runs[0]) norm += double(x) * x;
  EXPECT_TRUE(std::isfinite(norm));
  EXPECT_GT(norm, 1.0);
  // Own codes: 8 sets of >= 2200 rows x 64 B; shared: 2 sets.
  const uint64_t code_set = uint64_t(prompt - sinks - window) * 64;
  EXPECT_GE(index_bytes[0], index_bytes[1] + uint64_t(hq - hkv) * code_set);
}

// The outputs of 40 decode steps after a 3000-token prompt (4 query heads,
// one KV head, d 32, stream `stream_seed`) with the plan knobs `set` sets.
constexpr int kKnobSteps = 40;
std::vector<float> decode_with_plan(uint64_t stream_seed, const std::function<void(rattn::ConcretePlan&)>& set) {
  const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
  const int64_t prompt = 3000;
  Stream s(hq, hkv, d, prompt + kKnobSteps, stream_seed);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  set(c.plan);
  rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
  prefill_prompt(seq, s, prompt);
  return decode_run(seq, s, prompt, kKnobSteps);
}

// The plan's search_patience reaches the decode searches: a patience no
// walk can exhaust changes nothing, a patience of 1 stops walks early and
// so changes what is retrieved.
TEST(DecodeSearch, PlanSearchPatienceReachesTheSearches) {
  std::vector<float> outs[3];
  const int patience[3] = {0, 1 << 20, 1};
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(21, [&](rattn::ConcretePlan& p) { p.search_patience = patience[i]; });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  ASSERT_EQ(outs[2].size(), outs[0].size());
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[2].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.search_patience = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The plan's code_dims / code_coarse_dims reach the decode searches: the
// walk on projected codes (16 8-bit + 16 4-bit directions at d 32, one line)
// retrieves differently from the 8-bit codes of the raw keys, but the
// outputs stay close to them; sharing is skipped for projected codes (each
// head's fit its own queries), so asking for it changes nothing; bad shapes
// are refused.
TEST(DecodeSearch, PlanCodeDimsReachTheSearches) {
  std::vector<float> raw = decode_with_plan(23, [](rattn::ConcretePlan& p) { p.traversal_codes = true; });
  std::vector<float> projected[2];
  for (int share = 0; share < 2; ++share) {
    const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
    const int64_t prompt = 3000;
    Stream s(hq, hkv, d, prompt + kKnobSteps, 23);
    auto c = cpp_config(hq, hkv, d, sinks, window);
    c.plan.traversal_codes = true;
    c.plan.code_dims = 32;
    c.plan.code_coarse_dims = 16;
    c.share_traversal_codes = share == 1;
    rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
    prefill_prompt(seq, s, prompt);
    projected[share] = decode_run(seq, s, prompt, kKnobSteps);
    // One 64-byte row per key and query head, beside the graphs; each head's
    // search scratch holds a visited byte per key.
    EXPECT_GE(seq.memory().index_bytes, uint64_t(hq) * uint64_t(prompt - sinks - window) * (64 + 4 * 17)) << share;
    EXPECT_GE(seq.memory().scratch_bytes, uint64_t(hq) * uint64_t(prompt - sinks - window)) << share;
  }
  ASSERT_EQ(projected[0].size(), raw.size());
  EXPECT_EQ(std::memcmp(projected[1].data(), projected[0].data(), raw.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(projected[0].data(), raw.data(), raw.size() * sizeof(float)), 0);
  double dot = 0, nr = 0, np = 0;
  for (size_t i = 0; i < raw.size(); ++i) {
    dot += double(raw[i]) * projected[0][i];
    nr += double(raw[i]) * raw[i];
    np += double(projected[0][i]) * projected[0][i];
  }
  // Outputs and lse of 40 steps as one vector (0.9987 measured: 16 of the 32
  // directions are 4-bit here, far coarser than the 48 + 32 of d = 128).
  EXPECT_GT(dot / std::sqrt(nr * np), 0.995);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.code_dims = 33;  // above head_dim
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  c.plan.code_dims = 16;
  c.plan.code_coarse_dims = 17;  // above code_dims
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The plan's search_seeds reach the decode searches: the first step (no
// previous results) is the same with and without them, later steps retrieve
// differently (the seeded walks start elsewhere); a count above k takes
// every previous result and gives the same as exactly k; negative counts
// are refused.
TEST(DecodeSearch, PlanSearchSeedsReachTheSearches) {
  // Seeds: none, more than any step finds, exactly k; the smallest queue,
  // where seeds matter most.
  std::vector<float> outs[3];
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(22, [&](rattn::ConcretePlan& p) {
      p.search_queue = p.top_k;
      p.search_seeds = i == 0 ? 0 : i == 1 ? 1 << 16 : int(p.top_k);
    });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  const size_t step_floats = outs[0].size() / kKnobSteps;
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), step_floats * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[1].data() + step_floats, outs[0].data() + step_floats,
                        (outs[0].size() - step_floats) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(outs[2].data(), outs[1].data(), outs[1].size() * sizeof(float)), 0);
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.plan.search_seeds = -1;
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// The C API: -1 keeps the plan's search_seeds, >= 0 overrides them, the
// info reports them, < -1 is refused naming the field.
TEST(DecodeSearch, SearchSeedsContextParamsAndInfo) {
  rattn::testing::expect_context_override("search_seeds", 32, &rattn_context_params::search_seeds,
                                          &rattn_context_info::search_seeds);
}

// The plan's partial expansion reaches the decode searches: a first count
// above any list's length changes nothing, a first count of 2 with whole
// lists for the best candidate only changes what is retrieved; negative
// values are refused.
TEST(DecodeSearch, PlanPartialExpansionReachesTheSearches) {
  std::vector<float> outs[3];
  const int first[3] = {0, 1 << 16, 2};
  for (int i = 0; i < 3; ++i)
    outs[i] = decode_with_plan(23, [&](rattn::ConcretePlan& p) {
      p.search_expand_first = first[i];
      p.search_full_expand = 1;
    });
  ASSERT_EQ(outs[1].size(), outs[0].size());
  ASSERT_EQ(outs[2].size(), outs[0].size());
  EXPECT_EQ(std::memcmp(outs[1].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(outs[2].data(), outs[0].data(), outs[0].size() * sizeof(float)), 0);
  for (int bad = 0; bad < 2; ++bad) {
    auto c = cpp_config(4, 1, 32, 4, 16);
    (bad == 0 ? c.plan.search_expand_first : c.plan.search_full_expand) = -1;
    EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  }
}

TEST(DecodeSearch, PartialExpansionContextParamsAndInfo) {
  rattn::testing::expect_context_override("search_expand_first", 8, &rattn_context_params::search_expand_first,
                                          &rattn_context_info::search_expand_first);
  rattn::testing::expect_context_override("search_full_expand", 50, &rattn_context_params::search_full_expand,
                                          &rattn_context_info::search_full_expand);
}

// Two global layers fed the same stream, the plan set by `set`: each
// layer's outputs of kKnobSteps decode steps.
std::array<std::vector<float>, 2> decode_two_layers(const std::function<void(rattn::ConcretePlan&)>& set) {
  const int hq = 4, hkv = 1, d = 32, sinks = 4, window = 16;
  const int64_t prompt = 3000;
  Stream s(hq, hkv, d, prompt + kKnobSteps, 29);
  auto c = cpp_config(hq, hkv, d, sinks, window);
  c.layout.num_layers = 2;
  c.layout.layers.assign(2, rattn::LayerSpec{});
  set(c.plan);
  rattn::Sequence seq(std::make_shared<const rattn::Runtime>(c));
  const auto pq = s.prefix(s.q, s.hq, prompt), pk = s.prefix(s.k, s.hkv, prompt), pv = s.prefix(s.v, s.hkv, prompt);
  for (int layer = 0; layer < 2; ++layer) seq.prefill(layer, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
  std::array<std::vector<float>, 2> outs;
  std::vector<float> out(size_t(hq) * size_t(d)), lse(static_cast<size_t>(hq));
  for (int step = 0; step < kKnobSteps; ++step) {
    const int64_t t = prompt + step;
    const auto q = s.token(s.q, s.hq, t), k = s.token(s.k, s.hkv, t), v = s.token(s.v, s.hkv, t);
    for (int layer = 0; layer < 2; ++layer) {
      seq.decode(layer, q.data(), k.data(), v.data(), rattn::DType::f32, out.data(), lse.data());
      outs[size_t(layer)].insert(outs[size_t(layer)].end(), out.begin(), out.end());
      outs[size_t(layer)].insert(outs[size_t(layer)].end(), lse.begin(), lse.end());
    }
  }
  return outs;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A layer's own decode-search values (`layer N { ... }`) reach that layer's
// searches and no other: partial expansion 2:1 on layer 1 alone leaves
// layer 0 as in the plain plan, and gives layer 1 exactly what the same
// values plan-wide give it; a layer's own queue works likewise.
TEST(DecodeSearch, LayerSearchReachesOnlyItsLayer) {
  const auto plain = decode_two_layers([](rattn::ConcretePlan&) {});
  const auto own = decode_two_layers([](rattn::ConcretePlan& p) {
    p.layer_search[1] = {{"search_expand_first", 2}, {"search_full_expand", 1}};
  });
  const auto wide = decode_two_layers([](rattn::ConcretePlan& p) {
    p.search_expand_first = 2;
    p.search_full_expand = 1;
  });
  EXPECT_TRUE(same_bytes(own[0], plain[0]));
  EXPECT_FALSE(same_bytes(own[1], plain[1]));
  EXPECT_TRUE(same_bytes(own[1], wide[1]));
  EXPECT_FALSE(same_bytes(wide[0], plain[0]));
  const auto queue = decode_two_layers([](rattn::ConcretePlan& p) { p.layer_search[0] = {{"search_queue", 20}}; });
  EXPECT_FALSE(same_bytes(queue[0], plain[0]));
  EXPECT_TRUE(same_bytes(queue[1], plain[1]));
}

// A layer's own top_k and tail_samples reach that layer's step and no
// other: each layer gives exactly what the same value plan-wide gives it,
// and the other layer stays as in the plain plan.
TEST(DecodeSearch, LayerRetrievalReachesOnlyItsLayer) {
  const auto plain = decode_two_layers([](rattn::ConcretePlan&) {});
  const auto own = decode_two_layers([](rattn::ConcretePlan& p) {
    p.layer_search[1] = {{"top_k", 8}};
    p.layer_search[0] = {{"tail_samples", 64}};
  });
  const auto wide_top_k = decode_two_layers([](rattn::ConcretePlan& p) { p.top_k = 8; });
  const auto wide_tail = decode_two_layers([](rattn::ConcretePlan& p) { p.tail_samples = 64; });
  EXPECT_FALSE(same_bytes(own[1], plain[1]));
  EXPECT_TRUE(same_bytes(own[1], wide_top_k[1]));
  EXPECT_FALSE(same_bytes(own[0], plain[0]));
  EXPECT_TRUE(same_bytes(own[0], wide_tail[0]));
  EXPECT_FALSE(same_bytes(wide_top_k[0], plain[0]));
  EXPECT_FALSE(same_bytes(wide_tail[1], plain[1]));
}

TEST(DecodeSearch, LayerSearchOfABadLayerOrKeyIsRefused) {
  auto c = cpp_config(4, 1, 32, 4, 16);
  c.layout.num_layers = 2;
  c.layout.layers.assign(2, rattn::LayerSpec{});
  c.layout.layers[1].global = false;
  c.layout.layers[1].sliding_window = 8;
  const std::vector<std::map<int, std::map<std::string, int>>> bad = {
      {{2, {{"search_queue", 40}}}},          // no such layer
      {{1, {{"search_queue", 40}}}},          // a sliding-window layer
      {{0, {{"graph_degree", 40}}}},          // not a per-layer key
      {{0, {{"top_k", 0}}}},                  // retrieves nothing in a retrieving plan
      {{0, {{"tail_samples", -1}}}},          // negative
      {{0, {{"search_queue", 0}}}},           // a queue of nothing
      {{0, {{"search_expand_first", -1}}}}};  // negative
  for (const auto& b : bad) {
    c.plan.layer_search = b;
    EXPECT_THROW(rattn::validate_config(c), rattn::Error);
  }
  c.plan.layer_search = {{0, {{"search_queue", 40}, {"top_k", 30}, {"tail_samples", 256}}}};
  EXPECT_NO_THROW(rattn::validate_config(c));
  c.plan.top_k = 0;  // retrieval off: a layer's own top_k has nothing to apply to
  EXPECT_THROW(rattn::validate_config(c), rattn::Error);
}

// Through the C API: rattn_context_get_layer_retrieval reports a layer's own
// top_k and tail_samples, else the plan-wide ones; a plan-wide override
// (rattn_context_params.top_k / tail_samples) holds for every layer.
TEST(DecodeSearch, LayerRetrievalThroughTheCApi) {
  const std::string plan =
      "model \"M\" { layers = 4; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192;\n"
      "  pattern = repeat [local(64), global]; }\n"
      "plan { top_k = 100; search_queue = 300; layer 3 { top_k = 200; tail_samples = 64; } }\n";
  rattn_context_params p = rattn::testing::reference_params(plan);
  auto resolved = [&](const rattn_context_params& params, int layer) {
    rattn_context* ctx = nullptr;
    std::pair<int32_t, int32_t> r{-1, -1};
    EXPECT_EQ(rattn_context_create(&params, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    if (!ctx) return r;
    EXPECT_EQ(rattn_context_get_layer_retrieval(ctx, layer, &r.first, &r.second), RATTN_OK) << rattn_context_last_error(ctx);
    int32_t k = 0, t = 0;
    EXPECT_EQ(rattn_context_get_layer_retrieval(ctx, 0, &k, &t), RATTN_INVALID_ARGUMENT);  // a local layer
    EXPECT_EQ(rattn_context_get_layer_retrieval(ctx, 4, &k, &t), RATTN_INVALID_ARGUMENT);
    EXPECT_EQ(rattn_context_get_layer_retrieval(ctx, 3, nullptr, &t), RATTN_INVALID_ARGUMENT);
    rattn_context_free(ctx);
    return r;
  };
  using R = std::pair<int32_t, int32_t>;
  EXPECT_EQ(resolved(p, 1), R(100, 0));
  EXPECT_EQ(resolved(p, 3), R(200, 64));
  p.top_k = 50;  // plan-wide: layer 3's own top_k goes, its tail_samples stays
  EXPECT_EQ(resolved(p, 3), R(50, 64));
  p.tail_samples = 0;
  EXPECT_EQ(resolved(p, 3), R(50, 0));
  EXPECT_EQ(rattn_context_get_layer_retrieval(nullptr, 3, nullptr, nullptr), RATTN_INVALID_ARGUMENT);
}

// Through the C API: the plan's `layer N { ... }` values, rattn_context_get_layer_search,
// a plan-wide override replacing the layers' own values of its key, and
// per-layer entries of rattn_context_params.
TEST(DecodeSearch, LayerSearchThroughTheCApi) {
  const std::string plan =
      "model \"M\" { layers = 4; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192;\n"
      "  pattern = repeat [local(64), global]; }\n"
      "plan { search_queue = 120; search_seeds = 10;\n"
      "  layer 3 { search_queue = 300; search_expand_first = 8; search_full_expand = 50; } }\n";
  rattn_context_params p = rattn::testing::reference_params(plan);
  EXPECT_EQ(p.layer_search, nullptr);
  EXPECT_EQ(p.n_layer_search, 0);
  auto resolved = [&](const rattn_context_params& params, int layer) {
    rattn_context* ctx = nullptr;
    rattn_layer_search s{-1, -1, -1, -1, -1};
    EXPECT_EQ(rattn_context_create(&params, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
    if (!ctx) return s;
    EXPECT_EQ(rattn_context_get_layer_search(ctx, layer, &s), RATTN_OK) << rattn_context_last_error(ctx);
    rattn_layer_search local{};
    EXPECT_EQ(rattn_context_get_layer_search(ctx, 0, &local), RATTN_INVALID_ARGUMENT);  // a local layer
    EXPECT_EQ(rattn_context_get_layer_search(ctx, 4, &local), RATTN_INVALID_ARGUMENT);
    rattn_context_free(ctx);
    return s;
  };
  auto expect = [](const rattn_layer_search& s, int layer, int queue, int seeds, int first, int full) {
    EXPECT_EQ(s.layer, layer);
    EXPECT_EQ(s.search_queue, queue);
    EXPECT_EQ(s.search_seeds, seeds);
    EXPECT_EQ(s.search_expand_first, first);
    EXPECT_EQ(s.search_full_expand, full);
  };
  expect(resolved(p, 1), 1, 120, 10, 0, 0);  // plan-wide
  expect(resolved(p, 3), 3, 300, 10, 8, 50);
  p.search_queue = 200;  // plan-wide override: layer 3's own queue goes, its expansion stays
  expect(resolved(p, 3), 3, 200, 10, 8, 50);
  const rattn_layer_search entries[] = {{1, -1, 0, 4, -1}, {3, 400, -1, -1, 0}};
  p.layer_search = entries;
  p.n_layer_search = 2;
  expect(resolved(p, 1), 1, 200, 0, 4, 0);
  expect(resolved(p, 3), 3, 400, 10, 8, 0);
  rattn_context* ctx = nullptr;
  const rattn_layer_search bad[][1] = {{{0, 100, -1, -1, -1}},    // a local layer
                                       {{5, 100, -1, -1, -1}},    // no such layer
                                       {{1, 0, -1, -1, -1}},      // queue 0
                                       {{1, -1, -2, -1, -1}}};    // below -1
  for (const auto& b : bad) {
    p.layer_search = b;
    p.n_layer_search = 1;
    EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
    EXPECT_EQ(ctx, nullptr);
    EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find("layer_search[0]"), std::string::npos);
  }
  p.layer_search = nullptr;
  p.n_layer_search = 1;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  p.n_layer_search = -1;
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
}

}  // namespace
