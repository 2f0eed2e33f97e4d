// The tail estimate of a decode step (plan.tail_samples): the strided
// sample of offloaded rows, and the group's partials over the sample less
// each head's top-k (runtime.h documents both).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/hash.h"
#include "runtime/index/distance.h"
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

namespace {
enum : uint8_t { kBelow = 0, kRetrieved = 1, kAbove = 2 };
}

void tail_piece(CpuKernels& kernels, const float* queries, int heads, const RowsView& keys, const RowsView& values,
                const int32_t* sample, int n, const TailHits* hits, TailPiece& piece) {
  const int d = keys.dim;
  const size_t G = size_t(heads), m = size_t(std::max(n, 0));
  piece.mark.assign(G * m, kBelow);
  piece.below_out.assign(G * size_t(d), 0.0f);
  piece.above_out.assign(G * size_t(d), 0.0f);
  piece.below_lse.assign(G, -std::numeric_limits<float>::infinity());
  piece.above_lse.assign(G, -std::numeric_limits<float>::infinity());
  piece.n_below.assign(G, 0);
  piece.n_above.assign(G, 0);
  if (m == 0) return;
  // Each head's top-k rows in this piece (the sample is ascending).
  for (size_t g = 0; g < G; ++g)
    for (int i = 0; i < hits[g].n; ++i) {
      const int32_t* at = std::lower_bound(sample, sample + n, hits[g].ids[i]);
      if (at != sample + n && *at == hits[g].ids[i]) piece.mark[g * m + size_t(at - sample)] = kRetrieved;
    }
  std::vector<float>& weakest = piece.weakest;
  weakest.assign(G, std::numeric_limits<float>::infinity());  // no scores: nothing counts as above
  bool scored = false;
  for (size_t g = 0; g < G; ++g)
    if (hits[g].scores && hits[g].n > 0) {
      weakest[g] = *std::min_element(hits[g].scores, hits[g].scores + hits[g].n);
      scored = true;
    }
  // Chunk by chunk: each chunk's keys are scored for every head in one pass
  // and, still in cache, its rows below every head's top-k go into one
  // partial of the whole group (its K/V read from memory once); each head's
  // other rows are collected for small partials after. The chunk's rows are
  // requested first: strided rows escape the hardware prefetchers (15% of a
  // cold chunk's time, docs/notes/2026-11-26-group-tail-estimate.md).
  const size_t row_bytes = size_t(d) * (dtype_size(keys.dtype) + dtype_size(values.dtype));
  const size_t chunk = std::max<size_t>(64, size_t(kTailChunkBytes) / row_bytes);
  piece.dots.resize(G * chunk);
  piece.chunk_out.resize(G * size_t(d));
  piece.chunk_lse.resize(G);
  piece.extra.resize(G);
  piece.above.resize(G);
  for (size_t g = 0; g < G; ++g) {
    piece.extra[g].clear();
    piece.above[g].clear();
  }
  for (size_t c0 = 0; c0 < m; c0 += chunk) {
    const size_t c1 = std::min(m, c0 + chunk), cn = c1 - c0;
    for (size_t i = c0; i < c1; ++i) {
      prefetch_row(keys, sample[i]);
      prefetch_row(values, sample[i]);
    }
    if (scored) kernels.gathered_dot(queries, heads, keys, sample + c0, int(cn), piece.dots.data());
    piece.common.clear();
    for (size_t i = c0; i < c1; ++i) {
      bool common = true;
      for (size_t g = 0; g < G; ++g) {
        uint8_t& mk = piece.mark[g * m + i];
        if (mk == kBelow && piece.dots[g * cn + (i - c0)] > weakest[g]) mk = kAbove;
        common = common && mk == kBelow;
      }
      if (common) {
        piece.common.push_back(sample[i]);
        continue;
      }
      for (size_t g = 0; g < G; ++g) {
        const uint8_t mk = piece.mark[g * m + i];
        if (mk == kBelow) piece.extra[g].push_back(sample[i]);
        else if (mk == kAbove) piece.above[g].push_back(sample[i]);
      }
    }
    for (size_t g = 0; g < G; ++g) piece.n_below[g] += int64_t(piece.common.size());
    if (piece.common.empty()) continue;
    kernels.partial_attention(queries, heads, keys, values, piece.common.data(), int(piece.common.size()),
                              piece.chunk_out.data(), piece.chunk_lse.data());
    merge_partials_ln(piece.below_out.data(), piece.below_lse.data(), piece.chunk_out.data(), piece.chunk_lse.data(),
                      heads, d);
  }
  for (size_t g = 0; g < G; ++g) {
    const float* q = queries + g * size_t(d);
    piece.n_below[g] += int64_t(piece.extra[g].size());
    piece.n_above[g] = int64_t(piece.above[g].size());
    if (!piece.extra[g].empty()) {
      kernels.partial_attention(q, 1, keys, values, piece.extra[g].data(), int(piece.extra[g].size()),
                                piece.chunk_out.data(), piece.chunk_lse.data());
      merge_partials_ln(piece.below_out.data() + g * size_t(d), &piece.below_lse[g], piece.chunk_out.data(),
                        piece.chunk_lse.data(), 1, d);
    }
    if (!piece.above[g].empty())
      kernels.partial_attention(q, 1, keys, values, piece.above[g].data(), int(piece.above[g].size()),
                                piece.above_out.data() + g * size_t(d), &piece.above_lse[g]);
  }
}

void tail_finish(const TailPiece* pieces, int n_pieces, int heads, int d, int64_t rows, const TailHits* hits,
                 float* out, float* lse) {
  for (int g = 0; g < heads; ++g) {
    float* o = out + size_t(g) * size_t(d);
    std::fill(o, o + d, 0.0f);
    lse[g] = -std::numeric_limits<float>::infinity();
    int64_t n_below = 0, n_above = 0;
    for (int p = 0; p < n_pieces; ++p) {
      const TailPiece& piece = pieces[p];
      merge_partials_ln(o, &lse[g], piece.below_out.data() + size_t(g) * size_t(d), &piece.below_lse[size_t(g)], 1, d);
      n_below += piece.n_below[size_t(g)];
      n_above += piece.n_above[size_t(g)];
    }
    // The rows below stand for every unretrieved row not seen above; they
    // are distinct from the retrieved and the above ones, so unseen >= n_below.
    const int64_t unseen = rows - int64_t(hits[g].n) - n_above;
    if (n_below > 0) lse[g] += float(std::log(double(unseen) / double(n_below)));
    for (int p = 0; p < n_pieces; ++p)  // the rows above count once
      merge_partials_ln(o, &lse[g], pieces[p].above_out.data() + size_t(g) * size_t(d), &pieces[p].above_lse[size_t(g)],
                        1, d);
  }
}

}  // namespace rattn::internal
