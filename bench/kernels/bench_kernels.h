#pragma once
// `rattn bench kernels`: the Halide CPU kernels side by side with plain
// scalar loops and, for dense attention, oneDNN; a STREAM-like bandwidth
// measurement; cold JIT and warm cache-load times; with a GPU, a decode
// step's static set on it. tools/rattn/bench_kernels.cpp parses the options
// (its help describes each).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "codegen/halide/halide_kernels.h"

namespace rattn::bench {

struct BenchKernelsOptions {
  bool jit = true;               // measure the cold JIT (into a temp dir)
  int64_t full_tokens = 131072;  // tokens of the full-attention row (>= 640)
  double min_time = 0.3;         // seconds per measurement
  std::vector<int64_t> gpu_tokens;        // static-set sizes of the GPU rows; empty: 640 and full_tokens
  std::vector<int> gpu_splits = {0, 32};  // cuda.splits; 0: the generator's default, -1: the runtime's choice
  HalideSchedule schedule;       // the Halide schedule knobs (0: automatic)
  std::string command;           // the command line, recorded in the report
  std::FILE* progress = nullptr;  // the progress bar's stream (core/progress.h); nullptr: none
};

// Runs the benchmark. With `text`, prints a summary table there at the end
// (nullptr: nothing). Returns the report (machine, parameters, results,
// ratios, bandwidth, GPU, JIT and targets).
boost::json::object run_bench_kernels(const BenchKernelsOptions& o, std::FILE* text);

}  // namespace rattn::bench
