#pragma once
// The projected graph's search_many(): several beam searches interleaved on
// the calling thread (runtime/index/search_many.cpp dispatches here).
#include "runtime/index/key_index.h"

namespace rattn::internal {

// Runs the jobs as interleaved step machines when every job's index is a
// projected graph and the scratches are distinct; returns false (nothing
// done) otherwise. Results equal separate search() calls exactly.
bool search_many_projected(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params);

}  // namespace rattn::internal
