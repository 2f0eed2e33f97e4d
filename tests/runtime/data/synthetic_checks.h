#pragma once
// Checks shared by the tests of the synthetic generators (SyntheticSpec,
// DocumentSpec): a spec of a given shape, and determinism by seed.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>

#include "runtime/data/synthetic.h"

namespace rattn {

// The default spec with this shape (seed 1).
template <class Spec>
Spec spec_of(int64_t tokens, int head_dim, int group) {
  Spec s;
  s.tokens = tokens;
  s.head_dim = head_dim;
  s.group = group;
  return s;
}

// make(spec) twice gives the same keys, queries and values, of the spec's
// shape, and the next seed other keys. Returns the first head.
template <class Spec, class Make>
SyntheticHead expect_deterministic_by_seed(Spec spec, Make make) {
  const SyntheticHead a = make(spec), b = make(spec);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.queries, b.queries);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.keys.size(), size_t(spec.tokens) * size_t(spec.head_dim));
  EXPECT_EQ(a.queries.size(), size_t(spec.group) * size_t(spec.tokens) * size_t(spec.head_dim));
  ++spec.seed;
  EXPECT_NE(make(spec).keys, a.keys);
  return a;
}

}  // namespace rattn
