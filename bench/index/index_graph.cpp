// `rattn bench index`: the projected graph's phase.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/index/index_phases.h"
#include "core/atomic_file.h"
#include "core/npy.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"

namespace rattn::bench {
namespace {

namespace json = boost::json;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

void IndexRun::graph_phase() {
  MethodResult r;
  r.name = "projected_graph";
  const double t0 = seconds_now();
  double last_report = t0;
  // Cache file: "rattn-bench-graph\n", the fingerprint's length and text, then the index image.
  const std::string magic = "rattn-bench-graph\n", head = magic + std::to_string(o.build_fingerprint.size()) + "\n" +
                                                         o.build_fingerprint;
  std::unique_ptr<KeyIndex> index;
  if (!o.graph_cache.empty() && ::access(o.graph_cache.c_str(), F_OK) == 0) {
    const std::string bytes = read_file(o.graph_cache);
    if (bytes.compare(0, head.size(), head) == 0) {
      index = deserialize_index(std::string_view(bytes).substr(head.size()));
      r.extra["loaded_from_cache"] = true;
      log("projected_graph: loaded from " + o.graph_cache + " (build time below is the load time)");
    } else {
      log("projected_graph: " + o.graph_cache + " holds a graph of other options; rebuilding");
    }
  }
  if (!index) {
    const bool pooled = !ds.pooled.empty();
    const int64_t n_train = pooled ? int64_t(ds.pooled.size() / size_t(ds.dim)) : N;
    index = build_projected_graph(keys, pooled ? ds.pooled.data() : ds.train.data(), n_train, o.graph, nullptr, [&](double x) {
      if (x >= 0.6 && seconds_now() - last_report > 0.05) {
        log("    build " + std::to_string(x) + " at " + std::to_string(seconds_now() - t0) + " s");
        last_report = seconds_now();
      }
    });
    if (!o.graph_cache.empty()) {
      std::string bytes = head;
      index->serialize(&bytes);
      write_file_atomic(o.graph_cache, bytes);
    }
  }
  r.build_seconds = seconds_now() - t0;
  r.bytes = index->memory_bytes();
  const GraphInfo gi = projected_graph_info(*index);
  r.extra["adjacency_bytes_per_key"] = double(gi.adjacency_bytes) / double(N);
  r.extra["mean_degree"] = gi.mean_degree;
  r.extra["unreached_before_repair"] = gi.unreached_before_repair;
  r.extra["unreachable"] = gi.unreachable;
  r.extra["key_alignment"] = gi.key_alignment;
  r.extra["key_metric"] = gi.key_metric;
  r.extra["knn_partitions"] = gi.knn_partitions;
  r.extra["knn_scanned_fraction"] = gi.knn_scanned_fraction;
  if (gi.knn_partitions > 0) {
    json::object steps;
    steps["partitions"] = gi.knn_partition_seconds;
    steps["probes"] = gi.knn_probe_seconds;
    steps["scan"] = gi.knn_scan_seconds;
    r.extra["knn_steps_seconds"] = std::move(steps);
  }
  if (gi.knn_on_gpu) {
    json::object steps;
    steps["gpu_open"] = gi.knn_gpu_open_seconds;
    steps["upload"] = gi.knn_gpu_upload_seconds;
    steps["kernel"] = gi.knn_gpu_kernel_seconds;
    steps["download"] = gi.knn_gpu_download_seconds;
    r.extra["knn_steps_seconds"] = std::move(steps);
  }
  {
    // Seconds per build phase (wall), and CPU seconds per phase: cpu / wall
    // near the thread count means both build threads were busy.
    json::object phases, cpu;
    std::string line = "    build phases (wall s / cpu s):";
    for (const BuildPhase& ph : gi.build_phases) {
      phases[ph.name] = ph.seconds;
      cpu[ph.name] = ph.cpu_seconds;
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.2f/%.2f", ph.name.c_str(), ph.seconds, ph.cpu_seconds);
      line += buf;
    }
    r.extra["build_phases"] = std::move(phases);
    r.extra["build_phases_cpu"] = std::move(cpu);
    log(line);
  }
  log("projected_graph: build " + std::to_string(r.build_seconds) + " s, " +
             std::to_string(double(gi.adjacency_bytes) / double(N)) + " B/key adjacency, mean degree " +
             std::to_string(gi.mean_degree) + ", unreached before repair " + std::to_string(gi.unreached_before_repair) +
             ", key alignment " + std::to_string(gi.key_alignment) + ", key metric " + std::to_string(gi.key_metric) +
             ", kNN " + (gi.knn_partitions > 0 ? std::to_string(gi.knn_partitions) + " partitions, " : std::string("exact, ")) +
             std::to_string(100 * gi.knn_scanned_fraction) + "% of keys scored per training query");
  {
    // The floor of the graph's degree: a walk that expands exactly each
    // query's true top-k (and nothing else) still scores this share.
    double floor_sum = 0;
    for (int64_t i = 0; i < m; ++i)
      floor_sum += double(expansion_footprint(*index, gt[size_t(i)].data(), int(gt[size_t(i)].size())));
    const double floor = m > 0 ? floor_sum / double(m) / double(N) : 0.0;
    r.extra["answer_expansion_scored_fraction"] = floor;
    log("  expanding exactly the true top-" + std::to_string(o.k) + " scores " + std::to_string(100 * floor) +
               "% of the keys (the floor of this graph's walks)");
  }
  if (!o.dump_graph.empty()) {
    std::vector<int32_t> lists(size_t(N) * size_t(gi.slots), -1);
    for (int64_t i = 0; i < N; ++i) {
      const std::vector<int32_t> nbrs = projected_graph_neighbors(*index, int32_t(i));
      std::copy(nbrs.begin(), nbrs.end(), lists.begin() + std::ptrdiff_t(size_t(i) * size_t(gi.slots)));
    }
    write_npy(o.dump_graph + ".lists.npy", NpyType::i32, {N, int64_t(gi.slots)}, lists.data());
    const std::vector<int32_t> entries = projected_graph_entries(*index);
    write_npy(o.dump_graph + ".entries.npy", NpyType::i32, {int64_t(entries.size())}, entries.data());
  }
  auto scratch = index->make_scratch();
  SearchResult sr;
  int op_index = -1;
  // The search variants run side by side: at each budget, blocks of test
  // queries go through every variant in turn (rotating the order), so that
  // the shared machine's load drifts alike for all of them.
  const size_t nv = o.search.size();
  std::vector<SearchParams> sps(nv);
  std::vector<std::vector<Point>> pts(nv);
  for (size_t v = 0; v < nv; ++v) {
    // Warm-up: the first search with codes encodes them (timed: a cost the
    // runtime pays once per index).
    sps[v] = o.search[v].params(o.k, o.budgets.front());
    const double t1 = seconds_now();
    index->search(ds.test.data(), keys, sps[v], *scratch, sr);
    if (o.search[v].codes && !r.extra.contains("first_search_with_codes_ms")) {
      r.extra["first_search_with_codes_ms"] = (seconds_now() - t1) * 1e3;
      log("  first search with codes (encodes them): " + std::to_string((seconds_now() - t1) * 1e3) + " ms");
    }
  }
  // Timing rounds (--repeat), outermost so that a busy spell of the shared
  // machine falls on one round rather than on one budget; the median round
  // is reported. The searches are deterministic: round 0 keeps the ids and
  // keys scored, later rounds only time.
  constexpr int64_t kBlock = 25;
  const size_t n_budgets = o.budgets.size();
  std::vector<std::vector<IdLists>> got_at(n_budgets, std::vector<IdLists>(nv, IdLists(static_cast<size_t>(m))));
  std::vector<std::vector<double>> scored_at(n_budgets, std::vector<double>(nv, 0.0));
  std::vector<std::vector<std::vector<double>>> secs_at(n_budgets, std::vector<std::vector<double>>(nv)),
      cpu_at = secs_at;
  for (int round = 0; round < o.repeat; ++round)
    for (size_t li = 0; li < n_budgets; ++li) {
      const int L = o.budgets[li];
      std::vector<IdLists>& got = got_at[li];
      std::vector<double> secs(nv, 0.0), cpu(nv, 0.0);
      for (int64_t i0 = 0, b = 0; i0 < m; i0 += kBlock, ++b) {
        const int64_t i1 = std::min(m, i0 + kBlock);
        for (size_t t = 0; t < nv; ++t) {
          const size_t v = (size_t(b) + t) % nv;
          sps[v].queue_length = L;
          const double t1 = seconds_now(), c1 = thread_cpu_seconds();
          for (int64_t i = i0; i < i1; ++i) {
            if (o.search[v].seeds > 0 && i > 0) {
              const std::vector<int32_t>& prev = got[v][size_t(i - 1)];
              sps[v].seeds = prev.data();
              sps[v].num_seeds = std::min(o.search[v].seeds, int(prev.size()));
            } else {
              sps[v].seeds = nullptr;
              sps[v].num_seeds = 0;
            }
            index->search(ds.test.data() + size_t(i) * size_t(d), keys, sps[v], *scratch, sr);
            if (round == 0) {
              got[v][size_t(i)] = sr.ids;
              scored_at[li][v] += double(sr.keys_scored);
            }
          }
          sps[v].seeds = nullptr;  // `got` is this budget's
          sps[v].num_seeds = 0;
          secs[v] += seconds_now() - t1;
          cpu[v] += thread_cpu_seconds() - c1;
        }
      }
      for (size_t v = 0; v < nv; ++v) {
        secs_at[li][v].push_back(secs[v] * 1e6 / double(m));
        cpu_at[li][v].push_back(cpu[v] * 1e6 / double(m));
      }
    }
  for (size_t li = 0; li < n_budgets; ++li) {
    const int L = o.budgets[li];
    std::vector<IdLists>& got = got_at[li];
    const std::vector<double>& scored = scored_at[li];
    std::string line = "  L=" + std::to_string(L);
    for (size_t v = 0; v < nv; ++v) {
      Point p;
      p.budget_name = "queue_length";
      p.budget = L;
      p.us_rounds = secs_at[li][v];
      p.us_per_query = median(secs_at[li][v]);
      p.cpu_us_per_query = median(cpu_at[li][v]);
      p.recall = harness::mean_recall(got[v], gt, o.k);
      p.scored_fraction = scored[v] / double(m) / double(N);
      pts[v].push_back(p);
      line += "  " + o.search[v].name + ": recall " + std::to_string(p.recall) + " scored " +
              std::to_string(100 * p.scored_fraction) + "% " + std::to_string(p.us_per_query) + " us (cpu " +
              std::to_string(p.cpu_us_per_query) + ")";
    }
    log(line);
    const Point& p = pts[0].back();
    {
      // Where the misses are (reported variant): the first tokens, the last 1024 of the context, or older.
      int64_t miss[3] = {0, 0, 0};
      for (int64_t i = 0; i < m; ++i) {
        std::vector<int32_t> g(gt[size_t(i)]), h(got[0][size_t(i)]);
        std::sort(g.begin(), g.end());
        std::sort(h.begin(), h.end());
        std::vector<int32_t> lost;
        std::set_difference(g.begin(), g.end(), h.begin(), h.end(), std::back_inserter(lost));
        for (int32_t id : lost) ++miss[id < 16 ? 0 : (N - id <= 1024 ? 1 : 2)];
      }
      json::object mb;
      mb["first_16"] = double(miss[0]) / double(m);
      mb["last_1024"] = double(miss[1]) / double(m);
      mb["older"] = double(miss[2]) / double(m);
      r.extra["misses_per_query_L" + std::to_string(L)] = std::move(mb);
      log("    misses/query: first16 " + std::to_string(double(miss[0]) / double(m)) + " last1024 " +
                 std::to_string(double(miss[1]) / double(m)) + " older " + std::to_string(double(miss[2]) / double(m)));
    }
    if (op_index < 0 && p.recall >= o.target_recall) op_index = int(pts[0].size()) - 1;
    if (op_index < 0 || op_index == int(pts[0].size()) - 1) op_ids = std::move(got[0]);
  }
  r.points = pts[0];
  json::array variants;
  for (size_t v = 1; v < nv; ++v) {
    json::object vj;
    vj["name"] = o.search[v].name;
    vj["traversal_codes"] = o.search[v].codes;
    vj["expand_width"] = o.search[v].width;
    vj["rerank"] = o.search[v].rerank;
    vj["code_dims"] = o.search[v].code_dims;
    vj["code_coarse_dims"] = o.search[v].code_coarse_dims;
    vj["patience"] = o.search[v].patience;
    vj["seeds"] = o.search[v].seeds;
    vj["expand_first"] = o.search[v].expand_first;
    vj["full_expand_rank"] = o.search[v].full_expand_rank;
    vj["points"] = to_json(pts[v]);
    variants.push_back(std::move(vj));
  }
  r.extra["search"] = o.search.front().name;
  r.extra["search_variants"] = std::move(variants);
  {
    const GraphInfo gs = projected_graph_info(*index);
    r.extra["code_bytes_per_key"] = double(gs.code_bytes) / double(N);
    r.bytes = index->memory_bytes();  // now with the traversal codes, if a variant used them
  }
  if (op_index < 0) {
    op_index = int(r.points.size()) - 1;
    log("  (target recall not reached; operating point = largest budget)");
  }
  if (has("flat")) {
    // The operating point and the exact flat scan side by side: blocks of
    // 10 queries alternate between them (first 200 queries), so that the
    // ratio does not depend on when the shared machine was busy.
    auto bf = make_brute_force_index(N);
    auto bf_scratch = bf->make_scratch();
    SearchParams fsp;
    fsp.k = o.k;
    SearchParams gsp = sps[0];
    gsp.queue_length = int(r.points[size_t(op_index)].budget);
    const int64_t mt = std::min<int64_t>(m, 200);
    std::vector<double> graph_us, flat_us_rounds, ratios;  // per timing round (--repeat)
    for (int round = 0; round < o.repeat; ++round) {
      double t_graph = 0, t_flat = 0;
      for (int64_t i0 = 0, b = 0; i0 < mt; i0 += 10, ++b) {
        const int64_t i1 = std::min(mt, i0 + 10);
        for (int t = 0; t < 2; ++t) {
          const bool graph_turn = (t + b) % 2 == 0;
          const double t1 = seconds_now();
          for (int64_t i = i0; i < i1; ++i) {
            const float* q = ds.test.data() + size_t(i) * size_t(d);
            if (graph_turn) index->search(q, keys, gsp, *scratch, sr);
            else bf->search(q, keys, fsp, *bf_scratch, sr);
          }
          (graph_turn ? t_graph : t_flat) += seconds_now() - t1;
        }
      }
      graph_us.push_back(t_graph * 1e6 / double(mt));
      flat_us_rounds.push_back(t_flat * 1e6 / double(mt));
      ratios.push_back(t_flat / t_graph);
    }
    json::object pj;
    pj["queries"] = mt;
    pj["queue_length"] = gsp.queue_length;
    pj["graph_us_per_query"] = median(graph_us);
    pj["flat_us_per_query"] = median(flat_us_rounds);
    pj["speedup_vs_flat"] = median(ratios);  // the median round's ratio
    json::array ratio_rounds;
    for (double x : ratios) ratio_rounds.push_back(x);
    pj["speedup_rounds"] = std::move(ratio_rounds);
    r.extra["paired_with_flat"] = pj;
    log("  paired with the flat scan at L=" + std::to_string(gsp.queue_length) + ": graph " +
               std::to_string(median(graph_us)) + " us, flat " + std::to_string(median(flat_us_rounds)) +
               " us per query: " + std::to_string(median(ratios)) + "x (median of " + std::to_string(o.repeat) +
               " rounds)");
  }
  if (o.interleave > 0) {
    // search_many() over N copies of the index (the query heads of a GQA
    // group have one index each over the same keys), N test queries at a
    // time on this thread; results must equal the single searches.
    const int n_jobs = o.interleave;
    std::string image;
    index->serialize(&image);
    std::vector<std::unique_ptr<KeyIndex>> copies;
    std::vector<std::unique_ptr<SearchScratch>> scratches;
    for (int j = 0; j < n_jobs; ++j) {
      copies.push_back(deserialize_index(image));
      scratches.push_back(copies.back()->make_scratch());
    }
    const SearchParams sp = o.search.front().params(o.k, int(r.points[size_t(op_index)].budget));
    std::vector<SearchResult> outs(static_cast<size_t>(n_jobs));
    std::vector<SearchJob> jobs(static_cast<size_t>(n_jobs));
    for (int j = 0; j < n_jobs; ++j) copies[size_t(j)]->search(ds.test.data(), keys, sp, *scratches[size_t(j)], outs[size_t(j)]);
    IdLists got(static_cast<size_t>(m));
    std::vector<int64_t> got_scored(static_cast<size_t>(m));
    // N test queries at a time; one_graph: every job on `index` (the walks
    // of a shared graph, in lockstep), else each on its copy.
    const auto run_many = [&](bool one_graph, double* cpu_us) {
      const double t1 = seconds_now(), c1 = thread_cpu_seconds();
      for (int64_t i0 = 0; i0 < m; i0 += n_jobs) {
        const int n = int(std::min<int64_t>(n_jobs, m - i0));
        for (int j = 0; j < n; ++j)
          jobs[size_t(j)] = {one_graph ? index.get() : copies[size_t(j)].get(), ds.test.data() + size_t(i0 + j) * size_t(d),
                             scratches[size_t(j)].get(), &outs[size_t(j)]};
        search_many(jobs.data(), n, keys, sp);
        for (int j = 0; j < n; ++j) {
          got[size_t(i0 + j)] = outs[size_t(j)].ids;
          got_scored[size_t(i0 + j)] = outs[size_t(j)].keys_scored;
        }
      }
      *cpu_us = (thread_cpu_seconds() - c1) * 1e6 / double(m);
      return (seconds_now() - t1) * 1e6 / double(m);
    };
    const bool shared = !ds.pooled.empty() && !sp.traversal_codes;
    double cpu_us = 0, cpu_lockstep = 0;
    const double us_lockstep = shared ? run_many(true, &cpu_lockstep) : 0;
    const IdLists got_lockstep = got;
    const double us = run_many(false, &cpu_us);
    bool same = !shared || got_lockstep == got;
    // The same queries one at a time (same copies, same order), for the check and the ratio.
    const double t2 = seconds_now(), c2 = thread_cpu_seconds();
    for (int64_t i = 0; i < m; ++i) {
      const size_t j = size_t(i % n_jobs);
      copies[j]->search(ds.test.data() + size_t(i) * size_t(d), keys, sp, *scratches[j], outs[0]);
      same = same && outs[0].ids == got[size_t(i)] && outs[0].keys_scored == got_scored[size_t(i)];
    }
    const double us_single = (seconds_now() - t2) * 1e6 / double(m),
                 cpu_single = (thread_cpu_seconds() - c2) * 1e6 / double(m);
    json::object ij;
    ij["jobs"] = n_jobs;
    ij["queue_length"] = sp.queue_length;
    ij["throughput_us_per_query"] = us;
    ij["single_us_per_query_same_copies"] = us_single;
    ij["speedup"] = us_single / us;
    ij["throughput_cpu_us_per_query"] = cpu_us;
    ij["single_cpu_us_per_query_same_copies"] = cpu_single;
    ij["identical_to_single_searches"] = same;
    if (shared) {  // --shared-graph: the same jobs walking one graph in lockstep
      ij["lockstep_us_per_query"] = us_lockstep;
      ij["lockstep_cpu_us_per_query"] = cpu_lockstep;
      ij["lockstep_speedup_vs_interleaved"] = us / us_lockstep;
      log("  lockstep x" + std::to_string(n_jobs) + " on the shared graph: " + std::to_string(us_lockstep) +
          " us/query (interleaved copies " + std::to_string(us) + ", " + std::to_string(us / us_lockstep) + "x)");
    }
    r.extra["interleaved"] = std::move(ij);
    log("  search_many x" + std::to_string(n_jobs) + " at L=" + std::to_string(sp.queue_length) + ": " +
               std::to_string(us) + " us/query throughput (single " + std::to_string(us_single) + " us/query, " +
               std::to_string(us_single / us) + "x; cpu " + std::to_string(cpu_us) + " vs " +
               std::to_string(cpu_single) + "); identical results: " + (same ? "yes" : "NO"));
  }
  const Point& op = r.points[size_t(op_index)];
  operating["method"] = r.name;
  operating["queue_length"] = op.budget;
  operating["recall"] = op.recall;
  operating["scored_fraction"] = op.scored_fraction;
  operating["us_per_query"] = op.us_per_query;
  if (r.extra.contains("paired_with_flat"))
    operating["paired_speedup_vs_flat"] = r.extra["paired_with_flat"].as_object().at("speedup_vs_flat");
  operating["meets_recall_and_budget"] = op.recall >= o.target_recall && op.scored_fraction <= o.target_scored;
  results.push_back(std::move(r));
}

}  // namespace rattn::bench
