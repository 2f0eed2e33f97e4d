#pragma once
// The roofline of `rattn bench decode`: for each part of the decode step and
// for full attention, the bytes it read per step (counted from what the code
// touches, docs/performance.md), its GB/s and its share of STREAM triad.
#include <string>
#include <vector>

#include "dsl/ir.h"
#include "runtime/runtime.h"

namespace rattn::bench {

struct RooflineInput {
  DecodeProfile profile;  // rattn's steps: times and counts (summed over steps)
  int head_dim = 128;
  DType kv = DType::f16;
  bool traversal_codes = false;  // the walk scores 8-bit codes instead of the keys
  int code_dims = 0, code_coarse_dims = 0;
  double full_rows = 0;  // rows full attention read per step (mean over the steps)
  double full_ms = 0;    // its wall time per step (mean)
};

struct RooflinePhase {
  std::string name;
  double bytes = -1;  // per step; -1: not counted
  double ms = 0;      // per step (thread times summed, as the profile adds them)
  double gb_s = 0;
  double share_of_triad = 0;
};

// Full attention over `rows` rows of one KV head: its keys and values once.
double full_attention_bytes(double rows, int head_dim, DType kv);
// Bytes the walk reads per key it scores: the key (or its row of codes, whole
// cache lines), its id in a neighbour list (4) and its visited mark (1).
double bytes_per_scored_key(int head_dim, DType kv, bool traversal_codes, int code_dims, int code_coarse_dims);
// The phases in order: static set, search, retrieved attention, merge,
// insertion, full attention. Step parts against `triad_1thread` (their
// times are per thread), full attention against `triad_threads` (the triad
// on the threads it ran on).
std::vector<RooflinePhase> decode_roofline(const RooflineInput& in, double triad_1thread, double triad_threads);

}  // namespace rattn::bench
