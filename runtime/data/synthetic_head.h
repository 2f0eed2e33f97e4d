#pragma once
// The generators' common start: the shape checked, and a SyntheticHead
// allocated for it (keys and values [T, d], queries [group, T, d]).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "runtime/data/synthetic.h"

namespace rattn::data {

// Error(invalid_argument), prefixed with `who`, unless tokens >= 1, group >= 1
// and head_dim is a multiple of 4 and >= min_dim.
inline void check_head_shape(const std::string& who, int64_t tokens, int head_dim, int min_dim, int group) {
  if (tokens < 1) fail(Status::invalid_argument, who + ": tokens must be >= 1");
  if (head_dim < min_dim || head_dim % 4 != 0)
    fail(Status::invalid_argument, who + ": head_dim must be a multiple of 4 and >= " + std::to_string(min_dim));
  if (group < 1) fail(Status::invalid_argument, who + ": group must be >= 1");
}

// A head of this shape, zero-filled.
inline SyntheticHead allocate_head(int64_t tokens, int head_dim, int group) {
  SyntheticHead out;
  out.tokens = tokens;
  out.head_dim = head_dim;
  out.group = group;
  out.keys.resize(size_t(tokens) * size_t(head_dim));
  out.values.resize(size_t(tokens) * size_t(head_dim));
  out.queries.resize(size_t(group) * size_t(tokens) * size_t(head_dim));
  return out;
}

}  // namespace rattn::data
