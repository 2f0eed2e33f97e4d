#pragma once
// Maximum-inner-product search over the keys of one KV head, for one query head.
// Implementations: ProjectedGraph (the attention-aware index) and BruteForceIndex
// (exact scan; the test oracle). Keys live outside the index in a RowStore
// shared by the query heads of a GQA group; ids are row numbers in that store.
#include <cstdint>
#include <iosfwd>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/kv_store.h"

namespace rattn {

class CpuKernels;
namespace internal {
class SharedTraversalCodes;
}

struct SearchParams {
  int k = 100;             // results wanted
  int queue_length = 160;  // L: beam / candidate queue length (>= k)
  // ProjectedGraph only. Walk the graph on the index's 8-bit codes of the
  // keys (a quarter of an fp32 row, built from the keys on first use) and
  // re-rank the final L candidates with the exact keys, so the returned ids'
  // scores are exact; false: every inner product on the exact keys. Off by
  // default, like the plan's traversal_codes: faster for a lone search, but
  // each index then holds its own codes (128 B/key at d = 128) and the decode
  // step measured slower with them (docs/performance.md).
  bool traversal_codes = false;
  // ProjectedGraph only: best unexpanded candidates expanded per step (their
  // neighbours' rows fetched together, so their memory latencies overlap).
  int expand_width = 1;
  // ProjectedGraph with traversal_codes: the best `rerank` candidates (by
  // their code scores) are re-ranked with the exact keys; 0 = automatic,
  // k + max(16, k / 4) (at k = 100, L = 250 on the synthetic set: the same
  // recall as re-ranking all L, docs/performance.md); >= L: all of them.
  int rerank = 0;
  // ProjectedGraph with traversal_codes: 0 = codes of the keys' own d
  // dimensions; 1..d-1 = codes of the keys projected onto this many learned
  // directions (fitted from the build's training queries and the keys,
  // ProjectedCodes): 64 at d = 128 is one cache line per key.
  int code_dims = 0;
  // ProjectedGraph with projected codes (code_dims > 0): the last
  // code_coarse_dims of the code_dims directions (the least important ones)
  // as 4-bit codes, two per byte: code_dims = 80 with 32 coarse is one cache
  // line per key (48 + 16 bytes) and walks nearly as well as 8-bit codes of
  // all 128 dimensions at d = 128 (docs/index.md). 0 = all 8-bit.
  int code_coarse_dims = 0;
  // ProjectedGraph only: 0 = expand until every one of the L candidates is
  // expanded; P > 0 = also stop once P expansions in a row left the k-th
  // best score unchanged (the top k has settled). At T = 131072, key metric
  // 2: L = 300, P = 64 gives recall 0.955 at 1.78% keys scored against
  // L = 250, P = 0 at 1.87% (docs/performance.md). Off by default.
  int patience = 0;
  // ProjectedGraph only: partial expansion. A candidate expanded while it
  // ranks among the best `full_expand_rank` of the queue (0: all L) scores
  // its whole neighbour list; one expanded below that rank scores only its
  // first `expand_first` neighbours (a rank only falls during a walk, so the
  // rest are never taken). The build orders each list by how often the
  // training queries retrieved the neighbour together with the node, so the
  // first neighbours are the likeliest to score alike. A whole-list walk
  // scores a whole list for every key it returns: on real Gemma-3 32K layers
  // that alone is 3.3-5.0% of the keys (docs/performance.md).
  // 0 = whole lists (the default); values >= the degree change nothing.
  int expand_first = 0;
  int full_expand_rank = 0;
  // ProjectedGraph only: more start points, scored with the entry points
  // (and counted in keys_scored); ids outside the index are skipped. The
  // decode step's use: the previous step's results of the same head, since
  // consecutive queries share much of their top-k.
  const int32_t* seeds = nullptr;
  int num_seeds = 0;
};

struct SearchResult {
  std::vector<int32_t> ids;   // best first
  std::vector<float> scores;  // unscaled inner products, same order
  int64_t keys_scored = 0;    // distance evaluations this search made
};

// Per-thread mutable state (visited epochs, queues) so that one index can be
// searched from several threads at once.
class SearchScratch {
 public:
  virtual ~SearchScratch() = default;
  // Bytes it holds (a graph search's visited set is one byte per key).
  virtual size_t memory_bytes() const { return 0; }
};

class KeyIndex {
 public:
  virtual ~KeyIndex() = default;
  virtual std::unique_ptr<SearchScratch> make_scratch() const = 0;
  // `keys` must be the store the index was built on (possibly grown since).
  virtual void search(const float* query, const RowsView& keys, const SearchParams& params,
                      SearchScratch& scratch, SearchResult& out) const = 0;
  // Adds row `key_id` of the store (already appended there) to the index;
  // `own_query` is the token's own query, used as its training query.
  virtual void insert(int32_t key_id, const float* own_query, const RowsView& keys) = 0;
  // The same, given ids (best first) that a search of this index for
  // `own_query` already returned, e.g. when the token was decoded: an index
  // may use them instead of searching again. Invalid ids are ignored; with
  // none left this is insert().
  virtual void insert_hinted(int32_t key_id, const float* own_query, const RowsView& keys, const int32_t* hint_ids,
                             int n_hints) {
    (void)hint_ids;
    (void)n_hints;
    insert(key_id, own_query, keys);
  }
  virtual int64_t size() const = 0;           // keys indexed
  virtual size_t memory_bytes() const = 0;    // index structure only, not the keys
  // Appends a self-describing, versioned, checksummed image of the index.
  virtual void serialize(std::string* out) const = 0;
  // Makes searches with traversal_codes walk `codes` (built from the same key
  // store) instead of the index's own, so that the indexes over one store
  // (a GQA group's query heads) hold one set; null: back to its own codes.
  // The caller keeps `codes` up to date (SharedTraversalCodes::update, up to
  // size() rows at least) while no search runs; a search that finds them
  // behind fails (Error(internal)). Not concurrently with searches. Returns
  // false when the index walks no codes (then it keeps none either).
  virtual bool attach_traversal_codes(std::shared_ptr<internal::SharedTraversalCodes> codes) {
    (void)codes;
    return false;
  }
};

// One search of search_many(): its own index and scratch, the shared keys.
struct SearchJob {
  const KeyIndex* index = nullptr;
  const float* query = nullptr;
  SearchScratch* scratch = nullptr;  // made by `index`
  SearchResult* out = nullptr;
  // This job's start points (SearchParams::seeds), used instead of the
  // shared params' when num_seeds > 0; must not alias `out`.
  const int32_t* seeds = nullptr;
  int num_seeds = 0;
};

namespace internal {
// The parameters of one job of search_many(): the shared ones, with the
// job's own seeds when it has any.
inline SearchParams job_params(const SearchParams& shared, const SearchJob& job) {
  SearchParams p = shared;
  if (job.num_seeds > 0) {
    p.seeds = job.seeds;
    p.num_seeds = job.num_seeds;
  }
  return p;
}
}  // namespace internal

// Runs several searches over the same key store, e.g. the query heads of one
// GQA group (one index each). Results equal separate search() calls; an
// implementation may interleave the searches on the calling thread so that
// one's memory latency overlaps another's work.
void search_many(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params);

// Reports build progress in [0, 1]; may be called from worker threads.
using ProgressFn = std::function<void(double)>;

// Rebuilds an index from serialize()'s bytes; throws Error(corrupt_data) on a
// truncated, corrupted or unknown image, never crashes.
std::unique_ptr<KeyIndex> deserialize_index(std::string_view bytes);

}  // namespace rattn
