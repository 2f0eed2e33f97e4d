#pragma once
// The kernel generators' schedule knobs (`kernel.<backend>.<knob>` in a plan)
// and the values each accepts. The one table both the DSL's checks and the
// generators' own checks read, so a plan that passes `rattn inspect` is one
// the generators take.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rattn {

struct KernelKnob {
  const char* key;          // without "kernel.": "cuda.warps"
  int64_t lo, hi;           // legal values lie in lo..hi
  bool pow2 = false;        // ... and are powers of two (0 as well when lo is 0)
  const char* unit = "";    // said after the legal values, e.g. "elements per load"
};

// Every knob, CUDA's first, in the order messages list them.
const std::vector<KernelKnob>& kernel_knobs();
// The knob named `key` ("cuda.warps"), or nullptr.
const KernelKnob* find_kernel_knob(std::string_view key);
// Whether `v` is one of the knob's legal values.
bool kernel_knob_allows(const KernelKnob& k, double v);
// The legal values for a message: "1, 2, 4 or 8", "1..64",
// "a power of two in 8..256", plus the unit when there is one.
std::string kernel_knob_legal(const KernelKnob& k);
// The knobs' names with `prefix` ("cuda." for one backend, "" for all),
// joined by ", ".
std::string kernel_knob_names(std::string_view prefix = "");

}  // namespace rattn
