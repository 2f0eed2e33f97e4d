#pragma once
// Internal to the plan tuner: the calibration sets of one run (`--calib
// DIR`, given once or more), checked against the plan's model and against
// each other, and each set's identity for the tuning database.
#include <cstdint>
#include <string>
#include <vector>

#include "dsl/ir.h"
#include "runtime/data/calib.h"

namespace rattn {

struct CalibSet {
  std::string dir;
  std::string name;  // the directory's name; its path where two sets' names agree
  CalibManifest manifest;
  // A hash of the manifest and every layer file's path, size and time:
  // rereading gigabytes to hash them would cost more than a repeated run may.
  std::string id;
};

// Every set read and checked: each holds the model's heads (a clear error
// naming the set otherwise), the sets agree on the model's name and on
// RoPE, and no directory is given twice. *context: `context` when > 0 (an
// error where a set holds fewer tokens), else the shortest set's tokens.
std::vector<CalibSet> read_calib_sets(const ModelLayout& model, const std::vector<std::string>& dirs, int64_t context,
                                      int64_t* context_out);

// The model's global layers that every set holds, ascending.
std::vector<int> common_global_layers(const ModelLayout& model, const std::vector<CalibSet>& sets);

// "%016llx" of a 64-bit hash.
std::string hex64(uint64_t h);

}  // namespace rattn
