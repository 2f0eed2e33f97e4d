// Saving and loading a projected graph (IndexKind::projected_graph images).
#include <cmath>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "runtime/index/projected_graph_impl.h"
#include "runtime/index/serial.h"

namespace rattn::internal {
namespace {

// Image versions: 1 = first layout; 2 adds the insert parameters after the
// build parameters; 3 adds the key metric (GraphBuildParams::key_metric) the
// insert path uses; 4 the training queries' second moment; 5 the key mean of
// centred relations (GraphBuildParams::center_keys), which insert subtracts.
// All load (older images get the defaults: plain metric, uncentred insert).
constexpr uint32_t kGraphVersion = 5;

}  // namespace

void ProjectedGraph::serialize(std::string* out) const {
  ByteWriter w;
  w.put<int32_t>(M_);
  w.put<int32_t>(slots_);
  w.put<int32_t>(build_queue_);
  w.put<int32_t>(query_neighbors_);
  w.put<int32_t>(insert_queue_);
  w.put<int32_t>(insert_pivots_);
  w.put<int32_t>(insert_reverse_);
  w.put<int32_t>(insert_key_queue_);
  w.put_vec(metric_);
  w.put_vec(query_moment_);
  w.put_vec(key_mean_);
  w.put<int64_t>(size_);
  w.put<int64_t>(unreached_before_repair_);
  w.put<int64_t>(unreachable_);
  w.put_vec(entries_);
  w.put_vec(arena_);
  append_index_image(out, IndexKind::projected_graph, kGraphVersion, w.bytes());
}

std::unique_ptr<ProjectedGraph> ProjectedGraph::load(std::string_view payload, uint32_t version) {
  ByteReader r(payload);
  const int32_t M = r.get<int32_t>(), slots = r.get<int32_t>(), bq = r.get<int32_t>(), nq = r.get<int32_t>();
  if (M < 1 || slots < M || slots > 4096 || bq < 1 || bq > (1 << 20) || nq < 1 || nq > (1 << 20))
    fail(Status::corrupt_data, "projected graph image: bad parameters");
  auto g = std::make_unique<ProjectedGraph>(M, slots, bq, nq, nullptr);
  if (version >= 2) {
    const int32_t iq = r.get<int32_t>(), ip = r.get<int32_t>(), ir = r.get<int32_t>(), ik = r.get<int32_t>();
    if (iq < 1 || iq > (1 << 20) || ip < 1 || ip > (1 << 20) || ir < 0 || ir > (1 << 20) || ik < 0 || ik > (1 << 20))
      fail(Status::corrupt_data, "projected graph image: bad insert parameters");
    g->set_insert_params(iq, ip, ir, ik);
  }
  if (version >= 3) {
    g->metric_ = r.get_vec<float>(uint64_t(4096) * 4096);
    const auto side = uint64_t(std::llround(std::sqrt(double(g->metric_.size()))));
    if (side * side != g->metric_.size()) fail(Status::corrupt_data, "projected graph image: bad key metric size");
    for (float v : g->metric_)
      if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite key metric");
  }
  if (version >= 4) {
    g->query_moment_ = r.get_vec<float>(uint64_t(4096) * 4096);
    const auto side = uint64_t(std::llround(std::sqrt(double(g->query_moment_.size()))));
    if (side * side != g->query_moment_.size())
      fail(Status::corrupt_data, "projected graph image: bad query moment size");
    for (float v : g->query_moment_)
      if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite query moment");
  }
  if (version >= 5) {
    g->key_mean_ = r.get_vec<float>(4096);
    if (!g->key_mean_.empty() && !g->metric_.empty())
      fail(Status::corrupt_data, "projected graph image: both a key metric and a key mean");
    for (float v : g->key_mean_)
      if (!std::isfinite(v)) fail(Status::corrupt_data, "projected graph image: non-finite key mean");
  }
  g->size_ = r.get<int64_t>();
  g->unreached_before_repair_ = r.get<int64_t>();
  g->unreachable_ = r.get<int64_t>();
  g->entries_ = r.get_vec<int32_t>(1 << 20);
  g->arena_ = r.get_region<int32_t>(uint64_t(1) << 40);
  if (!r.at_end()) fail(Status::corrupt_data, "projected graph image: trailing bytes");
  if (g->arena_.size() % size_t(g->stride_) != 0) fail(Status::corrupt_data, "projected graph image: bad arena size");
  // Every id must point at a present node, so that search can never read
  // outside the arena or the key store.
  const int64_t n = g->nodes();
  int64_t present = 0;
  for (int64_t i = 0; i < n; ++i) present += g->node(i)[0] != kAbsent;
  if (present != g->size_) fail(Status::corrupt_data, "projected graph image: node count mismatch");
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* p = g->node(i);
    if (p[0] == kAbsent) continue;
    if (p[0] < 0 || p[0] > slots) fail(Status::corrupt_data, "projected graph image: bad degree");
    for (int j = 1; j <= p[0]; ++j)
      if (p[j] < 0 || p[j] >= n || g->node(p[j])[0] == kAbsent)
        fail(Status::corrupt_data, "projected graph image: neighbour id out of range");
  }
  if (g->entries_.empty() && n > 0) fail(Status::corrupt_data, "projected graph image: no entry point");
  for (int32_t e : g->entries_)
    if (e < 0 || e >= n || g->node(e)[0] == kAbsent) fail(Status::corrupt_data, "projected graph image: bad entry point");
  g->build_tree();
  return g;
}

std::unique_ptr<KeyIndex> load_projected_graph(std::string_view payload, uint32_t version) {
  if (version < 1 || version > kGraphVersion)
    fail(Status::corrupt_data, "projected graph image: unknown version " + std::to_string(version));
  return ProjectedGraph::load(payload, version);
}

}  // namespace rattn::internal
