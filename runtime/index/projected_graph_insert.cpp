// The projected graph's insert path (KeyIndex::insert) and the edge edits
// it shares with the build passes: in-edges that keep the spanning tree, the
// tree itself, and the insert parameters' check.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/index/projected_graph_impl.h"

namespace rattn::internal {

void check_insert_params(const GraphBuildParams& p, const char* who) {
  if (p.insert_queue < 1 || p.insert_queue > (1 << 20) || p.insert_pivots < 1 || p.insert_pivots > (1 << 20) ||
      p.insert_reverse < 0 || p.insert_reverse > (1 << 20) || p.insert_key_queue < 0 || p.insert_key_queue > (1 << 20))
    fail(Status::invalid_argument, std::string(who) +
                                       ": insert_queue and insert_pivots must be in [1, 2^20], insert_reverse and "
                                       "insert_key_queue in [0, 2^20]");
}

// A beam search with the token's own query (its training query, as in the
// build) and a short queue: the hits are the query's projected list; a
// short local search with the key adds its key-to-key neighbours.
// Out-edges: the M hits with the highest inner product with the new key.
// In-edges: from the query's best `insert_pivots` hits (pivots; the first
// always, replacing its weakest non-tree edge when full) and from the
// `insert_reverse` best out-neighbours (reverse edges, taken only when a
// slot is free or the new key beats the node's weakest neighbour). No
// re-pruning: at most insert_pivots + insert_reverse lists are touched.
void ProjectedGraph::insert(int32_t key_id, const float* own_query, const RowsView& keys) {
  insert_hinted(key_id, own_query, keys, nullptr, 0);
}

void ProjectedGraph::insert_hinted(int32_t key_id, const float* own_query, const RowsView& keys,
                                   const int32_t* hint_ids, int n_hints) {
  if (key_id < 0 || key_id >= keys.rows)
    fail(Status::invalid_argument, "projected graph: insert of key " + std::to_string(key_id) + " not in the key store");
  if (key_id < nodes() && node(key_id)[0] != kAbsent)
    fail(Status::invalid_argument, "projected graph: key " + std::to_string(key_id) + " is already indexed");
  if (!own_query) fail(Status::invalid_argument, "projected graph: insert needs the token's own query");
  if (key_id >= nodes()) {
    const int64_t old = nodes();
    grow_to(arena_, size_t(key_id + 1) * size_t(stride_), size_t(stride_));
    resize_nodes(int64_t(key_id) + 1);
    for (int64_t i = old; i < nodes(); ++i) node(i)[0] = kAbsent;
    grow_to(parent_, size_t(nodes()));
    parent_.resize(size_t(nodes()), kNoParent);
  }
  grow_to(weakest_, size_t(nodes()));
  weakest_.resize(size_t(nodes()), kUnknownWeakest);
  node(key_id)[0] = 0;
  ++size_;
  // Insert never runs concurrently with search; shared codes are their owner's.
  if (!shared_codes_ && own_codes_.codes().fitted()) own_codes_.update(keys, nodes());
  for (auto& [shape, pc] : projected_codes_) update_projected(keys, *pc, shape);
  if (entries_.empty()) {  // first node of an empty graph
    entries_.push_back(key_id);
    parent_[size_t(key_id)] = kRoot;
    return;
  }
  std::vector<float>& x = insert_key_;
  x.resize(size_t(keys.dim));
  to_f32(keys.dtype, keys.row(key_id), x.data(), x.size());
  if (!metric_.empty()) {
    // Key-to-key relations in the build's metric: <S x, k> = x' S k.
    if (metric_.size() != size_t(keys.dim) * size_t(keys.dim))
      fail(Status::invalid_argument, "projected graph: key store dimension does not match the graph's key metric");
    std::vector<float>& xs = insert_metric_key_;
    xs.assign(size_t(keys.dim), 0.0f);
    for (int a = 0; a < keys.dim; ++a) {
      const float* row = metric_.data() + size_t(a) * size_t(keys.dim);
      float acc = 0;
      for (int b = 0; b < keys.dim; ++b) acc += row[b] * x[size_t(b)];
      xs[size_t(a)] = acc;
    }
    x.swap(xs);
  } else if (!key_mean_.empty()) {
    // Centred key relations (the build's center_keys): <x - m, k> orders
    // the keys as <x - m, k - m> does.
    if (key_mean_.size() != size_t(keys.dim))
      fail(Status::invalid_argument, "projected graph: key store dimension does not match the graph's key mean");
    for (int j = 0; j < keys.dim; ++j) x[size_t(j)] -= key_mean_[size_t(j)];
  }
  int64_t metric_cost = metric_.empty() ? 0 : keys.dim;  // the matrix-vector product: d inner products
  GraphScratch& s = insert_scratch_;
  const int64_t edge_scored_before = edge_scored_;
  int64_t scored = metric_cost;
  // Seeds: the entry points and the previously inserted key (decoded tokens
  // arrive in order, and neighbours in position are often neighbours).
  // entries_ may change here: insert never runs concurrently with search.
  const size_t n_entries = entries_.size();
  const bool chain = last_inserted_ >= 0 && last_inserted_ < nodes() && node(last_inserted_)[0] != kAbsent &&
                     std::find(entries_.begin(), entries_.end(), last_inserted_) == entries_.end();
  std::vector<int32_t>& hits = insert_hits_;
  hits.clear();
  // Hints: the own query's hits from an earlier search (the decode step's),
  // best first; they replace the own-query search, the costliest part.
  for (int i = 0; hint_ids && i < n_hints && int(hits.size()) < insert_queue_; ++i) {
    const int32_t id = hint_ids[i];
    if (id != key_id && id >= 0 && id < nodes() && node(id)[0] != kAbsent &&
        std::find(hits.begin(), hits.end(), id) == hits.end())
      hits.push_back(id);
  }
  if (hits.empty()) {
    if (chain) entries_.push_back(last_inserted_);
    scored += beam_search(own_query, keys, insert_queue_, s);
    entries_.resize(n_entries);
    for (const Cand& c : s.pool)
      if (c.id != key_id) hits.push_back(c.id);
  }
  const size_t query_hits = hits.size();
  std::vector<float>& sc = insert_scores_;
  sc.resize(hits.size());
  distance_->dots(x.data(), keys, hits.data(), int(hits.size()), sc.data());
  scored += int64_t(hits.size());
  if (insert_key_queue_ > 0 && !hits.empty()) {
    // The key's own neighbours too, so that queries aimed at this key (not
    // at its own query's region) find a way in: a short local search with
    // the key, seeded from the hits nearest to it and the previous key.
    std::vector<int32_t> seeds;
    for (int r = 0; r < 2; ++r) {
      int best = -1;
      for (size_t i = 0; i < query_hits; ++i)
        if ((best < 0 || sc[i] > sc[size_t(best)]) && std::find(seeds.begin(), seeds.end(), hits[i]) == seeds.end())
          best = int(i);
      if (best >= 0) seeds.push_back(hits[size_t(best)]);
    }
    if (chain && std::find(seeds.begin(), seeds.end(), last_inserted_) == seeds.end()) seeds.push_back(last_inserted_);
    entries_.swap(seeds);
    scored += beam_search(x.data(), keys, insert_key_queue_, s);
    entries_.swap(seeds);
    for (const Cand& c : s.pool)
      if (c.id != key_id && std::find(hits.begin(), hits.begin() + std::ptrdiff_t(query_hits), c.id) ==
                                hits.begin() + std::ptrdiff_t(query_hits)) {
        hits.push_back(c.id);
        sc.push_back(c.score);  // already <key, c>
      }
  }
  last_inserted_ = key_id;
  if (hits.empty()) {
    link_anywhere(key_id);
    insert_scored_ += scored;
    ++inserts_;
    return;
  }
  std::vector<ScoredId>& ranked = insert_ranked_;
  ranked.clear();
  for (size_t i = 0; i < hits.size(); ++i) ranked.push_back({sc[i], hits[i]});
  const size_t keep = std::min(ranked.size(), size_t(M_));
  std::partial_sort(ranked.begin(), ranked.begin() + std::ptrdiff_t(keep), ranked.end(), better);
  int32_t* own = node(key_id);
  own[0] = int32_t(keep);
  weakest_[size_t(key_id)] = kUnknownWeakest;
  for (size_t i = 0; i < keep; ++i) own[i + 1] = ranked[i].id;
  add_in_edge(keys, hits[0], key_id, /*force=*/true);
  for (size_t i = 1; i < query_hits && int(i) < insert_pivots_; ++i) add_in_edge(keys, hits[i], key_id, /*force=*/false);
  for (size_t i = 0; i < keep && int(i) < insert_reverse_; ++i) add_in_edge(keys, ranked[i].id, key_id, /*force=*/false);
  if (parent_[size_t(key_id)] == kNoParent) link_anywhere(key_id);
  insert_scored_ += scored + (edge_scored_ - edge_scored_before);
  ++inserts_;
}

// The slot j (1..count) of `from`'s weakest non-tree edge, given the
// scores sc[j - 1] of its list; 0 (and +inf) when every edge is a tree edge.
int ProjectedGraph::weakest_non_tree_slot(int32_t from, const float* sc, float* worst_score) const {
  const int32_t* p = node(from);
  int worst = 0;
  *worst_score = std::numeric_limits<float>::infinity();
  for (int j = 1; j <= p[0]; ++j) {
    if (parent_[size_t(p[j])] == from) continue;  // tree edge
    if (sc[j - 1] < *worst_score) {
      *worst_score = sc[j - 1];
      worst = j;
    }
  }
  return worst;
}

// Adds edge from -> to; returns whether it was added. A full node keeps
// its best neighbours by inner product with itself (`force`: the new edge
// wins regardless). Edges of the spanning tree (parent_) are never
// replaced, so every key reachable from the entry points stays reachable.
bool ProjectedGraph::add_in_edge(const RowsView& keys, int32_t from, int32_t to, bool force) {
  int32_t* p = node(from);
  for (int j = 1; j <= p[0]; ++j)
    if (p[j] == to) {
      adopt(from, to);
      return true;
    }
  const bool cached = size_t(from) < weakest_.size();
  if (p[0] < slots_) {
    p[++p[0]] = to;
    if (cached) weakest_[size_t(from)] = kUnknownWeakest;  // the new edge may be weaker
    adopt(from, to);
    return true;
  }
  edge_vec_.resize(size_t(keys.dim));
  to_f32(keys.dtype, keys.row(from), edge_vec_.data(), edge_vec_.size());
  if (cached && !force && !std::isnan(weakest_[size_t(from)])) {
    // Refused unless it beats the cached weakest edge (a lower bound of the
    // true one): one inner product instead of rescoring the list.
    float s_new = 0;
    distance_->dots(edge_vec_.data(), keys, &to, 1, &s_new);
    edge_scored_ += 1;
    if (!(s_new > weakest_[size_t(from)])) return false;
  }
  // The node's list and the new key, scored in one batched call.
  edge_ids_.assign(p + 1, p + 1 + p[0]);
  edge_ids_.push_back(to);
  edge_scores_.resize(edge_ids_.size());
  distance_->dots(edge_vec_.data(), keys, edge_ids_.data(), int(edge_ids_.size()), edge_scores_.data());
  edge_scored_ += int64_t(edge_ids_.size());
  const float* sc = edge_scores_.data();
  float worst_score;
  const int worst = weakest_non_tree_slot(from, sc, &worst_score);
  if (worst == 0 || !(force || sc[p[0]] > worst_score)) {
    if (cached) weakest_[size_t(from)] = worst_score;  // +inf when every edge is a tree edge
    return false;
  }
  if (cached) {  // the weakest non-tree edge after the replacement (to's edge counted)
    float w = sc[p[0]];
    for (int j = 1; j <= p[0]; ++j)
      if (j != worst && parent_[size_t(p[j])] != from) w = std::min(w, sc[j - 1]);
    weakest_[size_t(from)] = w;
  }
  p[worst] = to;
  adopt(from, to);
  return true;
}

// Tree bookkeeping after an edge from -> to: when `from` is reachable and
// `to` was not, `to` and everything reachable only through it join the
// tree (breadth first, through nodes without a parent).
void ProjectedGraph::adopt(int32_t from, int32_t to) {
  if (parent_[size_t(from)] == kNoParent || parent_[size_t(to)] != kNoParent) return;
  parent_[size_t(to)] = from;
  tree_queue_.assign(1, to);
  grow_tree();
}

// Spanning tree of everything reachable from the entry points (BFS).
void ProjectedGraph::build_tree() {
  weakest_.clear();  // tree edges may change: the cached bounds no longer hold
  parent_.assign(size_t(nodes()), kNoParent);
  tree_queue_.clear();
  for (int32_t e : entries_)
    if (parent_[size_t(e)] == kNoParent) {
      parent_[size_t(e)] = kRoot;
      tree_queue_.push_back(e);
    }
  grow_tree();
}

// Breadth first from the tree nodes in tree_queue_: every node without a
// parent that they reach joins the tree.
void ProjectedGraph::grow_tree() {
  for (size_t h = 0; h < tree_queue_.size(); ++h) {
    const int32_t* nb = node(tree_queue_[h]);
    for (int j = 1; j <= nb[0]; ++j)
      if (parent_[size_t(nb[j])] == kNoParent) {
        parent_[size_t(nb[j])] = tree_queue_[h];
        tree_queue_.push_back(nb[j]);
      }
  }
}

// Present keys no path from the entry points reaches (a fresh traversal,
// independent of parent_).
int64_t ProjectedGraph::count_unreachable() const {
  const std::vector<uint8_t> seen = reachable();
  int64_t n = 0;
  for (int64_t i = 0; i < nodes(); ++i) n += !seen[size_t(i)] && node(i)[0] != kAbsent;
  return n;
}

int64_t ProjectedGraph::count_outside_tree() const {
  int64_t n = 0;
  for (int64_t i = 0; i < nodes(); ++i) n += parent_[size_t(i)] == kNoParent && node(i)[0] != kAbsent;
  return n;
}

std::vector<uint8_t> ProjectedGraph::reachable() const {
  std::vector<uint8_t> seen(size_t(nodes()), 0);
  std::vector<int32_t> stack(entries_.begin(), entries_.end());
  for (int32_t e : entries_) seen[size_t(e)] = 1;
  while (!stack.empty()) {
    const int32_t v = stack.back();
    stack.pop_back();
    const int32_t* nb = node(v);
    for (int j = 1; j <= nb[0]; ++j)
      if (!seen[size_t(nb[j])]) {
        seen[size_t(nb[j])] = 1;
        stack.push_back(nb[j]);
      }
  }
  return seen;
}

// Last resort for a key outside the tree: an in-edge from the first tree
// node (entries first, then by id) with a free slot or a non-tree edge.
// Tree leaves always qualify, so this never fails while the tree is non-empty.
void ProjectedGraph::link_anywhere(int32_t to) {
  const auto try_from = [&](int32_t from) {
    if (from == to || parent_[size_t(from)] == kNoParent) return false;
    int32_t* p = node(from);
    if (p[0] < slots_) {
      p[++p[0]] = to;
    } else {
      int j = 1;
      while (j <= p[0] && parent_[size_t(p[j])] == from) ++j;
      if (j > p[0]) return false;
      p[j] = to;
    }
    if (size_t(from) < weakest_.size()) weakest_[size_t(from)] = kUnknownWeakest;  // to's edge is unscored
    adopt(from, to);
    return true;
  };
  for (int32_t e : entries_)
    if (try_from(e)) return;
  for (int64_t i = 0; i < nodes(); ++i)
    if (node(i)[0] != kAbsent && try_from(int32_t(i))) return;
  // Nothing is reachable (an empty graph): the key becomes an entry.
  entries_.push_back(to);
  parent_[size_t(to)] = kRoot;
}

}  // namespace rattn::internal
