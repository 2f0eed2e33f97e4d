#pragma once
// The typed IR every stage after the DSL consumes: a model's attention layout,
// a retrieval plan whose parameters are fixed or tunable domains, and a target.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace rattn {

// Where a DSL construct came from, for diagnostics in later stages.
struct SourceLoc {
  std::string file;
  int line = 0;
  int col = 0;
};

// One parameter of the plan: a fixed value, an inclusive stepped range, or a set.
// Integers and reals share the type; integer parameters hold whole numbers.
struct ParamDomain {
  enum class Kind { fixed, range, set };
  Kind kind = Kind::fixed;
  std::vector<double> values;  // fixed: 1 value; set: the members (sorted, unique)
  double lo = 0, hi = 0, step = 1;  // range only
  bool geometric = false;           // range: multiply by `step` instead of adding
  SourceLoc loc;
  // The value to use when nobody tuned this parameter, when the DSL says
  // `... default v` (one of the candidates); otherwise default_value() picks.
  std::optional<double> preferred;

  static ParamDomain fixed_value(double v) {
    ParamDomain d;
    d.values = {v};
    return d;
  }
  bool is_fixed() const { return kind == Kind::fixed; }
  // Every candidate value, in increasing order.
  std::vector<double> candidates() const;
  // The value used when nobody tuned this parameter: the fixed value, the
  // `preferred` one if set, or else the first candidate.
  double default_value() const;
};

struct LayerSpec {
  bool global = true;          // global layers get retrieval indexes
  int64_t sliding_window = 0;  // > 0 for sliding-window (local) layers
  double rope_base = 10000.0;
};

// The pairing of the rotated dimensions in the q/k vectors the engine passes:
// NeoX "rotate half" pairs (i, i + d/2) as in HF Llama/Gemma/Qwen, or GPT-J
// interleaved pairs (2i, 2i + 1) as in llama.cpp's non-NeoX models.
enum class RopeStyle { neox, gptj };
const char* rope_style_name(RopeStyle style);  // "neox", "gptj"

struct ModelLayout {
  std::string name;
  std::string source;  // where the shape was checked (URL / paper)
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType kv_dtype = DType::f16;
  double rope_base_global = 10000.0;
  std::optional<double> rope_base_local;
  RopeStyle rope_style = RopeStyle::neox;  // the pairing of the rotated dimensions in the q/k vectors the engine passes
  int64_t max_context = 0;
  std::vector<LayerSpec> layers;  // size num_layers, expanded from the pattern

  int group_size() const { return num_kv_heads ? num_q_heads / num_kv_heads : 0; }
  int num_global_layers() const;
  // `layer` is a layer of the model and a global one.
  bool is_global(int layer) const { return layer >= 0 && layer < int(layers.size()) && layers[size_t(layer)].global; }
};

// Plan parameter names, as written in the DSL `plan { ... }` block.
namespace plan_keys {
inline constexpr const char* sinks = "sinks";
inline constexpr const char* window = "window";
inline constexpr const char* top_k = "top_k";
inline constexpr const char* graph_degree = "graph_degree";          // M
inline constexpr const char* query_neighbors = "query_neighbors";    // Nq per prefill query
inline constexpr const char* build_sample = "build_sample";          // share of prefill queries used, (0, 1]
inline constexpr const char* search_queue = "search_queue";          // L at decode time
// The index's other build knobs (GraphBuildParams in runtime/index/projected_graph.h;
// the defaults below are the library's, docs/dsl.md):
inline constexpr const char* build_queue = "build_queue";              // L of the build's own searches
inline constexpr const char* pivot_capacity = "pivot_capacity";        // queries one key pivots for
inline constexpr const char* pivots_per_query = "pivots_per_query";    // pivots per training query
inline constexpr const char* two_hop_fill = "two_hop_fill";            // 0/1: fill short lists from 2-hop
inline constexpr const char* extra_slots = "extra_slots";              // adjacency slots beyond graph_degree
inline constexpr const char* entry_points = "entry_points";            // search entry points
inline constexpr const char* repair_fraction = "repair_fraction";      // share of queries in the repair pass, [0, 1]
inline constexpr const char* repair_max_queries = "repair_max_queries";  // at most this many of them (0: no cap)
inline constexpr const char* key_metric = "key_metric";                // 0 inner product, 1 query 2nd moment, 2 covariance
inline constexpr const char* key_metric_ridge = "key_metric_ridge";    // > 0
inline constexpr const char* key_metric_passes = "key_metric_passes";  // bits 1 projection, 2 connectivity, 4 repair
inline constexpr const char* causal = "causal";                        // 0/1: training query t ranks keys <= t only
inline constexpr const char* insert_queue = "insert_queue";            // insert: own-query search queue
inline constexpr const char* insert_pivots = "insert_pivots";          // insert: in-edges from the query's hits
inline constexpr const char* insert_reverse = "insert_reverse";        // insert: in-edges from out-neighbours
inline constexpr const char* insert_key_queue = "insert_key_queue";    // insert: key-local search queue (0: off)
inline constexpr const char* traversal_codes = "traversal_codes";      // 0/1: decode searches walk 8-bit key codes
inline constexpr const char* code_dims = "code_dims";                  // codes of this many learned directions (0: the raw keys)
inline constexpr const char* code_coarse_dims = "code_coarse_dims";    // of those, the last this many in 4 bits
inline constexpr const char* search_patience = "search_patience";      // decode search: stop after P quiet expansions (0: off)
inline constexpr const char* search_seeds = "search_seeds";            // decode search: seeded with the head's previous best S (0: off)
inline constexpr const char* search_expand_first = "search_expand_first";  // decode search: a candidate's first C neighbours (0: whole list)
inline constexpr const char* search_full_expand = "search_full_expand";    // decode search: whole lists for the best F candidates (0: all)
inline constexpr const char* tail_samples = "tail_samples";            // decode: sampled estimate of the unretrieved tail (0: off)
inline constexpr const char* shift_queries = "shift_queries";          // build: latest prefill queries copied RoPE-shifted (0: off)
inline constexpr const char* shift_span = "shift_span";                // build: the largest of the copies' shifts, in positions
inline constexpr const char* refresh_sample = "refresh_sample";        // share of inserted tokens' queries kept for a refresh, [0, 1]
inline constexpr const char* shared_graph = "shared_graph";            // 0/1: one graph per KV head for its query group
inline constexpr const char* knn_cluster_keys = "knn_cluster_keys";    // build: training kNN partitions of ~this many keys (0: exact)
inline constexpr const char* knn_probes = "knn_probes";                // build: partitions each training query asks for
// The keys a `layer N, ... { ... }` block inside the plan may set for those
// global layers alone (the rest of the plan is model-wide): how much each
// step retrieves and estimates, and its decode searches.
inline constexpr const char* layer_keys[] = {top_k,           tail_samples,        search_queue,      search_patience,
                                             search_seeds,    search_expand_first, search_full_expand};
}  // namespace plan_keys

// One global layer's own domains, keyed by plan_keys::layer_keys.
struct LayerSearchDomains {
  std::map<std::string, ParamDomain> params;
  SourceLoc loc;  // the `layer` keyword of its block
};

// The decode searches of one layer: the plan-wide values with that layer's
// own (ConcretePlan::decode_search; the defaults live in ConcretePlan).
struct DecodeSearch {
  int queue = 0;
  int patience = 0;
  int seeds = 0;
  int expand_first = 0;
  int full_expand = 0;
};

// What one layer's decode step retrieves: the plan-wide values with that
// layer's own (ConcretePlan::layer_retrieval).
struct LayerRetrieval {
  int64_t top_k = 0;
  int tail_samples = 0;
};

struct RetrievalPlan {
  ParamDomain sinks = ParamDomain::fixed_value(128);
  ParamDomain window = ParamDomain::fixed_value(512);
  ParamDomain top_k = ParamDomain::fixed_value(100);
  ParamDomain graph_degree = ParamDomain::fixed_value(32);
  ParamDomain query_neighbors = ParamDomain::fixed_value(100);
  ParamDomain build_sample = ParamDomain::fixed_value(1.0);
  ParamDomain search_queue = ParamDomain::fixed_value(160);
  ParamDomain build_queue = ParamDomain::fixed_value(128);
  ParamDomain pivot_capacity = ParamDomain::fixed_value(6);
  ParamDomain pivots_per_query = ParamDomain::fixed_value(6);
  ParamDomain two_hop_fill = ParamDomain::fixed_value(0);
  ParamDomain extra_slots = ParamDomain::fixed_value(4);
  ParamDomain entry_points = ParamDomain::fixed_value(4);
  ParamDomain repair_fraction = ParamDomain::fixed_value(0.0);
  ParamDomain repair_max_queries = ParamDomain::fixed_value(16384);
  ParamDomain key_metric = ParamDomain::fixed_value(0);
  ParamDomain key_metric_ridge = ParamDomain::fixed_value(1e-3);
  ParamDomain key_metric_passes = ParamDomain::fixed_value(7);
  ParamDomain causal = ParamDomain::fixed_value(0);
  ParamDomain insert_queue = ParamDomain::fixed_value(32);
  // Insert path 32:2:8:12 (queue:pivots:reverse:key_queue): the decode step
  // inserts a token per index per step, and this path is ~7% faster per
  // step than 32:4:16:16 for 0.004 less recall on new tokens (0.933 vs 0.937
  // at T = 131072; docs/performance.md).
  ParamDomain insert_pivots = ParamDomain::fixed_value(2);
  ParamDomain insert_reverse = ParamDomain::fixed_value(8);
  ParamDomain insert_key_queue = ParamDomain::fixed_value(12);
  // Off by default: in the decode step (4 indexes per group, inserts every
  // step) the codes measured slower than the exact walk (docs/performance.md).
  ParamDomain traversal_codes = ParamDomain::fixed_value(0);
  // With traversal_codes: codes of the keys projected onto code_dims learned
  // directions (per query head; 0: 8-bit codes of the raw keys, shared by a
  // GQA group), the last code_coarse_dims of them 4-bit: 80 with 32 coarse is
  // one cache line per key at head_dim 128 (docs/index.md). Off by default.
  ParamDomain code_dims = ParamDomain::fixed_value(0);
  ParamDomain code_coarse_dims = ParamDomain::fixed_value(0);
  // Off by default: L alone bounds the walk (SearchParams::patience).
  ParamDomain search_patience = ParamDomain::fixed_value(0);
  // The previous decode step's best `search_seeds` results of the same query
  // head seed its next search, scored with the entry points (consecutive
  // decode queries share much of their top-k). On by default: the same step
  // time, half the attention error at T = 131072 (synthetic), perplexity
  // +1.8% -> +0.2% on Gemma-3 at 32K (docs/performance.md). 0: off.
  ParamDomain search_seeds = ParamDomain::fixed_value(100);
  // Partial expansion (SearchParams::expand_first / full_expand_rank): a
  // candidate expanded below rank search_full_expand scores only its first
  // search_expand_first neighbours (the build orders lists by training
  // co-occurrence). Off (0) by default: whole lists; it cost perplexity in
  // decode on Gemma-3 at 32K (docs/performance.md).
  ParamDomain search_expand_first = ParamDomain::fixed_value(0);
  ParamDomain search_full_expand = ParamDomain::fixed_value(0);
  // Off by default: per KV head and step, a strided sample of this many
  // offloaded tokens estimates the attention mass outside static set + top-k
  // (docs/runtime.md, "Tail estimation").
  ParamDomain tail_samples = ParamDomain::fixed_value(0);
  // RoPE-shifted copies of the latest `shift_queries` prefill queries join the
  // index's training queries (decode queries sit past every prefill query):
  // rotated forward by shift_span/8, /4, /2 and shift_span positions with the
  // layer's rope_base and the model's rope_style. Off (0) by default.
  ParamDomain shift_queries = ParamDomain::fixed_value(0);
  ParamDomain shift_span = ParamDomain::fixed_value(2048);
  // Off by default: this share of the inserted tokens' queries is kept so
  // that Sequence::refresh_indexes() (C API rattn_sequence_refresh) can run
  // the build's repair pass with them and their RoPE-shifted copies; the
  // refresh is an exact GEMM over every offloaded key, for idle time
  // (docs/index.md, "Refresh").
  ParamDomain refresh_sample = ParamDomain::fixed_value(0.0);
  // 1: one graph per KV head, built from its query group's pooled prefill
  // queries and searched by the group's query heads in lockstep (a key row
  // fetched once is scored for every head whose walk asks for it); a group
  // of G heads holds 1/G of the per-query-head graphs' bytes. 0 (default):
  // one graph per query head (docs/index.md, "Shared graphs").
  ParamDomain shared_graph = ParamDomain::fixed_value(0);
  // The training queries' kNN (GraphBuildParams::knn_*): k-means partitions
  // of about knn_cluster_keys keys (default 256), each query block scanning
  // its queries' knn_probes best ones (0, default: automatic, 64 up to
  // 131072 keys and the square root's growth above), for stores of 65536
  // keys and more; knn_cluster_keys 0: the exact scan of every key, whose
  // cost grows with the square of the context (docs/performance.md,
  // "Build time").
  ParamDomain knn_cluster_keys = ParamDomain::fixed_value(256);
  ParamDomain knn_probes = ParamDomain::fixed_value(0);
  // Kernel schedule knobs, e.g. "cuda.splits", "cuda.warps", "halide.vector";
  // the code generators read the ones they know.
  std::map<std::string, ParamDomain> kernel;
  // Per global layer: its own domains (`layer 17 { ... }`): top_k,
  // tail_samples and the decode searches. Gemma-3's global layers trade
  // recall for keys scored differently, and their attention spreads
  // differently (docs/performance.md), so the tuner may pick them apart.
  std::map<int, LayerSearchDomains> layer_search;
};

// A plan with every parameter chosen: what the runtime executes.
struct ConcretePlan {
  int64_t sinks = 128;
  int64_t window = 512;
  int64_t top_k = 100;
  int graph_degree = 32;
  int query_neighbors = 100;
  double build_sample = 1.0;
  int search_queue = 160;
  int build_queue = 128;
  int pivot_capacity = 6;
  int pivots_per_query = 6;
  bool two_hop_fill = false;
  int extra_slots = 4;
  int entry_points = 4;
  double repair_fraction = 0.0;
  int repair_max_queries = 16384;
  int key_metric = 0;
  double key_metric_ridge = 1e-3;
  int key_metric_passes = 7;
  bool causal = false;
  int insert_queue = 32;
  int insert_pivots = 2;
  int insert_reverse = 8;
  int insert_key_queue = 12;
  bool traversal_codes = false;
  int code_dims = 0;
  int code_coarse_dims = 0;
  int search_patience = 0;
  int search_seeds = 100;
  int search_expand_first = 0;
  int search_full_expand = 0;
  int tail_samples = 0;
  int shift_queries = 0;
  int shift_span = 2048;
  double refresh_sample = 0.0;
  bool shared_graph = false;
  int knn_cluster_keys = 256;
  int knn_probes = 0;
  std::map<std::string, double> kernel;
  // Per global layer: the keys it sets itself (names of plan_keys::layer_keys
  // -> value); the rest are the plan-wide ones.
  std::map<int, std::map<std::string, int>> layer_search;

  // The decode searches of `layer`.
  DecodeSearch decode_search(int layer) const;
  // What `layer`'s step retrieves (top_k) and samples of the tail.
  LayerRetrieval layer_retrieval(int layer) const;
  // An explicit plan-wide `key` (e.g. a C API override) holds for every
  // layer: the layers' own values of it go.
  void drop_layer_search(const char* key);
};

struct Target {
  std::string gpu_arch = "none";  // "none" or "sm_80", "sm_86", "sm_89", "sm_90", ...
  std::string cpu = "host";       // "host" or a CPU name
  bool has_gpu() const { return gpu_arch != "none"; }
};

struct Program {
  ModelLayout model;
  RetrievalPlan plan;
  Target target;
  std::string path;  // the .ra file it came from
};

// Every plan-wide parameter but the kernel knobs, with its DSL key, in the
// order `rattn inspect` prints them.
struct PlanParam {
  const char* key;
  const ParamDomain* domain;
};
std::vector<PlanParam> plan_params(const RetrievalPlan& plan);

// Chooses the default of every domain.
ConcretePlan default_concrete_plan(const RetrievalPlan& plan);

}  // namespace rattn
