// The projected graph's beam search: the decode step's hot path. Its steps
// (start_search, step, start, score_step, expand_step, rerank_*, ...) and
// merge_batch are inline and called only here, so that the compiler
// inlines them into search(), beam_search() and search_many_projected().
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/index/graph_search.h"
#include "runtime/index/projected_graph_impl.h"

namespace rattn::internal {
namespace {

// Merges a scored batch into the pool (best first, at most L): the same
// pool as inserting its entries one by one in sorted order (equal scores
// after the entries already there, then in batch order), but one pass over
// the pool's tail instead of a search and a move per entry. Returns the
// position of the best new entry (pool size when none stayed).
int merge_batch(GraphScratch& s, const float* bsc, const int32_t* bids, int nb) {
  auto& pool = s.pool;
  const int size = int(pool.size()), L = s.L;
  // Entries that can enter, sorted best first (stable: insertion sort of a few).
  Cand* in = s.merge_buf.data();
  int c = 0;
  const bool full = size >= L;
  const float floor = full ? pool[size_t(size - 1)].score : 0.0f;
  for (int i = 0; i < nb; ++i) {
    if (full && !(bsc[i] > floor)) continue;
    int j = c++;
    while (j > 0 && in[j - 1].score < bsc[i]) {
      in[j] = in[j - 1];
      --j;
    }
    in[j] = {bsc[i], bids[i]};
  }
  if (c == 0) return size;
  // Where each lands in the current pool: after the entries scoring at
  // least as much (branch-free halving; non-decreasing in j).
  int* pos = s.merge_pos.data();
  const Cand* p0 = pool.data();
  for (int j = 0; j < c; ++j) {
    const Cand* base = p0;
    int n = size;
    while (n > 1) {
      const int half = n / 2;
      base = base[half - 1].score >= in[j].score ? base + half : base;
      n -= half;
    }
    pos[j] = int(base - p0) + (n == 1 && base->score >= in[j].score ? 1 : 0);
  }
  // The pool's blocks between landing points move right (the last block
  // first, so nothing unread is overwritten), clipped at the new size.
  const int new_size = std::min(size + c, L);
  pool.resize(size_t(new_size));
  Cand* p = pool.data();
  for (int j = c - 1; j >= 0; --j) {
    const int from = pos[j], end = j == c - 1 ? size : pos[j + 1], dst = from + j + 1;
    const int n_move = std::min(end - from, new_size - dst);
    if (n_move > 0) std::memmove(p + dst, p + from, sizeof(Cand) * size_t(n_move));
    if (from + j < new_size) p[from + j] = in[j];
  }
  return pos[0] < new_size ? pos[0] : size;
}

}  // namespace

void ProjectedGraph::search(const float* query, const RowsView& keys, const SearchParams& params,
                            SearchScratch& scratch_base, SearchResult& out) const {
  auto& s = static_cast<GraphScratch&>(scratch_base);
  start_search(query, keys, params, s);
  while (s.stage != GraphScratch::Stage::done) step(keys, s);
  finish_search(params, s, out);
}

inline void ProjectedGraph::start_search(const float* query, const RowsView& keys, const SearchParams& params,
                                         GraphScratch& s) const {
  if (params.k <= 0) fail(Status::invalid_argument, "projected graph: k must be positive");
  if (params.expand_width < 1 || params.expand_width > 64)
    fail(Status::invalid_argument, "projected graph: expand_width must be in [1, 64]");
  if (keys.rows < nodes()) fail(Status::invalid_argument, "projected graph: key store has fewer rows than the index");
  if (params.code_dims < 0 || params.code_dims > keys.dim)
    fail(Status::invalid_argument, "projected graph: code_dims must be in [0, head_dim]");
  if (params.code_coarse_dims < 0 || params.code_coarse_dims > params.code_dims)
    fail(Status::invalid_argument, "projected graph: code_coarse_dims must be in [0, code_dims]");
  const ProjectedCodes* projected = nullptr;
  if (params.traversal_codes) {
    // code_dims = d with coarse dims: projected too (the raw keys' dims have no order of importance).
    if (params.code_dims > 0 && (params.code_dims < keys.dim || params.code_coarse_dims > 0))
      projected = ensure_projected_codes(keys, {params.code_dims, params.code_coarse_dims});
    else ensure_codes(keys);
  }
  if (params.rerank < 0) fail(Status::invalid_argument, "projected graph: rerank must be >= 0");
  if (params.num_seeds < 0 || (params.num_seeds > 0 && !params.seeds))
    fail(Status::invalid_argument, "projected graph: num_seeds must be >= 0, with seeds when > 0");
  if (params.expand_first < 0 || params.full_expand_rank < 0)
    fail(Status::invalid_argument, "projected graph: expand_first and full_expand_rank must be >= 0");
  start(query, keys, std::max(params.queue_length, params.k), params.expand_width, params.traversal_codes, s,
        projected, params.seeds, params.num_seeds);
  s.rerank = params.rerank > 0 ? std::max(params.rerank, params.k) : params.k + std::max(16, params.k / 4);
  if (params.patience < 0) fail(Status::invalid_argument, "projected graph: patience must be >= 0");
  s.patience = params.patience;
  s.k = params.k;
  s.first = params.expand_first;  // past a list's length: the whole list (min in expand_step)
  s.full_rank = params.full_expand_rank > 0 ? std::min(params.full_expand_rank, s.L) : s.L;
}

inline void ProjectedGraph::step(const RowsView& keys, GraphScratch& s) const {
  if (s.stage == GraphScratch::Stage::score) {
    score_step(keys, s);
    if (!expand_step(keys, s)) {
      for (Cand& c : s.pool) c.id &= ~kExpandedBit;
      if (s.codes) {
        rerank_request(keys, s);
        s.stage = GraphScratch::Stage::rerank;
      } else {
        s.stage = GraphScratch::Stage::done;
      }
    }
  } else if (s.stage == GraphScratch::Stage::rerank) {
    rerank_finish(keys, s);
    s.stage = GraphScratch::Stage::done;
  }
}

inline void ProjectedGraph::finish_search(const SearchParams& params, const GraphScratch& s, SearchResult& out) {
  out.keys_scored = s.scored;
  const int n = std::min<int>(params.k, int(s.pool.size()));
  out.ids.resize(size_t(n));
  out.scores.resize(size_t(n));
  for (int i = 0; i < n; ++i) {
    out.ids[size_t(i)] = s.pool[size_t(i)].id;
    out.scores[size_t(i)] = s.pool[size_t(i)].score;
  }
}

int64_t ProjectedGraph::beam_search(const float* query, const RowsView& keys, int L, GraphScratch& s) const {
  start(query, keys, L, 1, false, s);
  while (s.stage != GraphScratch::Stage::done) step(keys, s);
  return s.scored;
}

// The beam search as steps. Each scored key is a random row (of the key
// store, or of the codes), so memory latency dominates: a step requests
// all rows of its batch before the first inner product (and the exact
// path again a few rows ahead inside Distance::dots), and the adjacency of
// the next candidates - and of any new key that beats them - is requested
// before it is read. A step expands the best `width` unexpanded candidates
// together (their rows' latencies overlap). search_many() runs other
// searches' steps between a step's request and its inner products.
// Speculatively fetching the next candidate's neighbour rows measured
// slower on the shared machine (wasted bandwidth) and is not done.
inline void ProjectedGraph::start(const float* query, const RowsView& keys, int L, int width, bool codes,
                                  GraphScratch& s, const ProjectedCodes* projected, const int32_t* seeds,
                                  int n_seeds) const {
  s.begin(nodes());
  s.pool.clear();
  s.pool.reserve(size_t(L) + 1);
  const size_t cap = size_t(slots_) * size_t(width) + entries_.size() + size_t(n_seeds);
  if (s.batch_ids.size() < cap) {
    s.batch_ids.resize(cap);
    s.batch_scores.resize(cap);
  }
  if (s.merge_buf.size() < cap) {
    s.merge_buf.resize(cap);
    s.merge_pos.resize(cap);
  }
  s.query = query;
  s.scores_ready = false;
  s.L = L;
  s.width = width;
  s.codes = codes;
  s.rerank = 0;
  s.scored = 0;
  s.cursor = 0;
  s.first = 0;
  s.full_rank = L;
  s.patience = 0;
  s.quiet = 0;
  s.kth = std::numeric_limits<float>::quiet_NaN();
  s.code_set = nullptr;
  if (codes && projected) {
    s.projected_query.resize(size_t(projected->dims()));
    projected->project_query(query, s.projected_query.data());
    s.code_set = &projected->codes();
  } else if (codes) {
    s.code_set = &traversal_codes().codes();
  }
  if (codes) s.code_set->prepare_query(projected ? s.projected_query.data() : query, &s.code_query);
  int nb = 0;
  auto offer = [&](int32_t e) {
    if (s.test_and_set(e)) return;
    request_row(keys, s, e);
    s.batch_ids[size_t(nb++)] = e;
  };
  for (int32_t e : entries_) offer(e);
  for (int i = 0; i < n_seeds; ++i)  // seeds come from outside: only ids of present nodes
    if (seeds[i] >= 0 && seeds[i] < nodes() && node(seeds[i])[0] != kAbsent) offer(seeds[i]);
  s.nb = nb;
  s.bar = -std::numeric_limits<float>::infinity();
  s.stage = GraphScratch::Stage::score;
}

inline void ProjectedGraph::request_row(const RowsView& keys, const GraphScratch& s, int32_t id) const {
  if (s.codes) s.code_set->prefetch(id);
  else prefetch_row(keys, id);
}

inline void ProjectedGraph::fetch_node(int32_t id) const {
  prefetch_span<3>(node(id), size_t(stride_) * sizeof(int32_t));
}

// Scores the pending batch and offers it to the pool.
inline void ProjectedGraph::score_step(const RowsView& keys, GraphScratch& s) const {
  const int nb = s.nb;
  const bool ready = s.scores_ready;
  s.scores_ready = false;
  if (nb == 0) return;
  const int32_t* bids = s.batch_ids.data();
  float* bsc = s.batch_scores.data();
  if (!ready) {  // else a lockstep round scored the batch
    if (s.codes) s.code_set->dots(s.code_query, bids, nb, bsc);
    else distance_->dots(s.query, keys, bids, nb, bsc);
  }
  s.scored += nb;
  for (int i = 0; i < nb; ++i)
    if (bsc[i] > s.bar) fetch_node(bids[i]);
  s.cursor = std::min(s.cursor, merge_batch(s, bsc, bids, nb));
  s.nb = 0;
}

// Expands the best s.width unexpanded candidates: their unvisited
// neighbours become the pending batch, whose rows are requested. Returns
// false when every candidate is expanded.
inline bool ProjectedGraph::expand_step(const RowsView& keys, GraphScratch& s) const {
  auto& pool = s.pool;
  const int size = int(pool.size());
  int j = s.cursor;
  while (j < size && pool[size_t(j)].id < 0) ++j;
  if (j >= size) return false;
  if (s.patience > 0 && size >= s.k) {
    const float kth = pool[size_t(s.k - 1)].score;
    if (kth != s.kth) {
      s.kth = kth;
      s.quiet = 0;
    } else if (++s.quiet > s.patience) {
      return false;  // the top k settled: stop before expanding the rest
    }
  }
  s.cursor = j;
  int32_t* bids = s.batch_ids.data();
  int nb = 0;
  for (int taken = 0; taken < s.width && j < size;) {
    const int32_t* nbr = node(pool[size_t(j)].id);
    pool[size_t(j)].id |= kExpandedBit;
    ++taken;
    // Ranked below full_rank: its first s.first neighbours only. A rank
    // only falls while the walk runs (better keys enter above it), so the
    // rest of such a list would never be taken later.
    const int cnt = nbr[0], hi = s.first > 0 && j >= s.full_rank ? std::min(s.first, cnt) : cnt;
    uint8_t* const visited = s.visited.data();
    const uint8_t epoch = s.epoch;
    for (int i = 1; i <= hi; ++i) {
      const int32_t id = nbr[i];
      bids[nb] = id;
      nb += GraphScratch::test_and_set(visited, epoch, id) ? 0 : 1;
    }
    ++j;
    while (j < size && pool[size_t(j)].id < 0) ++j;
  }
  for (int i = 0; i < nb; ++i) request_row(keys, s, bids[i]);
  // The next step expands the next `width` unexpanded candidates unless
  // this batch brings better ones.
  float bar = -std::numeric_limits<float>::infinity();
  int found = 0;
  for (; j < size && found < s.width; ++j) {
    if (pool[size_t(j)].id < 0) continue;
    fetch_node(pool[size_t(j)].id);
    bar = pool[size_t(j)].score;
    ++found;
  }
  if (found < s.width) bar = size >= s.L ? pool.back().score : -std::numeric_limits<float>::infinity();
  s.bar = bar;
  s.nb = nb;
  return true;
}

// Re-ranking of the final pool (codes; its best s.rerank when set): its
// rows of the exact keys are requested here and scored in rerank_finish().
inline void ProjectedGraph::rerank_request(const RowsView& keys, GraphScratch& s) const {
  if (s.rerank > 0 && int(s.pool.size()) > s.rerank) s.pool.resize(size_t(s.rerank));
  const int n = int(s.pool.size());
  if (s.batch_ids.size() < size_t(n)) {
    s.batch_ids.resize(size_t(n));
    s.batch_scores.resize(size_t(n));
  }
  for (int i = 0; i < n; ++i) {
    s.batch_ids[size_t(i)] = s.pool[size_t(i)].id;
    prefetch_row(keys, s.pool[size_t(i)].id);
  }
}

// Exact scores for the pool, best first (ties by id); keys_scored is
// unchanged: these keys were already counted.
inline void ProjectedGraph::rerank_finish(const RowsView& keys, GraphScratch& s) const {
  const int n = int(s.pool.size());
  distance_->dots(s.query, keys, s.batch_ids.data(), n, s.batch_scores.data());
  for (int i = 0; i < n; ++i) s.pool[size_t(i)].score = s.batch_scores[size_t(i)];
  std::sort(s.pool.begin(), s.pool.end(),
            [](const Cand& a, const Cand& b) { return a.score > b.score || (a.score == b.score && a.id < b.id); });
}

// Fits the index's own traversal codes on first use, and extends them to
// keys inserted since. search() is const and may run on several threads at
// once (never concurrently with insert): the first caller encodes, the
// others wait. Shared codes are the owner's to update: a search finding
// them behind the index fails rather than rewrite rows that searches of
// the other indexes may be reading.
inline void ProjectedGraph::ensure_codes(const RowsView& keys) const {
  if (shared_codes_) {
    const ScalarCodes& c = shared_codes_->codes();
    if (shared_codes_->rows() < nodes() || (c.fitted() && c.dim() != keys.dim))
      fail(Status::internal, "projected graph: the shared traversal codes cover " +
                                 std::to_string(shared_codes_->rows()) + " keys of dim " + std::to_string(c.dim()) +
                                 ", the index " + std::to_string(nodes()) + " of dim " + std::to_string(keys.dim) +
                                 ": their owner must update them before searching");
    return;
  }
  if (own_codes_.rows() >= nodes()) return;
  own_codes_.update(keys, nodes());
}

// The projected codes of one shape (directions, and how many of the last
// are 4-bit): one set per shape, kept until the index is destroyed, so a
// concurrent search's pointer stays valid; fitted on first use and
// extended like the raw codes.
inline const ProjectedCodes* ProjectedGraph::ensure_projected_codes(const RowsView& keys, CodeShape shape) const {
  std::lock_guard<std::mutex> lock(codes_mutex_);
  auto& slot = projected_codes_[shape];
  if (!slot) slot = std::make_unique<ProjectedCodes>();
  if (slot->rows() < nodes() || !slot->fitted()) update_projected(keys, *slot, shape);
  return slot.get();
}

void ProjectedGraph::update_projected(const RowsView& keys, ProjectedCodes& pc, CodeShape shape) const {
  if (!pc.fitted() || nodes() >= 2 * std::max<int64_t>(pc.fitted_rows(), 8))
    pc.fit(keys, nodes(), query_moment_.size() == size_t(keys.dim) * size_t(keys.dim) ? query_moment_ : std::vector<float>{},
           shape.first, shape.second);
  else pc.append(keys, nodes());
}

inline void ProjectedGraph::lockstep_scores(const RowsView& keys, GraphScratch* const* walks, int n,
                                            GraphScratch& buf) const {
  int total = 0;
  for (int w = 0; w < n; ++w) total += walks[w]->nb;
  size_t cap = 64;
  while (cap < 2 * size_t(total)) cap *= 2;
  buf.lock_table.assign(cap, -1);
  if (buf.lock_ids.size() < size_t(total)) {
    buf.lock_ids.resize(size_t(total));
    buf.lock_masks.resize(size_t(total));
    buf.lock_slot.resize(size_t(total));
  }
  int32_t* table = buf.lock_table.data();
  int32_t* ids = buf.lock_ids.data();
  int32_t* slot = buf.lock_slot.data();
  uint32_t* masks = buf.lock_masks.data();
  const size_t mask = cap - 1;
  int u = 0, e = 0;
  for (int w = 0; w < n; ++w) {
    const GraphScratch& s = *walks[w];
    for (int i = 0; i < s.nb; ++i, ++e) {
      const int32_t id = s.batch_ids[size_t(i)];
      size_t h = (uint32_t(id) * 0x9E3779B1u) & mask;
      while (table[h] >= 0 && ids[table[h]] != id) h = (h + 1) & mask;
      if (table[h] < 0) {
        table[h] = u;
        ids[u] = id;
        masks[u++] = 0;
      }
      masks[table[h]] |= 1u << w;
      slot[e] = table[h];
    }
  }
  if (buf.lock_scores.size() < size_t(n) * size_t(u)) buf.lock_scores.resize(size_t(n) * size_t(u));
  const float* queries[32];
  for (int w = 0; w < n; ++w) queries[w] = walks[w]->query;
  float* sc = buf.lock_scores.data();
  distance_->dots_multi(queries, n, keys, ids, masks, u, sc);
  e = 0;
  for (int w = 0; w < n; ++w) {
    GraphScratch& s = *walks[w];
    for (int i = 0; i < s.nb; ++i, ++e) s.batch_scores[size_t(i)] = sc[size_t(w) * size_t(u) + size_t(slot[e])];
    s.scores_ready = true;
  }
}

// Walks of one graph with exact keys, in lockstep: each round scores every
// walk's pending batch together (a row two walks want is read once), then
// each walk merges its scores and expands as alone. Returns false (nothing
// done) when the jobs do not share one graph or walk codes.
bool search_lockstep(const ProjectedGraph& g, GraphScratch* const* scratches, const SearchJob* jobs, int n,
                     const RowsView& keys, const SearchParams& params) {
  if (n < 2 || n > 32 || params.traversal_codes) return false;
  for (int i = 0; i < n; ++i) g.start_search(jobs[i].query, keys, internal::job_params(params, jobs[i]), *scratches[i]);
  GraphScratch* walks[32];
  for (;;) {
    int active = 0;
    for (int i = 0; i < n; ++i)
      if (scratches[i]->stage == GraphScratch::Stage::score) walks[active++] = scratches[i];
    if (active == 0) break;
    g.lockstep_scores(keys, walks, active, *scratches[0]);
    // Exact keys: no rerank stage, a walk that stops ends in this step.
    for (int i = 0; i < active; ++i) g.step(keys, *walks[i]);
  }
  for (int i = 0; i < n; ++i) ProjectedGraph::finish_search(params, *scratches[i], *jobs[i].out);
  return true;
}

bool search_many_projected(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params) {
  // A few jobs (a GQA group's query heads): fixed-size arrays, no allocation.
  constexpr int kMaxJobs = 64;
  if (n < 1 || n > kMaxJobs) return false;
  const ProjectedGraph* graphs[kMaxJobs];
  GraphScratch* scratches[kMaxJobs];
  for (int i = 0; i < n; ++i) {
    graphs[i] = dynamic_cast<const ProjectedGraph*>(jobs[i].index);
    scratches[i] = dynamic_cast<GraphScratch*>(jobs[i].scratch);
    if (!graphs[i] || !scratches[i]) return false;
    for (int j = 0; j < i; ++j)
      if (scratches[j] == scratches[i]) return false;  // one scratch holds one search's state
  }
  bool one_graph = true;
  for (int i = 1; i < n; ++i) one_graph = one_graph && graphs[i] == graphs[0];
  if (one_graph && search_lockstep(*graphs[0], scratches, jobs, n, keys, params)) return true;
  for (int i = 0; i < n; ++i)
    graphs[i]->start_search(jobs[i].query, keys, internal::job_params(params, jobs[i]), *scratches[i]);
  // Round robin, one step each: a step requests its next batch's rows and
  // the other searches' steps run while they arrive.
  for (int active = n; active > 0;) {
    for (int i = 0; i < n; ++i) {
      GraphScratch& s = *scratches[i];
      if (s.stage == GraphScratch::Stage::done) continue;
      graphs[i]->step(keys, s);
      if (s.stage == GraphScratch::Stage::done) {
        ProjectedGraph::finish_search(params, s, *jobs[i].out);
        --active;
      }
    }
  }
  return true;
}

}  // namespace rattn::internal
