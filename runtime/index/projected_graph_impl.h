#pragma once
// The projected graph's class, shared by its translation units:
//   projected_graph_search.cpp  beam search (the decode hot path, one TU so
//                               its steps inline), traversal codes, search_many
//   projected_graph_build.cpp   build() as phases, refresh()
//   projected_graph_passes.cpp  the graph passes: occlusion pruning, 2-hop
//                               fill, connectivity, query-guided repair,
//                               co-occurrence order
//   projected_graph_knn.cpp     the build's top-k lists on the CPU (exact_knn, partitioned_knn, cpu_training_knn)
//   training_knn.cpp            where they run: the GPU kernel or cpu_training_knn
//   projected_graph_metric.cpp  the key-to-key relations (key metric, centring)
//   projected_graph_insert.cpp  insert, in-edges and the spanning tree
//   projected_graph_io.cpp      save and load
//   projected_graph.cpp         the public functions of projected_graph.h
// Not for use outside runtime/index.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/index/distance.h"
#include "runtime/index/key_index.h"
#include "runtime/index/projected_codes.h"
#include "runtime/index/projected_graph.h"
#include "runtime/index/topk.h"

namespace rattn::internal {

// Key rows the build's passes read at random (the keys of the key
// relations: centred, or in a key metric): in huge pages where the kernel
// allows, as the row stores are; with 4 KiB pages nearly every row read also
// missed the TLB. (The fp32 copy of an fp16 store stays in plain pages: the
// kNN reads few of its rows at random, and the huge pages' faults cost more.)
// Their elements start uninitialised, so the parallel loops that fill them
// also fault their pages in, each thread its own share.
template <class T>
struct KeyRowsAllocator : RowStorageAllocator<T> {
  using value_type = T;
  KeyRowsAllocator() = default;
  template <class U>
  KeyRowsAllocator(const KeyRowsAllocator<U>&) {}
  template <class U>
  struct rebind {
    using other = KeyRowsAllocator<U>;
  };
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using KeyRows = std::vector<float, KeyRowsAllocator<float>>;

constexpr int32_t kAbsent = -1;  // count field of a node not (yet) in the index
constexpr int32_t kNoParent = -1;  // parent_ of a node no path from the entries reaches
constexpr int32_t kRoot = -2;      // parent_ of an entry point
constexpr float kUnknownWeakest = std::numeric_limits<float>::quiet_NaN();

// One candidate of the beam: 8 bytes, so merging moves less. While a
// search runs, the sign bit of `id` marks an expanded candidate (ids are
// below 2^31); the flags are cleared when the walk ends.
struct Cand {
  float score;
  int32_t id;
};
constexpr int32_t kExpandedBit = std::numeric_limits<int32_t>::min();

class GraphScratch final : public SearchScratch {
 public:
  // Visited set: one epoch byte per node, visited when it equals `epoch`;
  // a search starts by bumping the epoch (O(1)), and only a wrap (every 255
  // searches) clears the bytes. A bitmap is 8x smaller, but its
  // read-modify-write of shared words chained each neighbour's test to the
  // previous store: bytes searched 8-16% faster at T = 131072 and 25% at
  // T = 2048 (docs/performance.md).
  std::vector<uint8_t> visited;
  uint8_t epoch = 0;
  std::vector<Cand> pool;
  std::vector<int32_t> batch_ids;
  std::vector<float> batch_scores;
  std::vector<Cand> merge_buf;  // a batch's entries that can enter the pool
  std::vector<int> merge_pos;   // and where they land
  // The pending batch's scores are already in batch_scores (a lockstep
  // round computed them): score_step only merges them.
  bool scores_ready = false;
  // Lockstep walks (search_many on one graph), in the first job's scratch:
  // a round's union of the walks' batches (lock_table: open addressing,
  // id -> slot in lock_ids, a few KiB that stay in L1), which walks want
  // each row (bit per walk), their scores [walk][union], and each batch
  // entry's slot (lock_slot, walk after walk).
  std::vector<int32_t> lock_table, lock_ids, lock_slot;
  std::vector<uint32_t> lock_masks;
  std::vector<float> lock_scores;

  // State of one beam search between its steps (ProjectedGraph::start /
  // score_step / expand_step / rerank_*), so that search_many() can
  // interleave several searches on one thread.
  enum class Stage { score, rerank, done };
  Stage stage = Stage::done;
  const float* query = nullptr;
  bool codes = false;         // scoring on the index's traversal codes
  ScalarCodes::Query code_query;  // the query in the codes' terms
  const ScalarCodes* code_set = nullptr;  // the codes walked (own, shared or projected)
  std::vector<float> projected_query;     // the query projected (ProjectedCodes)
  int L = 0, width = 1, rerank = 0;
  // Patience stop (SearchParams::patience): expansions in a row that left the
  // k-th best score unchanged.
  int patience = 0, k = 0, quiet = 0;
  float kth = 0;
  int cursor = 0;             // pool entries before it are expanded
  // Partial expansion: a candidate expanded at pool position >= full_rank
  // scores only its first `first` neighbours (0: whole lists).
  int first = 0, full_rank = 0;
  int nb = 0;                 // rows of the pending batch (batch_ids)
  float bar = 0;              // a new key above it is expanded soon: its adjacency is requested
  int64_t scored = 0;

  void begin(int64_t nodes) {
    if (visited.size() < size_t(nodes)) visited.resize(size_t(nodes), 0);
    if (++epoch == 0) {
      std::fill(visited.begin(), visited.end(), uint8_t(0));
      epoch = 1;
    }
  }
  size_t memory_bytes() const override {
    return visited.capacity() + (pool.capacity() + merge_buf.capacity()) * sizeof(Cand) +
           batch_ids.capacity() * sizeof(int32_t) + (batch_scores.capacity() + projected_query.capacity()) * sizeof(float) +
           merge_pos.capacity() * sizeof(int) + code_query.qi.capacity() * sizeof(int16_t) +
           (lock_table.capacity() + lock_ids.capacity() + lock_slot.capacity() + lock_masks.capacity() +
            lock_scores.capacity()) * 4;
  }
  bool test_and_set(int32_t id) { return test_and_set(visited.data(), epoch, id); }
  // The same on a copy of the fields: the expansion loop passes locals, since
  // its byte stores could otherwise alias the scratch's fields (reloaded per
  // neighbour).
  static bool test_and_set(uint8_t* visited_bytes, uint8_t current, int32_t id) {
    const uint8_t v = visited_bytes[size_t(id)];
    visited_bytes[size_t(id)] = current;
    return v == current;
  }
};

class ProjectedGraph final : public KeyIndex {
 public:
  ProjectedGraph(int M, int slots, int build_queue, int query_neighbors, std::shared_ptr<CpuKernels> kernels)
      : M_(M), slots_(slots), stride_(slots + 1), build_queue_(build_queue), query_neighbors_(query_neighbors),
        distance_(make_distance(std::move(kernels))) {}

  // ---- adjacency arena: per node [count | ids[slots]] ----
  int32_t* node(int64_t i) { return arena_.data() + size_t(i) * size_t(stride_); }
  const int32_t* node(int64_t i) const { return arena_.data() + size_t(i) * size_t(stride_); }
  int64_t nodes() const { return int64_t(arena_.size()) / stride_; }
  // The build sizes the arena exactly; insert grows it (grow_to first).
  void resize_nodes(int64_t n) { arena_.resize(size_t(n) * size_t(stride_), 0); }
  // Room for `n` entries of a per-node array that insert extends a node at
  // a time: 1/64 more (at least 2048 nodes of `per_node` entries), not the
  // vector's doubling, so a graph that took one insert does not hold twice
  // its bytes (KeyIndex::memory_bytes counts the capacity). A reallocation
  // every n/64 inserts copies the array: 64 entries per insert amortised.
  template <class V>
  static void grow_to(V& v, size_t n, size_t per_node = 1) {
    if (n > v.capacity()) v.reserve(n + std::max(n / 64, size_t(2048) * per_node));
  }
  void set_neighbors(int64_t i, const std::vector<int32_t>& ids) {
    int32_t* p = node(i);
    const int n = std::min<int>(int(ids.size()), slots_);
    p[0] = n;
    std::copy(ids.begin(), ids.begin() + n, p + 1);
    if (size_t(i) < weakest_.size()) weakest_[size_t(i)] = kUnknownWeakest;
  }

  std::unique_ptr<SearchScratch> make_scratch() const override { return std::make_unique<GraphScratch>(); }

  // ---- search (projected_graph_search.cpp) ----
  // start_search, step and finish_search are inline there (search() and
  // search_many_projected() inline them); beam_search is the build's and
  // insert's entry.
  void search(const float* query, const RowsView& keys, const SearchParams& params, SearchScratch& scratch_base,
              SearchResult& out) const override;
  // Validates the parameters and starts a search in `s` (search_many too).
  inline void start_search(const float* query, const RowsView& keys, const SearchParams& params,
                           GraphScratch& s) const;
  // One step of a started search: scores the pending batch and requests the
  // next one, or (codes) re-ranks the final pool.
  inline void step(const RowsView& keys, GraphScratch& s) const;
  static inline void finish_search(const SearchParams& params, const GraphScratch& s, SearchResult& out);
  // One lockstep round of walks on this graph (exact keys, each in stage
  // score): the union of their pending batches is scored once, each row
  // for every walk that asked for it (Distance::dots_multi), into each
  // walk's batch_scores; their next step() merges them. `buf` holds the
  // round's buffers. Each walk's results equal its lone search's.
  inline void lockstep_scores(const RowsView& keys, GraphScratch* const* walks, int n, GraphScratch& buf) const;
  // Best-first beam search on the exact keys (the build and insert paths);
  // leaves the best L candidates (best first) in s.pool and returns the
  // number of keys scored.
  int64_t beam_search(const float* query, const RowsView& keys, int L, GraphScratch& s) const;

  using CodeShape = std::pair<int, int>;
  // Extends projected codes of one shape to the index's nodes (refitted when
  // the index doubled since the fit).
  void update_projected(const RowsView& keys, ProjectedCodes& pc, CodeShape shape) const;
  const SharedTraversalCodes& traversal_codes() const { return shared_codes_ ? *shared_codes_ : own_codes_; }
  bool attach_traversal_codes(std::shared_ptr<SharedTraversalCodes> codes) override {
    shared_codes_ = std::move(codes);
    own_codes_.clear();
    return true;
  }

  // ---- insert (projected_graph_insert.cpp) ----
  void insert(int32_t key_id, const float* own_query, const RowsView& keys) override;
  void insert_hinted(int32_t key_id, const float* own_query, const RowsView& keys, const int32_t* hint_ids,
                     int n_hints) override;
  void set_insert_params(int queue, int pivots, int reverse, int key_queue) {
    insert_queue_ = queue;
    insert_pivots_ = pivots;
    insert_reverse_ = reverse;
    insert_key_queue_ = key_queue;
  }

  // ---- save and load (projected_graph_io.cpp) ----
  void serialize(std::string* out) const override;
  static std::unique_ptr<ProjectedGraph> load(std::string_view payload, uint32_t version);

  // ---- build (projected_graph_build.cpp) ----
  void build(const RowsView& keys, const float* queries, int64_t num_queries, const GraphBuildParams& p,
             const ProgressFn& progress);
  void set_shifted_queries(int64_t n) { shifted_queries_ = n; }
  // refresh_projected_graph(); `queries` already hold their shifted copies.
  void refresh(const RowsView& keys, const std::vector<float>& queries, const GraphBuildParams& p);

  // ---- diagnostics (projected_graph.cpp) ----
  int64_t size() const override { return size_; }
  size_t memory_bytes() const override;
  size_t projected_code_bytes() const;
  GraphInfo info() const;
  int64_t insert_keys_scored() const { return insert_scored_; }  // GraphInfo::insert_keys_scored
  std::vector<int32_t> neighbors(int32_t id) const;
  const std::vector<int32_t>& entries() const { return entries_; }
  // Distinct keys among the entry points, `ids` and the ids' neighbour lists.
  int64_t expansion_footprint(const int32_t* ids, int n) const;

 private:
  // The search's steps: inline, defined and called in projected_graph_search.cpp
  // only, so that they inline into step() there.
  inline void start(const float* query, const RowsView& keys, int L, int width, bool codes, GraphScratch& s,
                    const ProjectedCodes* projected = nullptr, const int32_t* seeds = nullptr,
                    int n_seeds = 0) const;
  inline void request_row(const RowsView& keys, const GraphScratch& s, int32_t id) const;
  inline void fetch_node(int32_t id) const;
  inline void score_step(const RowsView& keys, GraphScratch& s) const;
  inline bool expand_step(const RowsView& keys, GraphScratch& s) const;
  inline void rerank_request(const RowsView& keys, GraphScratch& s) const;
  inline void rerank_finish(const RowsView& keys, GraphScratch& s) const;
  inline void ensure_codes(const RowsView& keys) const;
  inline const ProjectedCodes* ensure_projected_codes(const RowsView& keys, CodeShape shape) const;

  // Edge edits and the spanning tree (projected_graph_insert.cpp).
  int weakest_non_tree_slot(int32_t from, const float* sc, float* worst_score) const;
  bool add_in_edge(const RowsView& keys, int32_t from, int32_t to, bool force);
  void adopt(int32_t from, int32_t to);
  void build_tree();
  void grow_tree();
  int64_t count_unreachable() const;
  // Present keys outside the spanning tree (parent_): the same count as
  // count_unreachable while the tree is kept (the build's passes never cut
  // it), without another traversal.
  int64_t count_outside_tree() const;
  std::vector<uint8_t> reachable() const;
  void link_anywhere(int32_t to);

  // Build phases that keep what they compute (projected_graph_build.cpp).
  RowsView key_relations(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                         const GraphBuildParams& p, KeyRows* storage, std::vector<double>* key_mean);
  void keep_query_moment(const float* queries, const std::vector<int64_t>& picked, int d);

  // Graph passes of the build and refresh (projected_graph_passes.cpp).
  // key_partition (may be empty): partition ids of the keys from the
  // partitioned kNN; an unreached key then takes its neighbours from its
  // partition instead of a beam search.
  void connect_unreached(const RowsView& kf, const GraphBuildParams& p, const std::vector<int32_t>& key_partition);
  // Returns the in-edges it offered.
  int64_t repair_with_queries(const RowsView& kf, const RowsView& kk, const float* queries,
                              const std::vector<int64_t>& picked, const std::vector<int32_t>& knn, int nq,
                              const GraphBuildParams& p);
  void apply_repair_edges(const RowsView& kk, std::vector<std::pair<int32_t, int32_t>>* edges,
                          std::vector<int64_t>* group_start, int threads);
  void fill_from_two_hop(const RowsView& kf, const GraphBuildParams& p);
  void order_by_cooccurrence(const std::vector<int32_t>& knn, int64_t num_lists, int nq, int threads);

  int M_, slots_, stride_, build_queue_, query_neighbors_;
  std::unique_ptr<Distance> distance_;
  // Traversal codes of the keys (search path; SearchParams::traversal_codes):
  // derived from the key store, never saved; fitted on the first search that
  // wants them, extended by insert; or codes shared with the other indexes
  // over the same key store (attach_traversal_codes), which the owner updates.
  mutable SharedTraversalCodes own_codes_;
  std::shared_ptr<SharedTraversalCodes> shared_codes_;
  // Learned low-dimensional codes, per shape (SearchParams::code_dims, code_coarse_dims).
  mutable std::map<CodeShape, std::unique_ptr<ProjectedCodes>> projected_codes_;
  // [d, d] second moment of the training queries (unit trace; empty: not
  // known, e.g. an image before version 4): the projected codes' query model.
  std::vector<float> query_moment_;
  mutable std::mutex codes_mutex_;  // guards projected_codes_
  // Huge pages where the kernel allows (madvise): every expansion reads a
  // random node, like the codes.
  RegionArray<int32_t> arena_;  // grows in place: an insert never copies it
  std::vector<int32_t> entries_;
  // Derived (not saved): a spanning tree of the graph from the entry points,
  // parent_[v] = the node whose edge to v is v's tree edge (kRoot for entries,
  // kNoParent while unreachable). Edge replacement keeps tree edges.
  std::vector<int32_t> parent_;
  // Insert path only (empty until the first insert, cleared with the tree):
  // per node, the lowest score of its non-tree edges when add_in_edge last
  // scored its list, or kUnknownWeakest. It never exceeds the true value:
  // during inserts lists change only through add_in_edge, which keeps it, and
  // edges only ever become tree edges, which raises the true value. So a new
  // edge at or below it is refused with one inner product. Not saved.
  std::vector<float> weakest_;
  // Insert path: one search with the own query (queue insert_queue_), then
  // in-edges from that many best hits / best out-neighbours.
  int insert_queue_ = 32, insert_pivots_ = 4, insert_reverse_ = 16, insert_key_queue_ = 16;  // v1 images
  int32_t last_inserted_ = -1;  // seeds the next insert's search (not saved)
  double key_alignment_ = 0;  // build diagnostics (not saved)
  int64_t training_queries_ = 0, shifted_queries_ = 0;  // build diagnostics (not saved)
  KnnStats knn_stats_;                                   // build diagnostics (not saved)
  int key_metric_used_ = 0;
  std::vector<BuildPhase> build_phases_;  // build diagnostics (not saved)
  std::vector<float> metric_;  // [d, d] S of the key metric (empty: plain inner product); saved
  std::vector<float> key_mean_;  // [d] mean of the built keys when relations were centred (center_keys); saved
  std::vector<float> insert_metric_key_;
  int64_t inserts_ = 0, insert_scored_ = 0, edge_scored_ = 0;  // counters for GraphInfo
  int64_t refresh_queries_ = 0, refresh_edges_ = 0;  // refresh counters for GraphInfo (not saved)
  // Reused buffers of the serial edit paths (insert, linking, repair edges).
  GraphScratch insert_scratch_;
  std::vector<float> insert_key_, insert_scores_, edge_vec_, edge_scores_;
  std::vector<int32_t> insert_hits_, edge_ids_, tree_queue_;
  std::vector<ScoredId> insert_ranked_;
  int64_t size_ = 0;
  int64_t unreached_before_repair_ = 0;
  int64_t unreachable_ = 0;
};

// Throws Error(invalid_argument) "<who>: ..." unless the insert parameters
// of `p` are in range (insert_queue and insert_pivots in [1, 2^20],
// insert_reverse and insert_key_queue in [0, 2^20]).
void check_insert_params(const GraphBuildParams& p, const char* who);

// Occlusion (RNG-style) pruning around `pivot`: candidates come ranked by
// their inner product with the pivot (best first); c is dropped when a kept
// neighbour r satisfies <c, r> > <c, pivot>, i.e. d(c, r) < d(c, pivot) with
// d = -<a, b>. Dropped candidates fill the remaining slots in rank order.
// (projected_graph_passes.cpp)
void occlusion_prune(const RowsView& kf, const std::vector<ScoredId>& ranked, int M, std::vector<int32_t>* out);

// Rows grouped by their group id in [0, groups): the rows of group g are
// members[start[g] .. start[g + 1]), ascending. (projected_graph_knn.cpp)
struct RowGroups {
  std::vector<int64_t> start;
  std::vector<int32_t> members;
};
RowGroups group_rows(const std::vector<int32_t>& group_of, int64_t groups);

// Each f32 row's partition of a seeded k-means (L2, C partitions,
// `iterations` Lloyd steps on a sample of 48 C rows); the same ids whatever
// the thread count. (projected_graph_knn.cpp)
std::vector<int32_t> key_partition_ids(const RowsView& rows, int64_t C, int iterations, uint64_t seed, int threads);

// ---- key-to-key relations (projected_graph_metric.cpp) ----
// K L with S = L L' (Cholesky of the symmetric positive definite [d, d] S,
// float64, only its lower triangle read): keys whose plain inner products
// are k1' S k2. One oneDNN GEMM per thread's share of the rows.
KeyRows keys_times_cholesky(const RowsView& kf, std::vector<double> S, int threads);
// Its two steps: L as Lt [d, d] (row j: column j of L), then the rows times L.
std::vector<float> cholesky_columns(std::vector<double> S, int d);
KeyRows rows_times_cholesky(const RowsView& kf, const std::vector<float>& Lt, int threads);
// Keys transformed so that plain inner products give k1' S k2, with S the
// second moment (centered: the covariance) of the picked queries plus a small
// ridge: rows L' k with S = L L' (Cholesky). `metric` receives S scaled to
// unit trace (for the insert path).
// `alignment` receives d * tr(S_c K) / (tr(S_c) tr(K)) with S_c the query
// covariance and K the key covariance: 1 when keys vary as much in the
// directions queries vary in as elsewhere, << 1 when most key variance lies
// in directions queries ignore (a diagnostic: it did not predict on which
// data the metric helps).
KeyRows query_metric_keys(const RowsView& kf, const float* queries, const std::vector<int64_t>& picked,
                                     bool centered, double ridge_share, int threads, double* alignment,
                                     std::vector<float>* metric);
// Rows of fp32 `kf` minus `mean` ([d]).
KeyRows keys_minus(const RowsView& kf, const std::vector<float>& mean, int threads);
// The keys minus their mean (key_means; rounded to fp32 in `mean_out`), for
// the plain key metric's key-to-key relations.
KeyRows centered_keys(const RowsView& kf, const std::vector<double>& mean, int threads, std::vector<float>* mean_out);
// The mean of the fp32 rows of `kf` per dimension (float64 sums in row order,
// whatever the thread count). The build computes it once: the centred keys
// and the entry point both use it.
std::vector<double> key_means(const RowsView& kf, int threads);

}  // namespace rattn::internal
