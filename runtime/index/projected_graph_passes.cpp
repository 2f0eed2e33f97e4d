// The projected graph's passes over a built adjacency: occlusion pruning,
// 2-hop fill, connectivity for unreached keys, query-guided repair and the
// co-occurrence order of the lists.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "runtime/index/projected_graph_impl.h"

namespace rattn::internal {

void occlusion_prune(const RowsView& kf, const std::vector<ScoredId>& ranked, int M, std::vector<int32_t>* out) {
  out->clear();
  std::vector<int32_t> dropped;
  for (const ScoredId& c : ranked) {
    if (int(out->size()) >= M) break;
    const float* cv = static_cast<const float*>(kf.row(c.id));
    bool occluded = false;
    for (int32_t r : *out) {
      if (dot_row(cv, kf, r) > c.score) {
        occluded = true;
        break;
      }
    }
    if (occluded) {
      dropped.push_back(c.id);
    } else {
      out->push_back(c.id);
    }
  }
  for (size_t i = 0; i < dropped.size() && int(out->size()) < M; ++i) out->push_back(dropped[i]);
}

// Under-full nodes take their best 2-hop neighbours; computed from a frozen
// copy of the lists, then applied, so threads never read a list being written.
void ProjectedGraph::fill_from_two_hop(const RowsView& kf, const GraphBuildParams& p) {
  const int64_t N = nodes();
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  std::vector<int32_t> added(size_t(N) * size_t(M_), -1);
#pragma omp parallel num_threads(p.threads)
  {
    std::vector<int32_t> cand;
    std::vector<uint32_t> seen;
    std::vector<float> scores;
    std::vector<ScoredId> ranked;
#pragma omp for schedule(dynamic, 256)
    for (int64_t v = 0; v < N; ++v) {
      const int32_t* nv = node(v);
      if (nv[0] < 0 || nv[0] >= M_) continue;
      // 2-hop nodes that are neither v nor its neighbours, each once (a
      // per-thread stamp array; each v is visited once, so v + 1 is fresh).
      cand.clear();
      if (seen.empty()) seen.assign(size_t(N), 0u);
      const uint32_t stamp = uint32_t(v) + 1;
      seen[size_t(v)] = stamp;
      for (int j = 1; j <= nv[0]; ++j) seen[size_t(nv[j])] = stamp;
      for (int j = 1; j <= nv[0]; ++j) {
        const int32_t* nu = node(nv[j]);
        for (int i = 1; i <= nu[0]; ++i)
          if (seen[size_t(nu[i])] != stamp) {
            seen[size_t(nu[i])] = stamp;
            cand.push_back(nu[i]);
          }
      }
      // One batched call: random rows, fetched ahead of use.
      scores.resize(cand.size());
      build_dist->dots(static_cast<const float*>(kf.row(v)), kf, cand.data(), int(cand.size()), scores.data());
      ranked.resize(cand.size());
      for (size_t i = 0; i < cand.size(); ++i) ranked[i] = {scores[i], cand[i]};
      const size_t want = std::min(ranked.size(), size_t(M_ - nv[0]));
      keep_best_sorted(ranked, want);
      for (size_t i = 0; i < want; ++i) added[size_t(v) * size_t(M_) + i] = ranked[i].id;
    }
  }
  for (int64_t v = 0; v < N; ++v) {
    int32_t* nv = node(v);
    for (int i = 0; i < M_ && nv[0] < M_; ++i) {
      const int32_t c = added[size_t(v) * size_t(M_) + size_t(i)];
      if (c < 0) break;
      nv[++nv[0]] = c;
    }
  }
}

// Counts, for every edge v -> u, the training lists holding both v and u
// (saturating at 2^16 - 1), then sorts each list by that count, stable.
// Thread t counts the nodes v with v % threads == t, so no two threads write
// one count; each marks every list's members in its own stamp array.
void ProjectedGraph::order_by_cooccurrence(const std::vector<int32_t>& knn, int64_t num_lists, int nq, int threads) {
  const int64_t N = nodes();
  std::vector<uint16_t> together(size_t(N) * size_t(slots_), 0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    std::vector<uint32_t> stamp(size_t(N), 0);
    for (int64_t q = 0; q < num_lists; ++q) {
      const int32_t* list = knn.data() + size_t(q) * size_t(nq);
      const uint32_t mark = uint32_t(q) + 1;
      for (int j = 0; j < nq; ++j) stamp[size_t(list[j])] = mark;
      // The list's nodes are scattered: fetch their lists and counters a few ahead.
      constexpr int kAhead = 8;
      for (int j = 0; j < nq; ++j) {
        if (j + kAhead < nq && list[j + kAhead] % T == t) {
          prefetch_span(node(list[j + kAhead]), sizeof(int32_t) * size_t(stride_));
          prefetch_span(together.data() + size_t(list[j + kAhead]) * size_t(slots_), sizeof(uint16_t) * size_t(slots_));
        }
        const int32_t v = list[j];
        if (v % T != t) continue;
        const int32_t* nbr = node(v);
        uint16_t* c = together.data() + size_t(v) * size_t(slots_);
        for (int i = 0; i < nbr[0]; ++i)
          if (stamp[size_t(nbr[i + 1])] == mark && c[i] != UINT16_MAX) ++c[i];
      }
    }
#pragma omp barrier
    std::vector<std::pair<int, int32_t>> ranked;
#pragma omp for schedule(static)
    for (int64_t v = 0; v < N; ++v) {
      int32_t* nbr = node(v);
      const uint16_t* c = together.data() + size_t(v) * size_t(slots_);
      ranked.resize(size_t(std::max(nbr[0], 0)));
      // A stable insertion sort: lists are short (M + extra slots), and
      // std::stable_sort allocated a buffer per node.
      for (size_t i = 0; i < ranked.size(); ++i) {
        const std::pair<int, int32_t> x{-int(c[i]), nbr[i + 1]};
        size_t j = i;
        for (; j > 0 && ranked[j - 1].first > x.first; --j) ranked[j] = ranked[j - 1];
        ranked[j] = x;
      }
      for (size_t i = 0; i < ranked.size(); ++i) nbr[i + 1] = ranked[i].second;
    }
  }
}

// Keys that no path from the entry points reaches are linked in. Their
// neighbourhood: the key's best partition-mates by inner product, with the
// partitioned kNN's partitions or, when thousands of keys are unreached, a
// short k-means of the rows; else (or when no partition-mate is reached
// yet) a beam search with the key itself as the query. The key gets
// out-edges (if it has none) and an in-edge from its best reached
// neighbour (a free slot first; else it replaces that key's weakest
// non-tree edge; else any tree node takes it). Linking a key also brings in
// whatever is reachable only through it, and the tree is never cut, so one
// pass reaches every key. Partition-mates cost one scan of about 256 rows
// where a search, at 524288 keys, cost ~300 us.
void ProjectedGraph::connect_unreached(const RowsView& kf, const GraphBuildParams& p,
                                       const std::vector<int32_t>& key_partition) {
  build_tree();
  // Also reached keys without out-edges (an entry point in no training
  // list): they take out-edges, or a walk through them ends there.
  std::vector<int32_t> todo;
  int64_t unreached = 0;
  for (int64_t i = 0; i < nodes(); ++i)
    if (parent_[size_t(i)] == kNoParent || node(i)[0] == 0) {
      todo.push_back(int32_t(i));
      unreached += parent_[size_t(i)] == kNoParent;
    }
  unreached_before_repair_ = unreached;
  if (todo.empty()) return;
  const int want = M_;
  std::vector<int32_t> hits(todo.size() * size_t(want), -1);
  // Without the kNN's partitions and with many keys to link: a short k-means
  // of the rows (4 steps; at 524288 keys about 1 s against 11 s of searches).
  constexpr int64_t kPartitionFrom = 4096, kPartitionKeys = 256;
  std::vector<int32_t> own_partition;
  if (p.connect_by_partition && key_partition.size() != size_t(nodes()) && unreached >= kPartitionFrom)
    own_partition = key_partition_ids(kf, nodes() / kPartitionKeys, 4, p.seed ^ 0x636f6e6eull, p.threads);
  const std::vector<int32_t>& partition_of = own_partition.empty() ? key_partition : own_partition;
  const bool by_partition = p.connect_by_partition && partition_of.size() == size_t(nodes());
  RowGroups groups;
  if (by_partition)
    groups = group_rows(partition_of, 1 + *std::max_element(partition_of.begin(), partition_of.end()));
  const std::vector<int64_t>& pstart = groups.start;
  const std::vector<int32_t>& members = groups.members;
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  // x's neighbourhood from a search with its own key: h[0, want), -1 after the hits.
  const auto search_hits = [&](int32_t x, GraphScratch& s, int32_t* h) {
    beam_search(static_cast<const float*>(kf.row(x)), kf, build_queue_, s);
    std::fill(h, h + want, -1);
    int n = 0;
    for (size_t i = 0; i < s.pool.size() && n < want; ++i)
      if (s.pool[i].id != x) h[n++] = s.pool[i].id;
  };
  // The best `want` of the candidates by inner product with x, best first.
  const auto rank = [&](int32_t x, const std::vector<int32_t>& cand, std::vector<float>& scores,
                        std::vector<ScoredId>& ranked) {
    scores.resize(cand.size());
    build_dist->dots(static_cast<const float*>(kf.row(x)), kf, cand.data(), int(cand.size()), scores.data());
    ranked.resize(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) ranked[i] = {scores[i], cand[i]};
    keep_best_sorted(ranked, size_t(want));
  };
  // Out-lists of partition-linked keys without one (-1: empty slot).
  std::vector<int32_t> outs(by_partition ? todo.size() * size_t(M_) : 0, -1);
  // Partition by partition, so that a partition's rows are read from memory
  // once for all of its keys to link, not once per key (each result has its
  // own slot: the order changes nothing else).
  std::vector<int32_t> visit(todo.size());
  std::iota(visit.begin(), visit.end(), 0);
  if (by_partition)
    std::stable_sort(visit.begin(), visit.end(), [&](int32_t a, int32_t b) {
      return partition_of[size_t(todo[size_t(a)])] < partition_of[size_t(todo[size_t(b)])];
    });
#pragma omp parallel num_threads(p.threads)
  {
    GraphScratch s;
    std::vector<int32_t> cand, out;
    std::vector<float> scores;
    std::vector<ScoredId> ranked;
#pragma omp for schedule(dynamic, 64)
    for (int64_t v = 0; v < int64_t(todo.size()); ++v) {
      const int64_t t = visit[size_t(v)];
      const int32_t x = todo[size_t(t)];
      int32_t* h = hits.data() + size_t(t) * size_t(want);
      if (!by_partition) {
        search_hits(x, s, h);
        continue;
      }
      const int32_t c = partition_of[size_t(x)];
      cand.clear();
      for (int64_t i = pstart[size_t(c)]; i < pstart[size_t(c) + 1]; ++i)
        if (members[size_t(i)] != x) cand.push_back(members[size_t(i)]);
      rank(x, cand, scores, ranked);
      for (size_t i = 0; i < ranked.size(); ++i) h[i] = ranked[i].id;
      if (node(x)[0] == 0 && !ranked.empty()) {  // its out-list, here in parallel (nothing writes lists yet)
        occlusion_prune(kf, ranked, M_, &out);
        std::copy(out.begin(), out.end(), outs.begin() + std::ptrdiff_t(size_t(t) * size_t(M_)));
      }
    }
  }
  if (by_partition)
    for (size_t t = 0; t < todo.size(); ++t) {
      const int32_t* o = outs.data() + t * size_t(M_);
      const int n = int(std::find(o, o + M_, -1) - o);
      if (n > 0) set_neighbors(todo[t], std::vector<int32_t>(o, o + n));
    }
  GraphScratch serial;
  std::vector<int32_t> cand, out;
  std::vector<float> scores;
  std::vector<ScoredId> ranked;
  for (size_t t = 0; t < todo.size(); ++t) {
    const int32_t x = todo[t];
    int32_t* h = hits.data() + t * size_t(want);
    // A partition of one, or no partition-mate reached yet: the key's
    // neighbourhood from a search, not an edge forced into an entry point's list.
    if (by_partition && (h[0] < 0 || (parent_[size_t(x)] == kNoParent &&
                                      std::none_of(h, h + want, [&](int32_t u) {
                                        return u >= 0 && parent_[size_t(u)] != kNoParent;
                                      }))))
      search_hits(x, serial, h);
    if (node(x)[0] == 0) {
      cand.assign(h, std::find(h, h + want, -1));
      rank(x, cand, scores, ranked);
      occlusion_prune(kf, ranked, M_, &out);
      set_neighbors(x, out);
    }
    if (parent_[size_t(x)] != kNoParent) continue;  // reached through a key linked before
    // Only reached keys give in-edges (a search's hits all are; partition-mates may not be).
    for (int i = 0; i < want && h[i] >= 0 && parent_[size_t(x)] == kNoParent; ++i) {
      int32_t* nb = node(h[i]);
      if (parent_[size_t(h[i])] != kNoParent && nb[0] < slots_) {
        nb[++nb[0]] = x;
        adopt(h[i], x);
      }
    }
    for (int i = 0; i < want && h[i] >= 0 && parent_[size_t(x)] == kNoParent; ++i)
      if (parent_[size_t(h[i])] != kNoParent) add_in_edge(kf, h[i], x, /*force=*/true);
    if (parent_[size_t(x)] == kNoParent) link_anywhere(x);
  }
  unreachable_ = count_outside_tree();
}

// Query-guided repair: training queries search the graph; a key of a query's
// exact top-Nq list the search missed is the kind of key decode queries miss
// too, so it gets an in-edge from the found list key nearest to it. Queries
// run in chunks (searches in parallel, edges applied in order) so later
// searches see earlier repairs.
int64_t ProjectedGraph::repair_with_queries(const RowsView& kf, const RowsView& kk, const float* queries,
                                            const std::vector<int64_t>& picked, const std::vector<int32_t>& knn,
                                            int nq, const GraphBuildParams& p) {
  const int64_t Q = int64_t(picked.size());
  int64_t R = std::min<int64_t>(Q, int64_t(std::llround(double(Q) * p.repair_fraction)));
  if (p.repair_max_queries > 0) R = std::min(R, p.repair_max_queries);
  if (R <= 0) return 0;
  int64_t offered = 0;
  const int L = std::max(build_queue_, nq);
  constexpr int64_t kChunk = 512;
  const std::unique_ptr<Distance> build_dist = make_distance(nullptr);
  // Edges (from, to) of each query of a chunk, applied in query order, so
  // the pass gives the same graph whichever thread searched which query.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> per_query(static_cast<size_t>(kChunk));
  std::vector<std::pair<int32_t, int32_t>> edges;
  std::vector<int64_t> group_start;
  for (int64_t c0 = 0; c0 < R; c0 += kChunk) {
    const int64_t c1 = std::min(R, c0 + kChunk);
#pragma omp parallel num_threads(p.threads)
    {
      GraphScratch s;
      std::vector<uint32_t> mark;  // mark[id] == tag: in the search result
      std::vector<int32_t> hits, missed;
      std::vector<float> scores;
#pragma omp for schedule(dynamic, 16)
      for (int64_t r = c0; r < c1; ++r) {
        auto& mine = per_query[size_t(r - c0)];
        mine.clear();
        const int64_t qi = spread_pick(r, Q, R);
        const float* q = queries + size_t(picked[size_t(qi)]) * size_t(kf.dim);
        beam_search(q, kf, L, s);
        if (mark.size() < size_t(nodes())) mark.assign(size_t(nodes()), 0u);
        const uint32_t tag = uint32_t(r + 1);
        for (size_t i = 0; i < s.pool.size() && int(i) < nq; ++i) mark[size_t(s.pool[i].id)] = tag;
        const int32_t* nn = knn.data() + size_t(qi) * size_t(nq);
        hits.clear();
        missed.clear();
        for (int j = 0; j < nq; ++j) {
          // Rows of the key store not in the index (a refresh over a graph
          // with gaps) take no edges.
          if (node(nn[j])[0] == kAbsent) continue;
          (mark[size_t(nn[j])] == tag ? hits : missed).push_back(nn[j]);
        }
        if (hits.empty()) continue;
        scores.resize(hits.size());
        for (int32_t m : missed) {
          // The found key nearest to m (the first of equals), one batched call.
          build_dist->dots(static_cast<const float*>(kk.row(m)), kk, hits.data(), int(hits.size()), scores.data());
          size_t best = 0;
          for (size_t i = 1; i < hits.size(); ++i)
            if (scores[i] > scores[best]) best = i;
          mine.push_back({hits[best], m});
        }
      }
    }
    edges.clear();
    for (int64_t r = 0; r < c1 - c0; ++r) edges.insert(edges.end(), per_query[size_t(r)].begin(), per_query[size_t(r)].end());
    offered += int64_t(edges.size());
    apply_repair_edges(kk, &edges, &group_start, p.threads);
  }
  return offered;
}

// Adds the in-edges (from, to), in order, as add_in_edge(force = false) would.
// Once every key is in the spanning tree (after connect_unreached) no edge
// changes the tree, so the edits of different `from` lists are independent:
// the edges are grouped by `from` (stable, keeping their order) and the
// groups edited in parallel, with the same result as the serial loop.
void ProjectedGraph::apply_repair_edges(const RowsView& kk, std::vector<std::pair<int32_t, int32_t>>* edges,
                                        std::vector<int64_t>* group_start, int threads) {
  const bool tree_complete =
      weakest_.empty() && std::none_of(parent_.begin(), parent_.end(), [](int32_t v) { return v == kNoParent; });
  if (!tree_complete || threads <= 1) {
    for (const auto& e : *edges) add_in_edge(kk, e.first, e.second, /*force=*/false);
    return;
  }
  std::stable_sort(edges->begin(), edges->end(),
                   [](const std::pair<int32_t, int32_t>& a, const std::pair<int32_t, int32_t>& b) { return a.first < b.first; });
  group_start->clear();
  for (size_t i = 0; i < edges->size(); ++i)
    if (i == 0 || (*edges)[i].first != (*edges)[i - 1].first) group_start->push_back(int64_t(i));
  group_start->push_back(int64_t(edges->size()));
  const int64_t groups = int64_t(group_start->size()) - 1;
#pragma omp parallel num_threads(threads)
  {
    std::vector<int32_t> ids;
    std::vector<float> sc;
#pragma omp for schedule(dynamic, 64)
    for (int64_t g = 0; g < groups; ++g) {
      const int32_t from = (*edges)[size_t((*group_start)[size_t(g)])].first;
      int32_t* p = node(from);
      const float* fv = static_cast<const float*>(kk.row(from));
      for (int64_t i = (*group_start)[size_t(g)]; i < (*group_start)[size_t(g) + 1]; ++i) {
        const int32_t to = (*edges)[size_t(i)].second;
        if (std::find(p + 1, p + 1 + p[0], to) != p + 1 + p[0]) continue;
        if (p[0] < slots_) {
          p[++p[0]] = to;
          continue;
        }
        // The list and the new key in one call; the weakest non-tree edge
        // gives way when the new key beats it (add_in_edge's rule).
        ids.assign(p + 1, p + 1 + p[0]);
        ids.push_back(to);
        sc.resize(ids.size());
        distance_->dots(fv, kk, ids.data(), int(ids.size()), sc.data());
        float worst_score;
        const int worst = weakest_non_tree_slot(from, sc.data(), &worst_score);
        if (worst != 0 && sc[size_t(p[0])] > worst_score) p[worst] = to;
      }
    }
  }
}

}  // namespace rattn::internal
