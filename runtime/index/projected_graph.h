#pragma once
// The attention-aware index: a RoarGraph-style projected bipartite graph over
// the keys of one KV head, built from the prefill queries of one query head.
// Build: top-Nq keys of each sampled training query (blockwise oneDNN GEMM +
// threshold top-k over every key, or, opted in by knn_cluster_keys, over the
// query's likeliest k-means partitions; the T x T score matrix is never held),
// projection of each query's neighbours onto a pivot key, occlusion pruning to degree M,
// reverse edges, connectivity for keys no query reached, entry points.
// Search: best-first beam search by inner product with queue length L.
// See docs/index.md for the design and the insert path.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu_kernels.h"
#include "runtime/index/key_index.h"

namespace rattn {

// All build parameters in one struct; the DSL plan and the tuner fill it.
struct GraphBuildParams {
  int degree = 32;               // M: out-degree bound after pruning
  int query_neighbors = 100;     // Nq: exact neighbours per training query
  double sample_fraction = 1.0;  // share of the training queries used, (0, 1]
  int build_queue = 128;         // L of the searches the build and insert() run
  int threads = 2;               // build threads (GEMM and graph passes)
  uint64_t seed = 0x5eed;        // query sampling and processing order
  // A key serves as pivot for at most this many queries before the query's
  // next-best key takes over; keeps hubs (sink tokens) from swallowing the
  // projected edges of every query.
  int pivot_capacity = 6;
  // Each training query projects its neighbours onto this many pivots (its
  // best keys that still have capacity), so that most keys get out-edges.
  int pivots_per_query = 6;
  // Nodes left with fewer than M neighbours get the best of their 2-hop
  // neighbours (by inner product with the node's key). Off by default: the
  // filled edges made each walk score more keys for no more recall at equal
  // keys scored (docs/index.md, step 6).
  bool fill_two_hop = false;
  // Each finished neighbour list is ordered by how many training queries
  // retrieved the neighbour together with the node (ties: the build's order,
  // by key relation), so a partial expansion (SearchParams::expand_first)
  // scores the neighbours likeliest to be in the same answer first. Changes
  // only the order within lists: whole-list searches find the same keys, so
  // a plan's build orders them only where its searches expand partially
  // (graph_build_params; the tuner where its grid does).
  bool cooccurrence_order = true;
  int extra_slots = 4;   // adjacency slots beyond M for connectivity and insert in-edges
  int entry_points = 4;  // centroid-nearest key + most frequent top-1 keys
  // Query-guided repair after the build: this share of the training queries
  // searches the finished graph (L = build_queue); each key of its exact
  // top-Nq list the search missed gets an in-edge from the found list key
  // nearest to it (inner product). 0 disables the pass. It costs one search
  // per repaired query, hence off by default with sample_fraction 1 here;
  // `rattn bench index` turns it on with a 20% sample (+0.002..0.008 recall
  // at equal keys scored, docs/performance.md).
  double repair_fraction = 0.0;
  // At most this many of those queries (spread evenly over them; 0: no
  // cap): the pass's searches grow faster than the keys. Against no cap at
  // 524288 keys, a quarter of the 104858 queries lost at most 0.0045 of
  // recall at equal keys scored (0.0016 on the second distribution); 16384
  // against 32768 at most 0.0031 (0.0026 on held-out data) for half the
  // pass's time (docs/notes/2026-11-27-index-build-at-scale.md).
  int64_t repair_max_queries = 16384;
  // Insert path (KeyIndex::insert, once per query head per decoded token):
  // a beam search with the token's own query (queue insert_queue, seeded
  // from the entries and the previously inserted key) and, when
  // insert_key_queue > 0, a short local search with the key itself; the new
  // key links to its M best hits by inner product with the key and gets
  // in-edges from the query's `insert_pivots` best hits and from its
  // `insert_reverse` best out-neighbours (weakest non-tree edge replaced when
  // a list is full; no re-pruning). Saved with the graph. At T = 131072 this
  // scores ~1,500 keys per insert (~830 with KeyIndex::insert_hinted, which
  // skips the own-query search) against ~7,200 for two L = 128 searches and
  // re-pruning (docs/performance.md).
  int insert_queue = 32;
  int insert_pivots = 2;
  int insert_reverse = 8;
  int insert_key_queue = 12;
  // Key-to-key relations of the build passes (projection order, occlusion
  // pruning, reverse-edge pruning, 2-hop fill, connectivity and repair):
  // 0 = plain inner product <k1, k2>; 1 = k1' S k2 with S the second moment
  // of the training queries; 2 = the same with their covariance. 1 and 2
  // measure how alike two keys score across queries. On the synthetic set
  // (key variance in directions queries ignore) 2 lifts recall@100 at 2% keys
  // scored from 0.885 to 0.955 (T = 131072); on the real Gemma-3 layers it
  // loses badly (layer 17: 0.96 -> 0.55 at ~3.6%), so the default stays 0: a
  // per-data plan choice (`rattn bench index --key-metric 2`, docs/index.md).
  int key_metric = 0;
  // With key_metric 0: the key-to-key relations use the keys minus their
  // mean (a query ranks keys the same either way). Keys that share a large
  // mean otherwise look alike to every pass and the graph navigates badly:
  // Gemma-3 270M layer 11 at 32K, head 0, L = 100: recall@100 0.51 at 3.8%
  // keys scored -> 0.93 at 1.75% (docs/index.md). The mean is saved with
  // the graph and insert subtracts it from the new key.
  bool center_keys = true;
  // Keep (and save) the training queries' second moment ([d, d], 64 KiB at
  // d = 128): the query model of the projected traversal codes
  // (SearchParams::code_dims), which without it are a plain PCA of the keys.
  // Off by default: the runtime does not walk projected codes, so its
  // indexes would only carry the bytes and the build time.
  bool keep_query_moment = false;
  // Causal training lists: training query t (row t of train_queries, token
  // position t) ranks only the key rows r <= t - causal_key_offset, i.e. the
  // keys it attends to in the model; causal_key_offset = token position of
  // key row 0 (the runtime's CPU keys start after the sinks). Halves the
  // exact top-Nq GEMM. Off by default: it needs position-aligned queries.
  bool causal = false;
  int64_t causal_key_offset = 0;
  double key_metric_ridge = 1e-3;  // S + ridge * trace(S) / d * I
  int key_metric_passes = 7;       // bits: 1 projection/reverse/2-hop, 2 connectivity, 4 repair
  // RoPE-shifted training queries. Decode queries sit past every prefill
  // query, and RoPE makes a score depend on the query-to-key distance, so
  // copies of the latest `shift_queries` training queries (the last rows of
  // train_queries, which must be in position order) rotated forward by
  // shift_span / 8, / 4, / 2 and shift_span positions join the training set:
  // queries as if asked later. Synthetic T = 131072: recall@100 at L = 200
  // 0.936 -> 0.956 at 1.54 -> 1.62% keys scored (docs/performance.md). Needs
  // plain RoPE (no scaling) with `rope_base`; not with `causal`. 0: off.
  int shift_queries = 0;
  int shift_span = 2048;
  double rope_base = 10000.0;
  bool rope_interleaved = false;  // GPT-J pairs (2i, 2i + 1); false: NeoX pairs (i, i + d / 2)
  // Where the training-query kNN runs (training_knn): automatic (the
  // default) takes the GPU's generated kernel (codegen/cuda/knn_kernel.h)
  // when a GPU is present and the build is large enough to gain, else the
  // CPU; gpu requires one. The GPU's lists are the exact ones (exact_knn's
  // up to ties and fp32 rounding), whatever knn_cluster_keys says: on an
  // H100 a 131072-key head built with the same recall, its kNN 10x faster
  // than 2 CPU threads (docs/performance.md).
  enum class KnnDevice { automatic, cpu, gpu };
  KnnDevice knn_device = KnnDevice::automatic;
  // The training queries' top-Nq lists (internal::training_knn). With
  // knn_cluster_keys > 0 and at least knn_min_keys keys: partitioned kNN
  // (k-means partitions of about knn_cluster_keys keys; queries sorted by
  // their best partition, each block of them scans the union of its queries'
  // knn_probes likeliest partitions); 0: the exact scan of every key, whose
  // cost grows with the square of the context. knn_probes 0 (default):
  // automatic, knn_auto_probes(keys): 64 up to 131072 keys, then growing with
  // the square root of the keys (128 at 524288), which held recall@100 at
  // equal keys scored within 0.0052 of the exact lists (or above them) on
  // both synthetic distributions at 131072 and 524288 keys, where a fixed 64
  // lost 0.02 at 524288 (docs/performance.md, "Build time").
  int knn_cluster_keys = 256;
  int knn_probes = 0;
  int knn_iterations = 6;  // k-means (Lloyd) steps on a sample of 48 keys per partition
  bool knn_bf16 = true;    // PartitionedKnnParams::bf16 (bf16 products where the CPU has them)
  int64_t knn_min_keys = 65536;
  // Connectivity: an unreached key takes its neighbours among its partition
  // (the partitioned kNN's, or a short k-means when thousands of keys are
  // unreached) instead of a beam search per key: at 524288 keys 9.6-11 s
  // of searches became 0.7-2.8 s at the same recall (docs/notes/
  // 2026-11-27-index-build-at-scale.md). false: always the searches.
  bool connect_by_partition = true;
};

// `keys`: rows [0, keys.rows) are indexed (fp32 or fp16). `train_queries`:
// [num_queries, keys.dim] fp32, never the test queries. kernels == nullptr:
// the index's built-in vectorised inner products (CpuKernels::gathered_dot
// otherwise, e.g. the Halide kernels). Throws Error(invalid_argument) on bad
// shapes or parameters.
std::unique_ptr<KeyIndex> build_projected_graph(const RowsView& keys, const float* train_queries,
                                                int64_t num_queries, const GraphBuildParams& params,
                                                std::shared_ptr<CpuKernels> kernels = nullptr,
                                                const ProgressFn& progress = {});

// Query-guided refresh of a built (and possibly grown) graph with later
// queries, e.g. those of tokens inserted since the build: their exact top-Nq
// lists over every indexed key (oneDNN GEMM), with their RoPE-shifted copies
// when p.shift_queries > 0, go through the build's repair pass (a key a
// list holds but the graph's search misses gets an in-edge from the found
// key nearest to it). Uses p.query_neighbors, p.threads, p.shift_* and
// p.key_metric_passes; the key relations are the build's own. Inserted
// keys get their edges from one short search, and queries past the build's
// last positions found no shifted copies at build time; a refresh every
// 1024 inserts with half of those tokens' queries took recall@100 on test
// queries that need new tokens from 0.913 to 0.933 (T = 131072, 10% inserted,
// docs/performance.md) at ~1.2 ms of GEMM per inserted token on 2 threads.
// Not concurrently with searches or inserts. Throws Error(invalid_argument)
// on bad arguments or when `index` is not a projected graph.
void refresh_projected_graph(KeyIndex& index, const RowsView& keys, const float* queries, int64_t num_queries,
                             const GraphBuildParams& p);

// Whether `index` is a projected graph (the runtime gives small stores an
// exact index instead).
bool is_projected_graph(const KeyIndex& index);

// Replaces the insert parameters (insert_*) of a projected graph, e.g. one
// loaded from an image; the tuner and the benchmark's insert sweep use it.
// Throws Error(invalid_argument) when `index` is not a projected graph.
void set_insert_params(KeyIndex& index, const GraphBuildParams& p);

// One phase of the last build: wall seconds and process CPU seconds (their
// ratio shows how busy the build threads were).
struct BuildPhase {
  std::string name;
  double seconds = 0;
  double cpu_seconds = 0;
};

// Graph shape, for benchmarks and docs.
struct GraphInfo {
  int64_t nodes = 0;
  int degree = 0;          // M
  int slots = 0;           // per-node capacity (M + extra)
  double mean_degree = 0;
  int64_t unreached_before_repair = 0;  // keys no projected edge reached
  int64_t unreachable = 0;              // keys still unreachable from the entries
  size_t adjacency_bytes = 0;
  size_t code_bytes = 0;  // traversal codes of the search path (0 until a search used them)
  int64_t inserts = 0;             // insert() calls since build/load
  int64_t insert_keys_scored = 0;  // inner products those inserts computed
  int64_t refresh_queries = 0;        // queries (shifted copies included) of refresh_projected_graph since build/load
  int64_t refresh_edges_offered = 0;  // in-edges those refreshes offered (a full list takes one only over its weakest)
  double key_alignment = 0;        // build: query/key covariance alignment (0 if not computed)
  int64_t training_queries = 0;    // build: training queries used (sampled; RoPE-shifted copies included)
  int64_t shifted_queries = 0;     // build: RoPE-shifted copies offered to the sample (shift_queries)
  int key_metric = 0;              // build: the key metric used (GraphBuildParams::key_metric)
  int64_t knn_partitions = 0;      // build: partitions of the training kNN (0: exact)
  double knn_scanned_fraction = 0; // build: keys the training kNN scored per query, share of all keys
  double knn_partition_seconds = 0, knn_probe_seconds = 0, knn_scan_seconds = 0;  // build: partitioned kNN steps (wall)
  bool knn_on_gpu = false;  // build: the training kNN ran on a GPU; its steps' wall seconds:
  double knn_gpu_open_seconds = 0, knn_gpu_upload_seconds = 0, knn_gpu_kernel_seconds = 0, knn_gpu_download_seconds = 0;
  std::vector<BuildPhase> build_phases;  // build: per phase, in order (empty after load)
  int entry_points = 0;                  // entry points of the graph
  int insert_queue = 0, insert_pivots = 0, insert_reverse = 0, insert_key_queue = 0;  // insert knobs in use
};
// Throws Error(invalid_argument) when `index` is not a projected graph.
GraphInfo projected_graph_info(const KeyIndex& index);
// GraphInfo::insert_keys_scored alone, without info()'s whole-graph walks;
// -1 when `index` is not a projected graph.
int64_t projected_graph_insert_keys_scored(const KeyIndex& index);

// The out-neighbours of node `id` and the entry points, for diagnostics.
// Throws Error(invalid_argument) when `index` is not a projected graph or
// `id` is not in it.
std::vector<int32_t> projected_graph_neighbors(const KeyIndex& index, int32_t id);
std::vector<int32_t> projected_graph_entries(const KeyIndex& index);

// Keys a search scores at the least when it expands exactly the nodes `ids`
// (each scores its whole neighbour list) after scoring the entry points: the
// distinct keys among the entries, the ids and their neighbours. With the
// exact top-k of a query as `ids` it is the cost of a best-first walk that
// expands nothing but the answer, a floor for the graph's degree (`rattn
// bench index`'s answer_expansion_scored_fraction, docs/index.md). Throws
// Error(invalid_argument) when `index` is not a projected graph or an id is
// not in it.
int64_t expansion_footprint(const KeyIndex& index, const int32_t* ids, int n);

namespace internal {
// The training-query copies of GraphBuildParams::shift_queries: for each shift
// (span / 8, / 4, / 2, span), the last min(shift_queries, num_queries) rows of
// `queries` [num_queries, dim] rotated forward by that many positions; fp32,
// [copies, dim], shift by shift. Empty when shift_queries is 0.
std::vector<float> rope_shifted_queries(const float* queries, int64_t num_queries, int dim,
                                        const GraphBuildParams& p);

// The r-th of R picks spread evenly over [0, Q): floor(r Q / R), ascending,
// from the whole range (an integer stride Q / R took the first R when
// Q < 2R). r < R and Q < 2^31, so r Q does not overflow.
inline int64_t spread_pick(int64_t r, int64_t Q, int64_t R) { return r * Q / R; }

// The build's exact top-nq lists (key row ids, best first, nq per picked
// query): blockwise GEMM + threshold top-k over fp32 `keys`. causal_offset
// >= 0: query row t ranks only key rows <= t - causal_offset (`picked` sorted,
// each seeing >= nq keys). `step` (may be empty) gets progress in [0, 1].
// Exposed for tests.
std::vector<int32_t> exact_knn(const RowsView& keys, const float* queries, const std::vector<int64_t>& picked,
                               int nq, int threads, const std::function<void(double)>& step,
                               int64_t causal_offset = -1);

// What a training kNN did: its partitions (0: exact) and the keys it scored
// per query, as a share of all keys.
struct KnnStats {
  int64_t partitions = 0;
  double scanned_fraction = 0;
  // Wall seconds of the partitioned kNN's steps: k-means and assignment,
  // probe ranking, the scan of the probed partitions.
  double partition_seconds = 0, probe_seconds = 0, scan_seconds = 0;
  // The GPU's kNN (gpu true): opening the device and its kernel (once per
  // process and shape), the copies to it, the kernel, the copies back.
  bool gpu = false;
  double gpu_open_seconds = 0, gpu_upload_seconds = 0, gpu_kernel_seconds = 0, gpu_download_seconds = 0;
  // Per key, its partition (empty for an exact scan): the build's
  // connectivity pass looks for an unreached key's neighbours there.
  std::vector<int32_t> key_partition;
  // An exact scan of every key for `queries` queries.
  static KnnStats exact(int64_t queries) {
    KnnStats s;
    s.scanned_fraction = queries > 0 ? 1.0 : 0.0;
    return s;
  }
};
struct PartitionedKnnParams {
  int cluster_keys = 256;  // mean keys per partition
  int probes = 64;         // partitions each query asks for
  int iterations = 6;      // k-means steps
  double spread = 3.0;     // probe order: <q, mean> + spread * sd of the partition's scores for q
  uint64_t seed = 0x5eed;
  // Where the CPU has bf16 dot products: the k-means, the probe ranking
  // and the scan score bf16-rounded keys and queries (the scan's short list
  // is then re-ranked with f32 scores); false: f32 throughout.
  bool bf16 = true;
};
// Approximate top-nq lists (same layout and causal rule as exact_knn): the
// keys are split into k-means partitions; a block of queries with the same
// best partition scans the union of its queries' `probes` best partitions
// (by inner product with the centroid), so a query scores a small share of
// the keys. Queries left with fewer than nq visible keys take exact_knn.
// Deterministic for a seed, whatever the thread count. `stats` may be null.
std::vector<int32_t> partitioned_knn(const RowsView& keys, const float* queries, const std::vector<int64_t>& picked,
                                     int nq, const PartitionedKnnParams& kp, int threads,
                                     const std::function<void(double)>& step, int64_t causal_offset = -1,
                                     KnnStats* stats = nullptr);
// Partitions each training query probes when knn_probes is 0 (automatic).
int knn_auto_probes(int64_t keys);
// The CPU's kNN step (p.knn_*): the training queries `picked` (rows of
// `queries`) -> their top-nq key rows, best first, nq per query:
// partitioned_knn or exact_knn.
std::vector<int32_t> cpu_training_knn(const RowsView& keys, const float* queries, const std::vector<int64_t>& picked, int nq,
                                  const GraphBuildParams& p, const std::function<void(double)>& step,
                                  int64_t causal_offset = -1, KnnStats* stats = nullptr);
// The build's training-query lists (p.causal and p.causal_key_offset as
// the causal offset) on the device p.knn_device picks: the GPU's exact
// lists, or cpu_training_knn's. Error(unsupported) for knn_device gpu without a usable GPU.
std::vector<int32_t> training_knn(const RowsView& keys, const float* queries, const std::vector<int64_t>& picked,
                                  int nq, const GraphBuildParams& p, const std::function<void(double)>& step,
                                  KnnStats* stats = nullptr);
// Whether training_knn runs on the GPU for these sizes (false: the CPU).
bool training_knn_on_gpu(const GraphBuildParams& p, int64_t num_keys, int64_t num_queries, int dim, int nq);
}  // namespace internal

}  // namespace rattn
