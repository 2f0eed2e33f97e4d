#include "autotune/plan_measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "autotune/search_tuner.h"
#include "harness/index_harness.h"
#include "codegen/cuda/gpu_backend.h"
#include "codegen/halide/halide_kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/stats.h"
#include "runtime/data/synthetic.h"
#include "runtime/data/synthetic_docs.h"
#include "runtime/index/projected_graph.h"
#include "runtime/index/distance.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"
#include "runtime/thread_pool.h"

namespace rattn {

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// The exact attention of one test query, as sums weighted by
// exp(score - max_score): the whole context, and the exact part of each
// window (sinks, the window, and tokens past the index not yet in the
// window); the retrieved part is added per search setting.
// The tail estimate's sample for one window and tail_samples (the runtime's
// draw over the offloaded rows U = [sinks, the window's index end or static
// set)), summed whole; a setting's retrieved ids and threshold then need
// only the sample's top rows (see add_tail).
struct TailReference {
  int64_t rows = 0;                                  // |U|
  double sum = 0;                                    // sum of weights over the sample
  std::vector<double> wv;                            // [d] weighted values over the sample
  std::vector<std::pair<float, int32_t>> by_score;   // (score, position), score descending
};

struct QueryReference {
  double max_score = 0;
  std::vector<double> full;         // [d], normalised: the output of full attention
  std::vector<double> exact_sum;    // [windows]
  std::vector<double> exact_wv;     // [windows, d]
  std::vector<TailReference> tail;  // [windows x tails]; rows 0 where tail_samples is 0
};

struct SampleRef {
  std::vector<std::vector<QueryReference>> ref;  // [group][m]
};

// Adds the runtime's tail estimate (runtime/tail_estimate.cpp) to sum / wv:
// of the sample less the retrieved rows, those scoring above the weakest
// retrieved row are attended exactly, the others (B) scaled by
// (|U| - |retrieved| - |above|) / |B|. `retrieved`: the ids in U, ascending;
// `weakest`: their lowest score (+inf when none). `scratch`: 2 d doubles.
void add_tail(const GroupData& data, const TailReference& t, double scale, double max_score,
              const std::vector<int32_t>& retrieved, float weakest, double& sum, std::vector<double>& wv,
              std::vector<double>& scratch) {
  if (t.rows <= 0 || t.by_score.empty()) return;
  const int d = data.d;
  // The sample's rows at or above the weakest retrieved score: the retrieved
  // ones leave the sample, the others above it are exact; every other row is B.
  double off_sum = 0, above_sum = 0;
  scratch.assign(2 * size_t(d), 0.0);
  double* off_wv = scratch.data();
  double* above_wv = scratch.data() + d;
  int64_t n_off = 0, n_above = 0;
  for (const auto& [score, pos] : t.by_score) {
    if (!(score >= weakest)) break;
    const bool is_retrieved = std::binary_search(retrieved.begin(), retrieved.end(), pos);
    if (!is_retrieved && !(score > weakest)) continue;  // equal to the weakest: stays in B
    const double w = std::exp(double(score) * scale - max_score);
    const float* v = data.values.data() + size_t(pos) * size_t(d);
    off_sum += w;
    for (int x = 0; x < d; ++x) off_wv[size_t(x)] += w * double(v[x]);
    ++n_off;
    if (!is_retrieved) {
      above_sum += w;
      for (int x = 0; x < d; ++x) above_wv[size_t(x)] += w * double(v[x]);
      ++n_above;
    }
  }
  const int64_t n_below = int64_t(t.by_score.size()) - n_off;
  const int64_t unseen = t.rows - int64_t(retrieved.size()) - n_above;
  const double below_scale = n_below > 0 ? double(unseen) / double(n_below) : 0.0;
  sum += above_sum + below_scale * (t.sum - off_sum);
  for (int x = 0; x < d; ++x) wv[size_t(x)] += above_wv[size_t(x)] + below_scale * (t.wv[size_t(x)] - off_wv[size_t(x)]);
}

// Relative L2 errors of the outputs over `queries` (test indexes) and the
// group's heads: their mean and 95th percentile, per window and tail_samples
// (index wi x tails + ti), for retrieved ids[g][j] (j-th of `queries`).
// `window_keys`: each window's index size (its keys are the first ones).
struct OutputErrors {
  std::vector<double> mean, p95;
};
OutputErrors output_errors(const GroupData& data, int G, const SampleRef& ref,
                                  const std::map<int64_t, int64_t>& window_keys, int64_t sinks,
                                  const std::vector<int64_t>& windows, const std::vector<int64_t>& tails,
                                  const std::vector<int>& queries, const std::vector<harness::IdLists>& ids,
                                  ThreadPool& pool) {
  const int64_t n = data.tokens - int64_t(ref.ref.front().size());
  const int d = data.d;
  const double scale = 1.0 / std::sqrt(double(d));
  const RowsView keys = data.rounded_keys();
  const size_t slots = windows.size() * tails.size();
  // [head][slot][query]
  std::vector<std::vector<std::vector<double>>> per_head(static_cast<size_t>(G), std::vector<std::vector<double>>(slots));
  pool.parallel_for(G, [&](int64_t g) {
    std::vector<double> wv(static_cast<size_t>(d)), tail_wv(static_cast<size_t>(d)), tail_scratch;
    std::vector<int32_t> retrieved;
    for (size_t j = 0; j < queries.size(); ++j) {
      const int i = queries[j];
      const int64_t p = n + i;
      const QueryReference& r = ref.ref[size_t(g)][size_t(i)];
      const float* q = data.query(g, p);
      const std::vector<int32_t>& got = ids[size_t(g)][j];
      std::vector<float> dot(got.size());
      std::vector<double> w(got.size());
      for (size_t t = 0; t < got.size(); ++t) {
        dot[t] = internal::dot_row(q, keys, got[t]);
        w[t] = std::exp(double(dot[t]) * scale - r.max_score);
      }
      double norm_full = 0;
      for (int x = 0; x < d; ++x) norm_full += r.full[size_t(x)] * r.full[size_t(x)];
      for (size_t wi = 0; wi < windows.size(); ++wi) {
        // Retrieved: indexed keys outside the static set.
        const int64_t static_from = std::max(sinks, p - windows[wi] + 1);
        const int64_t index_end = window_keys.at(windows[wi]);
        double sum = r.exact_sum[wi];
        std::copy_n(r.exact_wv.begin() + std::ptrdiff_t(wi * size_t(d)), d, wv.begin());
        retrieved.clear();
        float weakest = std::numeric_limits<float>::infinity();
        for (size_t t = 0; t < got.size(); ++t) {
          const int64_t id = got[t];
          if (id < sinks || id >= std::min(index_end, static_from)) continue;
          sum += w[t];
          const float* v = data.values.data() + size_t(id) * size_t(d);
          for (int x = 0; x < d; ++x) wv[size_t(x)] += w[t] * double(v[x]);
          retrieved.push_back(int32_t(id));
          weakest = std::min(weakest, dot[t]);
        }
        std::sort(retrieved.begin(), retrieved.end());
        for (size_t ti = 0; ti < tails.size(); ++ti) {
          double tail_sum = sum;
          std::copy(wv.begin(), wv.end(), tail_wv.begin());
          if (tails[ti] > 0)
            add_tail(data, r.tail[wi * tails.size() + ti], scale, r.max_score, retrieved, weakest, tail_sum, tail_wv,
                     tail_scratch);
          double err = 0;
          for (int x = 0; x < d; ++x) {
            const double e = tail_wv[size_t(x)] / tail_sum - r.full[size_t(x)];
            err += e * e;
          }
          per_head[size_t(g)][wi * tails.size() + ti].push_back(std::sqrt(err / std::max(norm_full, 1e-300)));
        }
      }
    }
  });
  OutputErrors out;
  out.mean.assign(slots, 0.0);
  out.p95.assign(slots, 0.0);
  std::vector<double> all;
  for (size_t i = 0; i < slots; ++i) {
    all.clear();
    for (int g = 0; g < G; ++g) all.insert(all.end(), per_head[size_t(g)][i].begin(), per_head[size_t(g)][i].end());
    if (all.empty()) continue;
    for (double e : all) out.mean[i] += e / double(all.size());
    out.p95[i] = quantile(all, 0.95);
  }
  return out;
}

using HeadIndex = harness::HeadIndex;
using Ids = std::vector<harness::IdLists>;

}  // namespace

GroupData load_group(const MeasureInputs& in, int layer, int kv) {
  const ModelLayout& model = in.program->model;
  GroupData g;
  g.tokens = in.context;
  g.d = model.head_dim;
  g.group = model.group_size();
  g.dtype = model.kv_dtype;
  const size_t T = size_t(g.tokens), d = size_t(g.d);
  if (in.synthetic) {
    // Either generator, at this layer's RoPE base (the model's, not the
    // generator's own).
    auto spec_for = [&](auto spec) {
      spec.tokens = g.tokens;
      spec.head_dim = g.d;
      spec.group = g.group;
      spec.seed = in.seed * 1000003ull + uint64_t(layer) * 131ull + uint64_t(kv);
      spec.rope_base = model.layers[size_t(layer)].rope_base;
      return spec;
    };
    SyntheticHead h = in.distribution == "documents" ? make_document_synthetic(spec_for(DocumentSpec{}))
                                                     : make_synthetic(spec_for(SyntheticSpec{}));
    g.keys = std::move(h.keys);
    g.values = std::move(h.values);
    g.queries = std::move(h.queries);
  } else {
    const CalibLayer c = read_calib_layer(in.calib_dir, in.manifest, layer);
    const size_t stride = size_t(in.manifest.tokens);
    g.keys.assign(c.k.begin() + std::ptrdiff_t(size_t(kv) * stride * d), c.k.begin() + std::ptrdiff_t((size_t(kv) * stride + T) * d));
    g.values.assign(c.v.begin() + std::ptrdiff_t(size_t(kv) * stride * d), c.v.begin() + std::ptrdiff_t((size_t(kv) * stride + T) * d));
    g.queries.resize(size_t(g.group) * T * d);
    for (int q = 0; q < g.group; ++q) {
      const size_t head = size_t(kv) * size_t(g.group) + size_t(q);
      std::copy_n(c.q.begin() + std::ptrdiff_t(head * stride * d), T * d, g.queries.begin() + std::ptrdiff_t(size_t(q) * T * d));
    }
  }
  if (g.dtype != DType::f32) {
    g.keys_stored.resize(T * d);
    std::vector<uint16_t> v16(T * d);
    from_f32(g.dtype, g.keys.data(), g.keys_stored.data(), T * d);
    from_f32(g.dtype, g.values.data(), v16.data(), T * d);
    to_f32(g.dtype, g.keys_stored.data(), g.keys.data(), T * d);
    to_f32(g.dtype, v16.data(), g.values.data(), T * d);
  }
  return g;
}

double time_insertion(KeyIndex& index, const GroupData& data, int64_t from, int m, int rounds) {
  const RowsView all = data.key_rows(data.tokens);
  const int warm = std::min(m / 4, 16), count = std::min(m - warm, 64);
  for (int i = 0; i < warm; ++i) index.insert(int32_t(from + i), data.query(0, from + i), all);
  const int per = std::max(1, count / std::max(rounds, 1));
  std::vector<double> us;
  for (int at = warm; at + per <= warm + count; at += per) {
    const auto t0 = Clock::now();
    for (int i = at; i < at + per; ++i) index.insert(int32_t(from + i), data.query(0, from + i), all);
    us.push_back(us_since(t0) / per);
  }
  if (us.empty()) return 0;
  std::nth_element(us.begin(), us.begin() + std::ptrdiff_t(us.size() / 2), us.end());
  return us[us.size() / 2];
}

std::map<int64_t, int64_t> index_keys_per_window(int64_t keys, const std::vector<int64_t>& windows, int top_k) {
  std::vector<int64_t> ascending = windows;
  std::sort(ascending.begin(), ascending.end());
  const int64_t floor = std::max<int64_t>(4 * int64_t(top_k), keys / 4);
  std::map<int64_t, int64_t> out;
  int64_t shared = 0;  // the size the last new index was built at
  for (int64_t w : ascending) {
    const int64_t want = std::min(keys, std::max(floor, keys - w + 1));
    if (shared == 0 || double(want) < (1 - kIndexShareTolerance) * double(shared)) shared = want;
    out[w] = shared;
  }
  return out;
}

LayerSample measure_layer_sample(const MeasureInputs& in, int layer, int kv_head,
                                 const std::function<void(double, const std::string&)>& step) {
  // Shares of a layer's time: the builds, the exact pass, the sweeps.
  constexpr double kBuilds = 0.45, kExact = 0.15, kSweeps = 0.4;
  double reported = 0;
  auto say = [&](double at, const std::string& now) {
    step(std::max(0.0, at - reported), now);
    reported = std::max(reported, at);
  };
  const Program& program = *in.program;
  const ModelLayout& model = program.model;
  const ConcretePlan concrete = default_concrete_plan(program.plan);
  const std::string what = "layer " + std::to_string(layer) + " kv " + std::to_string(kv_head) +
                           (in.set_name.empty() ? std::string() : " (" + in.set_name + ")");
  const GroupData data = load_group(in, layer, kv_head);
  const int d = data.d, G = in.q_heads > 0 ? std::min(in.q_heads, data.group) : data.group, m = in.test_queries;
  const int64_t n = data.tokens - m, sinks = in.sinks;
  const double scale = 1.0 / std::sqrt(double(d));
  int kmax = kPaperTopK;
  for (int k : in.top_ks) kmax = std::max(kmax, k);
  if (n <= kmax) fail(Status::invalid_argument, "tune: too few keys for top_k " + std::to_string(kmax));

  LayerSample s;
  s.layer = layer;
  s.kv_head = kv_head;
  s.keys = n;
  s.window_keys = index_keys_per_window(n, in.windows, kmax);
  std::vector<int64_t> sizes;  // descending
  for (const auto& [w, keys] : s.window_keys)
    if (std::find(sizes.begin(), sizes.end(), keys) == sizes.end()) sizes.push_back(keys);
  std::sort(sizes.rbegin(), sizes.rend());
  // The indexes, one set per size, as the runtime builds them under the
  // plan's defaults (with shared_graph one per group, from all its heads'
  // queries, even when fewer heads are measured).
  GraphBuildParams bp = for_search_grid(internal::graph_build_params(concrete, model, layer),
                                        decode_search_grid(program.plan, layer));
  bp.threads = in.threads;
  const int built = concrete.shared_graph ? data.group : G;
  std::vector<const float*> train, test;
  for (int g = 0; g < built; ++g) {
    train.push_back(data.query(g, 0));
    test.push_back(data.query(g, n));
  }
  std::vector<std::vector<HeadIndex>> heads;
  double build_s = 0;
  for (size_t si = 0; si < sizes.size(); ++si) {
    say(kBuilds * double(si) / double(sizes.size()),
        what + ": building " + (concrete.shared_graph ? "the group's shared index" : std::to_string(G) + " indexes") +
            " of " + std::to_string(sizes[si]) + " keys");
    heads.push_back(harness::build_group(data.key_rows(sizes[si]), train.data(), n, test.data(), built,
                                         concrete.shared_graph, bp, m, 0, &build_s));
    heads.back().resize(size_t(G));
    for (HeadIndex& h : heads.back()) h.exact.resize(size_t(m));
  }
  s.build_s = build_s;

  // Exact attention of every test query: the reference outputs and exact
  // top-k, from one pass over the scores.
  say(kBuilds, what + ": exact attention of " + std::to_string(G * m) + " test queries");
  SampleRef ref;
  ref.ref.assign(size_t(G), std::vector<QueryReference>(size_t(m)));
  const std::vector<int64_t>& windows = in.windows;
  const std::vector<int64_t>& tails = in.tails;
  ThreadPool pool(std::min(in.threads, G));
  const RowsView rounded = data.rounded_keys();
  pool.parallel_for(G, [&](int64_t g) {
    std::vector<float> score;
    std::vector<std::pair<float, int32_t>> order;
    std::vector<double> w;
    std::vector<int32_t> sample;
    for (int i = 0; i < m; ++i) {
      const int64_t p = n + i;
      const float* q = data.query(g, p);
      score.resize(size_t(p + 1));
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t t = 0; t <= p; ++t) {
        score[size_t(t)] = internal::dot_row(q, rounded, t);
        best = std::max(best, score[size_t(t)]);
      }
      QueryReference& r = ref.ref[size_t(g)][size_t(i)];
      r.max_score = double(best) * scale;
      w.resize(size_t(p + 1));
      double total = 0;
      r.full.assign(size_t(d), 0.0);
      for (int64_t t = 0; t <= p; ++t) {
        w[size_t(t)] = std::exp(double(score[size_t(t)]) * scale - r.max_score);
        total += w[size_t(t)];
        const float* v = data.values.data() + size_t(t) * size_t(d);
        for (int x = 0; x < d; ++x) r.full[size_t(x)] += w[size_t(t)] * double(v[x]);
      }
      for (double& x : r.full) x /= total;
      // The exact part of each window: sinks, the window, and the tokens
      // past its index before the window (pending, attended exactly).
      r.exact_sum.assign(windows.size(), 0.0);
      r.exact_wv.assign(windows.size() * size_t(d), 0.0);
      r.tail.assign(windows.size() * tails.size(), TailReference{});
      for (size_t wi = 0; wi < windows.size(); ++wi) {
        const int64_t static_from = std::max(sinks, p - windows[wi] + 1);
        const int64_t index_end = s.window_keys.at(windows[wi]);
        auto add = [&](int64_t t) {
          r.exact_sum[wi] += w[size_t(t)];
          const float* v = data.values.data() + size_t(t) * size_t(d);
          double* acc = r.exact_wv.data() + wi * size_t(d);
          for (int x = 0; x < d; ++x) acc[x] += w[size_t(t)] * double(v[x]);
        };
        for (int64_t t = 0; t < std::min(sinks, p + 1); ++t) add(t);
        for (int64_t t = std::max(std::min(index_end, static_from), sinks); t <= p; ++t) add(t);
        // The tail estimate's sample of U, as the runtime draws it for this
        // token (RuntimeConfig's default seed; positions sinks + row).
        const int64_t offloaded = std::min(index_end, static_from) - sinks;
        for (size_t ti = 0; ti < tails.size(); ++ti) {
          TailReference& tr = r.tail[wi * tails.size() + ti];
          if (tails[ti] <= 0 || offloaded <= 0) continue;
          tr.rows = offloaded;
          internal::draw_tail_sample(in.tail_seed, layer, kv_head, p, offloaded, tails[ti], sample);
          tr.wv.assign(size_t(d), 0.0);
          tr.by_score.reserve(sample.size());
          for (int32_t row : sample) {
            const int64_t t = sinks + row;
            tr.by_score.emplace_back(score[size_t(t)], int32_t(t));
            tr.sum += w[size_t(t)];
            const float* v = data.values.data() + size_t(t) * size_t(d);
            for (int x = 0; x < d; ++x) tr.wv[size_t(x)] += w[size_t(t)] * double(v[x]);
          }
          std::sort(tr.by_score.begin(), tr.by_score.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        }
      }
      // Exact top-kmax of each index's keys (score descending, ties by id).
      auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      };
      for (size_t si = 0; si < sizes.size(); ++si) {
        order.resize(size_t(sizes[si]));
        for (int64_t t = 0; t < sizes[si]; ++t) order[size_t(t)] = {score[size_t(t)], int32_t(t)};
        std::partial_sort(order.begin(), order.begin() + kmax, order.end(), before);
        std::vector<int32_t>& exact = heads[si][size_t(g)].exact[size_t(i)];
        exact.resize(size_t(kmax));
        for (int j = 0; j < kmax; ++j) exact[size_t(j)] = order[size_t(j)].second;
      }
    }
  });

  const QuerySplit split = split_test_queries(m, in.holdout, in.holdout_block);
  const std::vector<int>& valid_queries = split.validation.empty() ? split.tuning : split.validation;
  auto point_from = [&](const std::vector<HeadIndex>& set, int k, const DecodeSearch& search, bool baseline) {
    SearchPoint p;
    p.top_k = k;
    p.search = search;
    p.baseline = baseline;
    p.index_keys = set.front().keys.rows;
    Ids ids_tune;
    const SearchTrial t = evaluate_search(set, search, concrete, split.tuning, k, &ids_tune, in.recall_k);
    p.recall_tune = t.recall;
    p.recall_se_tune = t.recall_se;
    p.scored_tune = t.scored_fraction;
    p.us_per_search = t.us_per_query;
    p.met_tune = recall_lower_bound(t, in.confidence) >= in.min_recall;
    return std::make_pair(p, std::move(ids_tune));
  };
  // The held-out figures (v, with its ids) and both parts' output errors.
  auto finish_point = [&](SearchPoint& p, const Ids& ids_tune, const SearchTrial& v, const Ids& ids_valid) {
    p.recall_valid = v.recall;
    p.scored_valid = v.scored_fraction;
    OutputErrors tune = output_errors(data, G, ref, s.window_keys, sinks, windows, tails, split.tuning, ids_tune, pool);
    OutputErrors valid = output_errors(data, G, ref, s.window_keys, sinks, windows, tails, valid_queries, ids_valid, pool);
    p.error_tune = std::move(tune.mean);
    p.error_p95_tune = std::move(tune.p95);
    p.error_valid = std::move(valid.mean);
    p.error_p95_valid = std::move(valid.p95);
  };

  // Per index size and top_k, the layer's grid as `rattn tune --plan` walks
  // it (sweep_grid).
  const std::vector<DecodeSearch> grid = decode_search_grid(program.plan, layer);
  const size_t sweeps = sizes.size() * in.top_ks.size();
  for (size_t si = 0; si < sizes.size(); ++si)
    for (size_t ki = 0; ki < in.top_ks.size(); ++ki) {
      const int k = in.top_ks[ki];
      const double sweep_at = kBuilds + kExact + kSweeps * double(si * in.top_ks.size() + ki) / double(sweeps + 1);
      // A queue below k is the same search as queue k.
      sweep_grid(grid, k, [&](const DecodeSearch& st) {
        auto [p, ids_tune] = point_from(heads[si], k, st, false);
        if (p.met_tune) {
          Ids ids_valid;
          const SearchTrial v = evaluate_search(heads[si], st, concrete, valid_queries, k, &ids_valid, in.recall_k);
          finish_point(p, ids_tune, v, ids_valid);
        }
        say(sweep_at, what + ": " + std::to_string(sizes[si]) + " keys, top " + std::to_string(k) + " queue " +
                          std::to_string(st.queue) + " -> recall " + std::to_string(p.recall_tune).substr(0, 5));
        const SweepStep step{p.met_tune, p.scored_tune};
        s.points.push_back(std::move(p));
        return step;
      });
    }
  // The baseline: the plan's default search on the paper window's index, the
  // queue raised until the held-out recall@100 meets the target (or the
  // queue domain ends).
  {
    const size_t si = size_t(std::find(sizes.begin(), sizes.end(), s.window_keys.at(kPaperWindow)) - sizes.begin());
    DecodeSearch base = concrete.decode_search(layer);
    std::vector<double> queues;
    for (const DecodeSearch& st : grid)
      if (st.queue >= kPaperTopK) queues.push_back(st.queue);
    std::sort(queues.begin(), queues.end());
    queues.erase(std::unique(queues.begin(), queues.end()), queues.end());
    for (size_t qi = 0; qi < queues.size(); ++qi) {
      base.queue = int(queues[qi]);
      Ids ids_valid;
      const SearchTrial v = evaluate_search(heads[si], base, concrete, valid_queries, kPaperTopK, &ids_valid);
      if (v.recall >= in.min_recall || qi + 1 == queues.size()) {
        auto [p, ids_tune] = point_from(heads[si], kPaperTopK, base, true);
        finish_point(p, ids_tune, v, ids_valid);
        say(kBuilds + kExact + kSweeps * double(sweeps) / double(sweeps + 1),
            what + ": the paper's plan at queue " + std::to_string(base.queue));
        s.points.push_back(std::move(p));
        break;
      }
    }
  }
  // One insertion: the next tokens into the largest index of the first
  // head, after a few untimed ones (the index's first growth is a one-off).
  s.insert_us = time_insertion(*heads.front().front().index, data, sizes.front(), m);
  say(1, what + " measured");
  return s;
}

KernelTimes measure_kernel_times(const ModelLayout& model, const std::vector<int64_t>& gathered_rows,
                                 const std::vector<int64_t>& dense_rows, const std::vector<int64_t>& tail_rows,
                                 const std::map<std::string, double>& halide_knobs) {
  KernelSpec spec{model.head_dim, model.group_size(), model.kv_dtype};
  std::unique_ptr<CpuKernels> kernels;
  try {
    kernels = make_halide_kernels(spec, HalideSchedule::from_kernel_map(halide_knobs));
  } catch (const Error&) {
    kernels = make_reference_kernels(spec);  // no compiler: the runtime would fall back the same way
  }
  const int d = model.head_dim, G = model.group_size();
  const size_t bytes = dtype_size(model.kv_dtype), row_bytes = size_t(d) * bytes;
  // In a decode step each layer's rows are touched once per token, with the
  // rest of the model's weights and KV between: the kernels are timed cold,
  // each call on rows the last few calls did not touch, in K/V buffers of
  // at least 128 MiB (4x this machine kind's L3).
  int64_t rows = std::max<int64_t>(131072, int64_t((size_t(64) << 20) / row_bytes));
  for (int64_t r : dense_rows) rows = std::max(rows, 4 * r);
  std::vector<uint8_t> k(size_t(rows) * row_bytes), v(k.size());
  std::mt19937_64 rng(7);
  {
    const int64_t block = std::min<int64_t>(rows, 4096);  // random rows, repeated: the values do not matter
    std::vector<float> tmp(static_cast<size_t>(d));
    for (int64_t r = 0; r < block; ++r) {
      for (float& x : tmp) x = float(int(rng() % 2001) - 1000) / 1000.0f;
      from_f32(model.kv_dtype, tmp.data(), k.data() + size_t(r) * row_bytes, size_t(d));
      for (float& x : tmp) x = float(int(rng() % 2001) - 1000) / 1000.0f;
      from_f32(model.kv_dtype, tmp.data(), v.data() + size_t(r) * row_bytes, size_t(d));
    }
    for (int64_t r = block; r < rows; r += block) {
      const size_t n = size_t(std::min(block, rows - r)) * row_bytes;
      std::memcpy(k.data() + size_t(r) * row_bytes, k.data(), n);
      std::memcpy(v.data() + size_t(r) * row_bytes, v.data(), n);
    }
  }
  const RowsView kr{k.data(), model.kv_dtype, rows, d}, vr{v.data(), model.kv_dtype, rows, d};
  std::vector<float> q(size_t(G) * size_t(d), 0.01f), out(size_t(G) * size_t(d)), lse(static_cast<size_t>(G));
  // Random ids over every row, a window of them per call.
  std::vector<int32_t> pool(size_t(1) << 20);
  for (int32_t& id : pool) id = int32_t(rng() % uint64_t(rows));
  auto ids_for = [&](int64_t call, int64_t n) {
    return pool.data() + size_t((call * n) % (int64_t(pool.size()) - n));
  };
  // Median of 7 rounds, each long enough to time; f(call) takes its rows by
  // the call's number.
  auto time_us = [](const std::function<void(int64_t)>& f) {
    int64_t call = 0;
    f(call++);
    int reps = 1;
    for (;;) {
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) f(call++);
      if (us_since(t0) > 2000 || reps > (1 << 16)) break;
      reps *= 2;
    }
    std::vector<double> rounds;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) f(call++);
      rounds.push_back(us_since(t0) / reps);
    }
    std::nth_element(rounds.begin(), rounds.begin() + 3, rounds.end());
    return rounds[3];
  };
  KernelTimes t;
  for (int64_t n : gathered_rows)
    t.gathered_us[n] = time_us([&](int64_t call) {
      kernels->partial_attention(q.data(), 1, kr, vr, ids_for(call, n), int(n), out.data(), lse.data());
    });
  // Dense windows one after another through the buffers.
  for (int64_t n : dense_rows)
    t.dense_us[n] = time_us([&](int64_t call) {
      const int64_t begin = (call * n) % (rows - n + 1);
      kernels->dense_attention(q.data(), G, kr, vr, begin, begin + n, out.data(), lse.data());
    });
  // The tail estimate of a whole group: a sample of n rows (each call
  // another position's) less each head's top-100, every sampled row below
  // the top-100's weakest score (the usual case: one dot product and one
  // partial attention of the group).
  for (int64_t n : tail_rows) {
    std::vector<int32_t> sample;
    const std::vector<float> strong(static_cast<size_t>(kPaperTopK), std::numeric_limits<float>::max());
    std::vector<internal::TailHits> hits(static_cast<size_t>(G));
    internal::TailPiece piece;
    t.tail_us[n] = time_us([&](int64_t call) {
      internal::draw_tail_sample(1, 0, 0, call, rows, n, sample);
      for (int g = 0; g < G; ++g)
        hits[size_t(g)] = {ids_for(call * G + g, kPaperTopK), strong.data(), kPaperTopK};
      internal::tail_piece(*kernels, q.data(), G, kr, vr, sample.data(), int(sample.size()), hits.data(), piece);
      internal::tail_finish(&piece, 1, G, d, rows, hits.data(), out.data(), lse.data());
    });
  }
  std::vector<float> o2(size_t(d), 0.5f), l2(1, 0.0f);
  t.merge_us = time_us([&](int64_t) { merge_partials_ln(out.data(), lse.data(), o2.data(), l2.data(), 1, d); }) * 3;
  return t;
}

std::map<int64_t, std::vector<double>> measure_gpu_static_set(
    const ModelLayout& model, int64_t sinks, const std::vector<int64_t>& windows,
    const std::vector<std::map<std::string, double>>& variants, const std::function<void(const std::string&)>& say) {
  std::map<int64_t, std::vector<double>> out;
  KernelSpec spec{model.head_dim, model.group_size(), model.kv_dtype};
  const int H = model.num_kv_heads, d = model.head_dim, G = model.group_size();
  const size_t bytes = dtype_size(model.kv_dtype);
  for (int64_t w : windows) {
    const int64_t rows = sinks + w;
    std::vector<double>& times = out[rows];
    for (const auto& knobs : variants) {
      GpuAttentionOptions options;
      options.knobs = knobs;
      if (!options.knobs.count("cuda.splits") || options.knobs["cuda.splits"] <= 0)
        options.knobs["cuda.splits"] = static_set_splits(rows, H);
      std::string why;
      std::unique_ptr<GpuAttention> gpu;
      try {
        gpu = open_gpu_attention(spec, options, &why);
      } catch (const Error& e) {  // a knob combination the generator refuses for this shape
        times.push_back(std::numeric_limits<double>::quiet_NaN());
        say("GPU kernel variant not built: " + std::string(e.what()));
        continue;
      }
      if (!gpu) {
        say("no GPU static set (" + why + "): predicted instead");
        return {};
      }
      std::vector<uint16_t> k(size_t(rows) * size_t(d) * bytes / 2, 0x2c00), v(k.size(), 0x2c00);
      std::vector<RowsView> kr(size_t(H), RowsView{k.data(), model.kv_dtype, rows, d}), vr = kr;
      for (auto& r : vr) r.data = v.data();
      gpu->upload_static_set(H, kr.data(), vr.data(), rows);
      std::vector<float> q(size_t(H) * size_t(G) * size_t(d), 0.01f), o(q.size()), lse(size_t(H) * size_t(G));
      std::vector<const void*> krow(size_t(H), k.data()), vrow(size_t(H), v.data());
      auto step = [&](int64_t i) {
        gpu->update_static_row(i % rows, krow.data(), vrow.data());
        gpu->begin_partial_attention(q.data());
        gpu->finish_partial_attention(o.data(), lse.data());
      };
      // Warm up by time as well as steps: after a module's compile the GPU
      // has idled, and its clocks take milliseconds to come back (single
      // variants measured 1.5-2x slow on an H100 with 20 steps alone).
      const auto warm = Clock::now();
      for (int i = 0; i < 20 || us_since(warm) < 50e3; ++i) step(i);
      std::vector<double> rounds;
      for (int r = 0; r < 7; ++r) {
        const auto t0 = Clock::now();
        for (int i = 0; i < 50; ++i) step(i);
        rounds.push_back(us_since(t0) / 50);
      }
      std::nth_element(rounds.begin(), rounds.begin() + 3, rounds.end());
      times.push_back(rounds[3]);
      say("GPU " + gpu->device_name() + ": static set of " + std::to_string(rows) + " rows x " + std::to_string(H) +
          " KV heads, " + gpu->kernel_name() + ": " + std::to_string(rounds[3]) + " us per step");
    }
  }
  return out;
}

namespace {
boost::json::object search_json(const DecodeSearch& s) {
  return {{"queue", s.queue}, {"patience", s.patience}, {"seeds", s.seeds}, {"expand_first", s.expand_first},
          {"full_expand", s.full_expand}};
}
DecodeSearch search_from(const boost::json::object& o) {
  return DecodeSearch{int(o.at("queue").to_number<int64_t>()), int(o.at("patience").to_number<int64_t>()),
                      int(o.at("seeds").to_number<int64_t>()), int(o.at("expand_first").to_number<int64_t>()),
                      int(o.at("full_expand").to_number<int64_t>())};
}
std::vector<double> doubles(const boost::json::value& v) {
  std::vector<double> out;
  for (const auto& x : v.as_array()) out.push_back(x.to_number<double>());
  return out;
}
}  // namespace

std::string LayerSample::label() const {
  return "layer " + std::to_string(layer) + " kv " + std::to_string(kv_head) + (calib.empty() ? "" : " (" + calib + ")");
}

boost::json::value layer_sample_to_json(const LayerSample& s) {
  boost::json::array points;
  for (const SearchPoint& p : s.points)
    points.push_back(boost::json::object{{"top_k", p.top_k},
                                         {"index_keys", p.index_keys},
                                         {"search", search_json(p.search)},
                                         {"recall_tune", p.recall_tune},
                                         {"recall_se_tune", p.recall_se_tune},
                                         {"recall_valid", p.recall_valid},
                                         {"scored_tune", p.scored_tune},
                                         {"scored_valid", p.scored_valid},
                                         {"us_per_search", p.us_per_search},
                                         {"met_tune", p.met_tune},
                                         {"baseline", p.baseline},
                                         {"error_tune", boost::json::value_from(p.error_tune)},
                                         {"error_valid", boost::json::value_from(p.error_valid)},
                                         {"error_p95_tune", boost::json::value_from(p.error_p95_tune)},
                                         {"error_p95_valid", boost::json::value_from(p.error_p95_valid)}});
  boost::json::object window_keys;
  for (const auto& [w, keys] : s.window_keys) window_keys[std::to_string(w)] = keys;
  return boost::json::object{{"layer", s.layer},
                             {"kv_head", s.kv_head},
                             {"keys", s.keys},
                             {"window_keys", std::move(window_keys)},
                             {"build_s", s.build_s},
                             {"insert_us", s.insert_us},
                             {"points", std::move(points)}};
}

LayerSample layer_sample_from_json(const boost::json::value& v) {
  try {
    const auto& o = v.as_object();
    LayerSample s;
    s.layer = int(o.at("layer").to_number<int64_t>());
    s.kv_head = int(o.at("kv_head").to_number<int64_t>());
    s.keys = o.at("keys").to_number<int64_t>();
    for (const auto& kv : o.at("window_keys").as_object())
      s.window_keys[std::stoll(std::string(kv.key()))] = kv.value().to_number<int64_t>();
    s.build_s = o.at("build_s").to_number<double>();
    s.insert_us = o.at("insert_us").to_number<double>();
    for (const auto& pv : o.at("points").as_array()) {
      const auto& po = pv.as_object();
      SearchPoint p;
      p.top_k = int(po.at("top_k").to_number<int64_t>());
      p.index_keys = po.at("index_keys").to_number<int64_t>();
      p.search = search_from(po.at("search").as_object());
      p.recall_tune = po.at("recall_tune").to_number<double>();
      p.recall_se_tune = po.at("recall_se_tune").to_number<double>();
      p.recall_valid = po.at("recall_valid").to_number<double>();
      p.scored_tune = po.at("scored_tune").to_number<double>();
      p.scored_valid = po.at("scored_valid").to_number<double>();
      p.us_per_search = po.at("us_per_search").to_number<double>();
      p.met_tune = po.at("met_tune").as_bool();
      p.baseline = po.at("baseline").as_bool();
      p.error_tune = doubles(po.at("error_tune"));
      p.error_valid = doubles(po.at("error_valid"));
      if (po.contains("error_p95_tune")) p.error_p95_tune = doubles(po.at("error_p95_tune"));
      if (po.contains("error_p95_valid")) p.error_p95_valid = doubles(po.at("error_p95_valid"));
      s.points.push_back(std::move(p));
    }
    return s;
  } catch (const std::exception& e) {
    fail(Status::corrupt_data, std::string("tuning database: a malformed layer record: ") + e.what());
  }
}

boost::json::value kernel_times_to_json(const KernelTimes& k) {
  boost::json::object gathered, dense, tail;
  for (const auto& [n, us] : k.gathered_us) gathered[std::to_string(n)] = us;
  for (const auto& [n, us] : k.dense_us) dense[std::to_string(n)] = us;
  for (const auto& [n, us] : k.tail_us) tail[std::to_string(n)] = us;
  return boost::json::object{{"gathered_us", std::move(gathered)},
                             {"dense_us", std::move(dense)},
                             {"tail_group_us", std::move(tail)},
                             {"merge_us", k.merge_us}};
}

KernelTimes kernel_times_from_json(const boost::json::value& v) {
  try {
    KernelTimes k;
    const auto& o = v.as_object();
    for (const auto& kv : o.at("gathered_us").as_object()) k.gathered_us[std::stoll(std::string(kv.key()))] = kv.value().to_number<double>();
    for (const auto& kv : o.at("dense_us").as_object()) k.dense_us[std::stoll(std::string(kv.key()))] = kv.value().to_number<double>();
    if (const auto* tail = o.if_contains("tail_group_us"))
      for (const auto& kv : tail->as_object()) k.tail_us[std::stoll(std::string(kv.key()))] = kv.value().to_number<double>();
    k.merge_us = o.at("merge_us").to_number<double>();
    return k;
  } catch (const std::exception& e) {
    fail(Status::corrupt_data, std::string("tuning database: a malformed kernel record: ") + e.what());
  }
}

}  // namespace rattn
