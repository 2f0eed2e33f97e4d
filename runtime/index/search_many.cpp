// search_many(): projected graphs interleave their searches on this thread
// (graph_search.h); any other index runs one search after another.
#include <string>

#include "core/error.h"
#include "runtime/index/graph_search.h"
#include "runtime/index/key_index.h"

namespace rattn {

void search_many(const SearchJob* jobs, int n, const RowsView& keys, const SearchParams& params) {
  if (n < 0 || (n > 0 && !jobs)) fail(Status::invalid_argument, "search_many: bad job list");
  for (int i = 0; i < n; ++i) {
    if (!jobs[i].index || !jobs[i].query || !jobs[i].scratch || !jobs[i].out)
      fail(Status::invalid_argument, "search_many: job " + std::to_string(i) + " lacks an index, query, scratch or result");
    if (jobs[i].num_seeds < 0 || (jobs[i].num_seeds > 0 && !jobs[i].seeds))
      fail(Status::invalid_argument, "search_many: job " + std::to_string(i) + " has a bad seed list");
  }
  if (n > 1 && internal::search_many_projected(jobs, n, keys, params)) return;
  for (int i = 0; i < n; ++i)
    jobs[i].index->search(jobs[i].query, keys, internal::job_params(params, jobs[i]), *jobs[i].scratch, *jobs[i].out);
}

}  // namespace rattn
