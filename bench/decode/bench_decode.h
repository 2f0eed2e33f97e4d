#pragma once
// `rattn bench decode`: the hybrid decode step of one KV head (its GQA group
// of query heads) against full attention on the CPU, in the same run, with
// the same CPU kernels; plus the modelled per-token attention time of a whole
// model. tools/rattn/bench_decode.cpp parses the options (its help describes
// each).
#include <cstdint>
#include <cstdio>
#include <string>

#include <boost/json.hpp>

#include "dsl/ir.h"
#include "runtime/runtime.h"

namespace rattn::bench {

struct BenchDecodeOptions {
  int64_t tokens = 131072;
  int head_dim = 128;
  int group = 4;
  int steps = 32;
  int warmup = -1;  // -1: insert_batch + 1
  int64_t sinks = 128;
  int64_t window = 512;
  int64_t top_k = 100;
  int search_queue = 160;
  int graph_degree = 32;
  int query_neighbors = 100;
  double build_sample = 0.05;
  int threads = 1;
  int insert_batch = 16;  // the runtime's default
  int searches_per_item = 0;  // 0: the runtime's automatic choice
  int tail_samples = 0;       // > 0: also time rattn with the tail estimate, side by side
  int search_seeds = -1;      // >= 0: also time rattn with plan.search_seeds = N, side by side
  int batch = 0;              // > 0: also time N sequences, one decode() each against one decode_batch()
  bool use_gpu = true;
  bool traversal_codes = ConcretePlan{}.traversal_codes;
  int code_dims = ConcretePlan{}.code_dims, code_coarse_dims = ConcretePlan{}.code_coarse_dims;
  bool share_codes = RuntimeConfig{}.share_traversal_codes;
  bool shared_graph = ConcretePlan{}.shared_graph;  // one graph per KV head
  bool exact_index = false;  // an exact top-k scan instead of the graph
  // The graph's insert path (plan.insert_*; applied to a loaded state too).
  int insert_queue = ConcretePlan{}.insert_queue, insert_pivots = ConcretePlan{}.insert_pivots,
      insert_reverse = ConcretePlan{}.insert_reverse, insert_key_queue = ConcretePlan{}.insert_key_queue;
  std::string state_cache;
  uint64_t seed = 1;
  // The modelled model: layers x KV heads decode steps per token.
  std::string model = "Llama-3-8B";
  int model_layers = 32;
  int model_kv_heads = 8;
  // The progress bar's stream (core/progress.h); nullptr: none.
  std::FILE* progress = nullptr;
};

// Runs the benchmark, printing its progress and a summary to `text`
// (nullptr: silent). Returns the report (machine_info, params, results,
// model).
boost::json::object run_bench_decode(const BenchDecodeOptions& o, std::FILE* text);

}  // namespace rattn::bench
