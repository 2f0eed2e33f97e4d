#pragma once
// Shared helper of the runtime tests that go through the C API.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "rattn.h"

namespace rattn::testing {

// Context params for `plan` (kept alive by the caller): reference kernels,
// no GPU, one thread.
inline rattn_context_params reference_params(const std::string& plan) {
  rattn_context_params p = rattn_context_default_params();
  p.plan_text = plan.c_str();
  p.kernels = RATTN_KERNELS_REFERENCE;
  p.use_gpu = false;
  p.n_threads = 1;
  return p;
}

// A plan override of the C API (`param`, named `name` in the plan): -1, the
// default, keeps the plan's value; >= 0 overrides it; `reported` says which
// was taken; < -1 is refused with a message naming the field.
template <class T>
void expect_context_override(const std::string& name, T plan_value, T rattn_context_params::*param,
                             T rattn_context_info::*reported) {
  const std::string plan = "model \"M\" { layers = 1; q_heads = 2; kv_heads = 1; head_dim = 64; context = 8192; }\n"
                           "plan { " + name + " = " + std::to_string(plan_value) + "; }\n";
  rattn_context_params p = reference_params(plan);
  EXPECT_EQ(p.*param, T(-1));
  rattn_context* ctx = nullptr;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  rattn_context_info info;
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_EQ(info.*reported, plan_value);
  rattn_context_free(ctx);
  p.*param = 0;
  ASSERT_EQ(rattn_context_create(&p, &ctx), RATTN_OK) << rattn_context_last_error(nullptr);
  ASSERT_EQ(rattn_context_get_info(ctx, &info), RATTN_OK);
  EXPECT_EQ(info.*reported, T(0));
  rattn_context_free(ctx);
  p.*param = T(-2);
  EXPECT_EQ(rattn_context_create(&p, &ctx), RATTN_INVALID_ARGUMENT);
  EXPECT_EQ(ctx, nullptr);
  EXPECT_NE(std::string(rattn_context_last_error(nullptr)).find(name), std::string::npos);
}

}  // namespace rattn::testing
