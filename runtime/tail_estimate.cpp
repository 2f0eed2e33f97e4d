// The tail estimate of a decode step (plan.tail_samples): the strided
// sample of offloaded rows, and one query head's partial over the sample
// less its top-k (runtime.h documents both).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/hash.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"

namespace rattn::internal {

void draw_tail_sample(uint64_t seed, int layer, int kv_head, int64_t position, int64_t rows, int64_t samples,
                      std::vector<int32_t>& ids) {
  ids.clear();
  if (rows <= 0 || samples <= 0) return;
  if (samples >= rows) {
    ids.resize(size_t(rows));
    for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t(r);
    return;
  }
  uint64_t h = mix64(seed + kGoldenGamma);
  h = mix64((h ^ uint64_t(uint32_t(layer))) + kGoldenGamma);
  h = mix64((h ^ uint64_t(uint32_t(kv_head))) + kGoldenGamma);
  h = mix64((h ^ uint64_t(position)) + kGoldenGamma);
  const double stride = double(rows) / double(samples);  // > 1: rows are distinct and ascending
  const double offset = double(h >> 11) * 0x1p-53 * stride;
  ids.resize(size_t(samples));
  for (int64_t i = 0; i < samples; ++i)
    ids[size_t(i)] = int32_t(std::min<int64_t>(int64_t(offset + double(i) * stride), rows - 1));
}

void tail_partial(CpuKernels& kernels, const float* query, const RowsView& keys, const RowsView& values,
                  int64_t rows, const std::vector<int32_t>& sample, const int32_t* retrieved,
                  const float* retrieved_scores, int n_retrieved, TailScratch& scratch, float* out, float* lse) {
  scratch.sorted.assign(retrieved, retrieved + n_retrieved);
  std::sort(scratch.sorted.begin(), scratch.sorted.end());
  scratch.ids.resize(sample.size());
  const auto end = std::set_difference(sample.begin(), sample.end(), scratch.sorted.begin(), scratch.sorted.end(),
                                       scratch.ids.begin());
  int n_below = int(end - scratch.ids.begin());
  scratch.above.clear();
  if (retrieved_scores && n_retrieved > 0 && n_below > 0) {
    const float weakest = *std::min_element(retrieved_scores, retrieved_scores + n_retrieved);
    scratch.dots.resize(size_t(n_below));
    kernels.gathered_dot(query, 1, keys, scratch.ids.data(), n_below, scratch.dots.data());
    int kept = 0;
    for (int i = 0; i < n_below; ++i) {
      const int32_t id = scratch.ids[size_t(i)];
      if (scratch.dots[size_t(i)] > weakest) scratch.above.push_back(id);
      else scratch.ids[size_t(kept++)] = id;
    }
    n_below = kept;
  }
  // n_below == 0 gives out = 0, lse = -inf. The rows below are distinct from
  // the retrieved and the above ones, so unseen >= n_below.
  kernels.partial_attention(query, 1, keys, values, scratch.ids.data(), n_below, out, lse);
  const int64_t unseen = rows - int64_t(n_retrieved) - int64_t(scratch.above.size());
  if (n_below > 0) *lse += float(std::log(double(unseen) / double(n_below)));
  if (!scratch.above.empty()) {
    const int d = keys.dim;
    scratch.above_out.resize(size_t(d));
    float above_lse;
    kernels.partial_attention(query, 1, keys, values, scratch.above.data(), int(scratch.above.size()),
                              scratch.above_out.data(), &above_lse);
    merge_partials_ln(out, lse, scratch.above_out.data(), &above_lse, 1, d);
  }
}

}  // namespace rattn::internal
