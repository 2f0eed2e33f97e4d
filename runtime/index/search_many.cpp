// search_many(): the generic path, one search after another.
#include "runtime/index/key_index.h"

namespace rattn {

void search_many(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params) {
  for (int i = 0; i < n; ++i) jobs[i].index->search(jobs[i].query, keys, params, *jobs[i].scratch, *jobs[i].out);
}

}  // namespace rattn
