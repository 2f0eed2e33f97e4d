// `rattn bench index`: the insert experiments.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/index/baselines.h"
#include "bench/index/index_phases.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"

namespace rattn::bench {

namespace json = boost::json;

void IndexRun::insert_phase() {
  // Insert path: build on the context minus the last `insert_fraction`, then
  // insert those tokens one by one with their own queries.
  if (has("graph") && o.insert_fraction > 0) {
    const int64_t base = int64_t(double(N) / (1.0 + o.insert_fraction));
    const double t0 = seconds_now();
    RowStore grow(o.dtype, d);
    grow.reserve(N);
    grow.append_f32(ds.keys.data(), base);
    auto base_index = build_projected_graph(grow.view(), ds.train.data(), base, o.graph);
    const double build_s = seconds_now() - t0;
    std::string base_image;
    base_index->serialize(&base_image);
    const int L = o.insert_queue > 0 ? o.insert_queue : int(operating["queue_length"].as_double());
    // Inserts the last tokens one by one into a copy of the base graph with
    // the given insert parameters, then searches the test queries.
    struct InsertRun {
      double us_per_key = 0, recall_all = 0, recall_new = 0, scored = 0, scored_per_insert = 0, refresh_seconds = 0;
      int64_t n_new = 0;
    };
    // hinted: as the runtime does, each token's insertion reuses the hits of
    // a search for its own query at queue L (the decode step's search, not
    // timed here: decoding pays for it anyway). The runtime's search happens
    // a window earlier; here it sees every token inserted before
    // (--insert-schedule replays the runtime's order).
    constexpr int kHints = 32;
    // Recall@k of the test queries on the grown graph: all of them, and those
    // whose top-k holds inserted tokens; keys scored as a share of N.
    const auto search_test_queries = [&](const KeyIndex& index, const RowStore& store, const SearchParams& sp,
                                         InsertRun& run) {
      auto scratch = index.make_scratch();
      SearchResult sr;
      for (int64_t i = 0; i < m; ++i) {
        index.search(ds.test.data() + size_t(i) * size_t(d), store.view(), sp, *scratch, sr);
        const double rr = recall_at(sr.ids, gt[size_t(i)], o.k);
        run.recall_all += rr;
        run.scored += double(sr.keys_scored);
        const auto& g = gt[size_t(i)];
        if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; })) {
          run.recall_new += rr;
          ++run.n_new;
        }
      }
      run.recall_all /= double(m);
      run.recall_new = run.n_new ? run.recall_new / double(run.n_new) : 0.0;
      run.scored = run.scored / double(m) / double(N);
    };
    // The decode step's search and the test searches after the inserts.
    const SearchParams sp = o.search.front().params(o.k, L);
    // A copy of the base graph with these insert parameters, and its store
    // (the base keys, room for the rest).
    const auto copy_of_base = [&](const GraphBuildParams& gp, RowStore* store) {
      auto index = deserialize_index(base_image);
      set_insert_params(*index, gp);
      *store = RowStore(o.dtype, d);
      store->reserve(N);
      store->append_f32(ds.keys.data(), base);
      return index;
    };
    const auto run_inserts = [&](const GraphBuildParams& gp, bool hinted) {
      InsertRun run;
      RowStore store;
      auto index = copy_of_base(gp, &store);
      auto hint_scratch = index->make_scratch();
      SearchResult hint_sr;
      double insert_seconds = 0, refresh_seconds = 0;
      for (int64_t t = base; t < N; ++t) {
        const float* own_query = ds.train.data() + size_t(t) * size_t(d);
        if (hinted) index->search(own_query, store.view(), sp, *hint_scratch, hint_sr);
        const double t1 = seconds_now();
        store.append_f32(ds.keys.data() + size_t(t) * size_t(d), 1);
        if (hinted)
          index->insert_hinted(int32_t(t), own_query, store.view(), hint_sr.ids.data(),
                               int(std::min<size_t>(hint_sr.ids.size(), kHints)));
        else
          index->insert(int32_t(t), own_query, store.view());
        insert_seconds += seconds_now() - t1;
        if (o.insert_refresh > 0 && (t + 1 - base) % o.insert_refresh == 0) {
          const int64_t stride = std::max<int64_t>(1, std::llround(1.0 / o.insert_refresh_sample));
          std::vector<float> rq;
          for (int64_t u = t + 1 - o.insert_refresh; u <= t; u += stride)
            rq.insert(rq.end(), ds.train.data() + size_t(u) * size_t(d), ds.train.data() + size_t(u + 1) * size_t(d));
          const double t2 = seconds_now();
          refresh_projected_graph(*index, store.view(), rq.data(), int64_t(rq.size()) / d, gp);
          refresh_seconds += seconds_now() - t2;
        }
      }
      run.refresh_seconds = refresh_seconds;
      run.us_per_key = insert_seconds * 1e6 / double(N - base);
      const GraphInfo gi = projected_graph_info(*index);
      run.scored_per_insert = double(gi.insert_keys_scored) / double(std::max<int64_t>(1, gi.inserts));
      search_test_queries(*index, store, sp, run);
      return run;
    };
    // The decode step's schedule: token t's hints are the hits of the search
    // for its own query at the step that decoded it, when the graph held only
    // the tokens that had left a window of `lag` and been inserted in batches
    // of `batch`. The first `lag` tokens after the base were the prefill's
    // window: no hints (the insert searches). Tokens still pending or in the
    // window at the end are inserted last, so recall covers every token.
    const auto run_schedule = [&](int lag, int batch) {
      InsertRun run;
      RowStore store;
      auto index = copy_of_base(o.graph, &store);
      auto scratch = index->make_scratch();
      SearchResult sr;
      std::vector<int32_t> hints(size_t(N - base) * kHints);
      std::vector<int> hint_count(size_t(N - base), 0);
      int64_t next_insert = base;  // tokens before it are in the graph
      double insert_seconds = 0;
      const auto insert_until = [&](int64_t end) {
        const double t1 = seconds_now();
        for (; next_insert < end; ++next_insert) {
          const int64_t t = next_insert;
          store.append_f32(ds.keys.data() + size_t(t) * size_t(d), 1);
          const size_t j = size_t(t - base);
          index->insert_hinted(int32_t(t), ds.train.data() + size_t(t) * size_t(d), store.view(),
                               hints.data() + j * kHints, hint_count[j]);
        }
        insert_seconds += seconds_now() - t1;
      };
      for (int64_t step = base + lag; step < N; ++step) {
        const int64_t left_window = step - lag;  // this step's token leaving the window: pending
        if (left_window + 1 - next_insert >= batch) insert_until(left_window + 1);
        index->search(ds.train.data() + size_t(step) * size_t(d), store.view(), sp, *scratch, sr);
        const size_t j = size_t(step - base);
        hint_count[j] = int(std::min<size_t>(sr.ids.size(), kHints));
        std::copy_n(sr.ids.begin(), hint_count[j], hints.begin() + std::ptrdiff_t(j * kHints));
      }
      insert_until(N);
      run.us_per_key = insert_seconds * 1e6 / double(N - base);
      search_test_queries(*index, store, sp, run);
      return run;
    };
    const InsertRun main_run = run_inserts(o.graph, false);
    const InsertRun hinted_run = run_inserts(o.graph, true);
    insert_report["hinted_insert_us_per_key"] = hinted_run.us_per_key;
    insert_report["hinted_insert_keys_scored_per_key"] = hinted_run.scored_per_insert;
    insert_report["hinted_recall_all"] = hinted_run.recall_all;
    insert_report["hinted_recall_queries_with_new_tokens"] = hinted_run.recall_new;
    log("  hinted insert (the decode search's hits reused): " + std::to_string(hinted_run.us_per_key) + " us/key, " +
               std::to_string(hinted_run.scored_per_insert) + " scored/key; recall " +
               std::to_string(hinted_run.recall_all) + " (all), " + std::to_string(hinted_run.recall_new) + " (new)" +
               "; refresh " + std::to_string(hinted_run.refresh_seconds) + " s");
    const double insert_us = main_run.us_per_key;
    const double rec_all = main_run.recall_all, rec_new = main_run.recall_new, scored = main_run.scored;
    const int64_t n_new = main_run.n_new;
    insert_report["refresh_every"] = o.insert_refresh;
    insert_report["refresh_sample"] = o.insert_refresh_sample;
    insert_report["refresh_seconds"] = main_run.refresh_seconds;
    insert_report["refresh_ms_per_inserted_key"] = main_run.refresh_seconds * 1e3 / double(N - base);
    insert_report["hinted_refresh_seconds"] = hinted_run.refresh_seconds;
    insert_report["base_keys"] = base;
    insert_report["inserted_keys"] = N - base;
    insert_report["base_build_seconds"] = build_s;
    insert_report["insert_us_per_key"] = insert_us;
    insert_report["insert_keys_scored_per_key"] = main_run.scored_per_insert;
    insert_report["graph_insert_queue"] = o.graph.insert_queue;
    insert_report["insert_pivots"] = o.graph.insert_pivots;
    insert_report["insert_reverse"] = o.graph.insert_reverse;
    insert_report["insert_key_queue"] = o.graph.insert_key_queue;
    insert_report["queue_length"] = L;
    insert_report["recall_all"] = rec_all;
    insert_report["queries_with_new_tokens_in_top_k"] = n_new;
    insert_report["recall_queries_with_new_tokens"] = rec_new;
    if (!op_ids.empty() && L == int(operating["queue_length"].as_double())) {
      // The same queries against the graph built on the whole context at once.
      double rec_full = 0;
      for (int64_t i = 0; i < m; ++i) {
        const auto& g = gt[size_t(i)];
        if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; }))
          rec_full += recall_at(op_ids[size_t(i)], g, o.k);
      }
      insert_report["recall_same_queries_full_build"] = n_new ? rec_full / double(n_new) : 0.0;
      log("  the same queries on the graph built on the whole context: recall " +
                 std::to_string(n_new ? rec_full / double(n_new) : 0.0));
    }
    json::array sweep;
    for (const auto& c : o.insert_sweep) {
      GraphBuildParams gp = o.graph;
      gp.insert_queue = c[0];
      gp.insert_pivots = c[1];
      gp.insert_reverse = c[2];
      gp.insert_key_queue = c[3];
      for (const bool hinted : {false, true}) {
      const InsertRun r = run_inserts(gp, hinted);
      json::object j;
      j["hinted"] = hinted;
      j["graph_insert_queue"] = c[0];
      j["insert_pivots"] = c[1];
      j["insert_reverse"] = c[2];
      j["insert_key_queue"] = c[3];
      j["insert_us_per_key"] = r.us_per_key;
      j["insert_keys_scored_per_key"] = r.scored_per_insert;
      j["recall_all"] = r.recall_all;
      j["recall_queries_with_new_tokens"] = r.recall_new;
      j["scored_fraction"] = r.scored;
      sweep.push_back(std::move(j));
      log("  insert " + std::to_string(c[0]) + ":" + std::to_string(c[1]) + ":" + std::to_string(c[2]) + ":" + std::to_string(c[3]) + " " +
                 std::to_string(r.us_per_key) + " us/key, " +
                 std::to_string(r.scored_per_insert) + " scored/key; recall " + std::to_string(r.recall_all) + " (all), " +
                 std::to_string(r.recall_new) + " (new), scored " + std::to_string(100 * r.scored) + "%" +
                 (hinted ? " (hinted)" : ""));
      }
    }
    if (!sweep.empty()) insert_report["sweep"] = std::move(sweep);
    json::array schedules;
    for (const auto& [lag, batch] : o.insert_schedules) {
      const InsertRun r = run_schedule(lag, batch);
      json::object j;
      j["window"] = lag;
      j["insert_batch"] = batch;
      j["insert_us_per_key"] = r.us_per_key;
      j["recall_all"] = r.recall_all;
      j["recall_queries_with_new_tokens"] = r.recall_new;
      schedules.push_back(std::move(j));
      log("  decode schedule, window " + std::to_string(lag) + ", insert batch " + std::to_string(batch) + ": " +
          std::to_string(r.us_per_key) + " us/key; recall " + std::to_string(r.recall_all) + " (all), " +
          std::to_string(r.recall_new) + " (new)");
    }
    if (!schedules.empty()) insert_report["decode_schedules"] = std::move(schedules);
    insert_report["scored_fraction"] = scored;
    log("insert: " + std::to_string(N - base) + " keys at " + std::to_string(insert_us) + " us/key (" +
               std::to_string(main_run.scored_per_insert) + " keys scored per insert); recall " +
               std::to_string(rec_all) + " (all), " + std::to_string(rec_new) +
               " over " + std::to_string(n_new) + " queries whose top-" + std::to_string(o.k) + " holds new tokens");
  }

  // The insert experiment for hnswlib: built on the same base keys, the rest
  // added one by one on this thread; the transforms are fitted on the base,
  // as the graph's insert path keeps its build's mean (or metric) for new keys.
  if (has("hnsw") && o.insert_fraction > 0) {
    const int64_t base = int64_t(double(N) / (1.0 + o.insert_fraction));
    json::array runs;
    for (const BaselineKeys& bk : make_baseline_keys(o, ds, base)) {
      const float* rows = bk.key_rows(ds);
      const double t0 = seconds_now();
      HnswIp h(d, N, 16, 100, o.seed);
      h.add(rows, 0, base, o.graph.threads);
      const double build_s = seconds_now() - t0;
      const double t1 = seconds_now();
      for (int64_t t = base; t < N; ++t) h.add(rows + size_t(t) * size_t(d), t, 1, 1);
      const double insert_us = (seconds_now() - t1) * 1e6 / double(N - base);
      json::object run;
      run["method"] = "hnswlib_hnsw_ip" + bk.suffix;
      run["key_transform"] = bk.transform;
      run["base_build_seconds"] = build_s;
      run["insert_us_per_key"] = insert_us;
      json::array points;
      for (int ef : {100, 200, 400, 800, 1600, 3200}) {
        double rec_all = 0, rec_new = 0, scored_sum = 0;
        int64_t n_new = 0;
        std::vector<int32_t> ids;
        for (int64_t i = 0; i < m; ++i) {
          int64_t scored = 0;
          h.search(bk.query(ds, i), o.k, ef, &ids, &scored);
          scored_sum += double(scored);
          const auto& g = gt[size_t(i)];
          const double rr = recall_at(ids, g, o.k);
          rec_all += rr;
          if (std::any_of(g.begin(), g.end(), [&](int32_t id) { return id >= base; })) {
            rec_new += rr;
            ++n_new;
          }
        }
        json::object pj;
        pj["ef"] = ef;
        pj["recall_all"] = rec_all / double(m);
        pj["recall_queries_with_new_tokens"] = n_new ? rec_new / double(n_new) : 0.0;
        pj["scored_fraction"] = scored_sum / double(m) / double(N);
        log("  hnswlib insert" + baseline_label(bk) + " ef=" + std::to_string(ef) + ": recall " + std::to_string(rec_all / double(m)) +
                   " (all), " + std::to_string(n_new ? rec_new / double(n_new) : 0.0) + " (new), scored " +
                   std::to_string(100 * scored_sum / double(m) / double(N)) + "%");
        const bool done = rec_all / double(m) > 0.99 || scored_sum / double(m) / double(N) > 0.5;
        points.push_back(std::move(pj));
        if (done) break;
      }
      log("hnswlib insert" + baseline_label(bk) + ": " + std::to_string(N - base) + " keys at " + std::to_string(insert_us) +
                 " us/key");
      run["points"] = std::move(points);
      runs.push_back(std::move(run));
    }
    insert_report["baselines"] = std::move(runs);
  }
}

}  // namespace rattn::bench
