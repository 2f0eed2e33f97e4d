#pragma once
// The pass's CPU time model against the runtime's own decode step: a
// candidate plan's step (Sequence::decode, the CPU kernels, the pass's
// thread count) timed on a sampled layer's calibration data, prefilled once
// per window and reloaded for each candidate that shares it.
#include <cstdint>
#include <string>
#include <vector>

#include "autotune/plan_measure.h"
#include "dsl/ir.h"

namespace rattn {

// `program`'s layout cut to one KV head and its query heads (the sampled
// group), every layer kept (the plan's per-layer searches apply), and its
// plan fixed to the program's defaults.
struct EngineStepSetup {
  const Program* program = nullptr;
  int layer = 0;
  int64_t prefix = 0;   // tokens prefilled; the steps decode the tokens after them
  int steps = 48;       // timed steps, after a few untimed ones
  int threads = 2;
};

// Prefills `setup.layer` with the group's first setup.prefix tokens (the
// index build included) and saves the sequence to `state_path`.
void prefill_engine_state(const EngineStepSetup& setup, const GroupData& data, const std::string& state_path);

// Loads state_paths[i] into a runtime with setups[i].program's plan (same
// sinks and window as the state's; every setup of one layer) and times the
// decode steps over the tokens after the prefix, the caches flushed before
// each step as the rest of a model's layers would leave them. The setups
// take turns at each step, so a drift of the machine over the run weighs on
// each alike: each setup's median step in microseconds.
std::vector<double> time_engine_steps(const std::vector<EngineStepSetup>& setups, const GroupData& data,
                                      const std::vector<std::string>& state_paths);

}  // namespace rattn
