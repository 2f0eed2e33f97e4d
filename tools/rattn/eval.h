#pragma once
// `rattn eval`'s options (eval_options.cpp), shared by its text and passkey
// runs (eval.cpp) and its --topk-grid (eval_topk_grid.cpp).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "rattn.h"

namespace rattn::cli::eval {

struct Variant {
  std::string name;
  std::string plan;  // plan=FILE: its own DSL plan (empty: the run's --plan)
  int sinks = -1, window = -1, top_k = -1, search_queue = -1, tail_samples = -1, search_seeds = -1;
  int search_expand_first = -1, search_full_expand = -1;
  // Index build knobs (-1 keeps the plan's): a variant with other ones builds its own indexes.
  int graph_degree = -1, query_neighbors = -1;
  float build_sample = -1;
  std::vector<rattn_layer_search> layer_search;  // KEY@LAYER=V items
  rattn_index_kind index = RATTN_INDEX_GRAPH;
  bool exact_check = false;
};

struct PasskeyLength {
  int64_t length = 0;
  std::vector<double> depths;  // empty: --depths
};

struct Options {
  std::string gguf, text, json_out, plan;
  bool plan_set = false;
  int64_t tokens = 32768, score_tokens = 256;
  std::vector<PasskeyLength> passkey;
  std::vector<double> depths = {0.1, 0.5, 0.9};
  Variant base;
  std::vector<std::string> variant_specs;
  bool check_exact = false;
  bool overlap = true;  // the first plan's indexes build during a second, layer-major prefill
  std::string dump_full;  // full attention's scored positions, as rattn-llama-eval writes them
  std::string topk_grid_dir;
  std::vector<std::array<int64_t, 3>> grid = {{128, 512, 100},  {128, 512, 200},  {128, 512, 500},
                                              {128, 512, 1000}, {128, 2048, 100}, {128, 2048, 500},
                                              {128, 4096, 500}};
  int64_t grid_positions = 256;
  int recall_k = 100, threads = 2;
  rattn_dtype kv = RATTN_F16;
};

// `rattn eval --help`.
extern const char kEvalHelp[];

// The options of `rattn eval` (argv[0]: the subcommand); *help set on --help.
Options parse_options(int argc, char** argv, bool* help);

// The plan (its --sinks, ... overrides), each --variant, and the exact check.
std::vector<Variant> variants_of(const Options& o);

// --topk-grid: the error of the best any top-k retrieval can do.
int topk_grid_main(const Options& o);

}  // namespace rattn::cli::eval
