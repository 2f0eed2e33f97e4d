#pragma once
// The tuning pass's options for the tests' tiny synthetic models: 3072
// tokens, 64 test queries in blocks of 16, bounds a tiny index can meet.
#include "autotune/plan_tuner.h"

namespace rattn::test {

inline PlanTuneOptions tiny_options() {
  PlanTuneOptions o;
  o.synthetic = true;
  o.context = 3072;
  o.test_queries = 64;
  o.holdout_block = 16;
  o.min_recall = 0.9;
  o.max_output_error = 0.2;
  o.threads = 2;
  o.gpu = "none";
  return o;
}

}  // namespace rattn::test
