// The projected graph's public functions (runtime/index/projected_graph.h)
// and its diagnostics. The class lives in projected_graph_impl.h.
#include "runtime/index/projected_graph.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "core/rope.h"
#include "runtime/index/projected_graph_impl.h"

namespace rattn {
namespace internal {

size_t ProjectedGraph::memory_bytes() const {
  return (arena_.capacity() + entries_.capacity() + parent_.capacity() + metric_.capacity() + weakest_.capacity()) *
             sizeof(int32_t) +
         own_codes_.memory_bytes() + projected_code_bytes() +
         (query_moment_.capacity() + key_mean_.capacity()) * sizeof(float) +
         sizeof(*this);  // shared codes: their owner counts them
}

size_t ProjectedGraph::projected_code_bytes() const {
  std::lock_guard<std::mutex> lock(codes_mutex_);
  size_t b = 0;
  for (const auto& [shape, pc] : projected_codes_) b += pc->memory_bytes();
  return b;
}

GraphInfo ProjectedGraph::info() const {
  GraphInfo gi;
  gi.nodes = size_;
  gi.degree = M_;
  gi.slots = slots_;
  int64_t edges = 0;
  for (int64_t i = 0; i < nodes(); ++i) edges += std::max(0, node(i)[0]);
  gi.mean_degree = size_ ? double(edges) / double(size_) : 0.0;
  gi.unreached_before_repair = unreached_before_repair_;
  gi.unreachable = count_unreachable();
  gi.adjacency_bytes = arena_.size() * sizeof(int32_t);
  gi.code_bytes = traversal_codes().memory_bytes() + projected_code_bytes();
  gi.inserts = inserts_;
  gi.refresh_queries = refresh_queries_;
  gi.refresh_edges_offered = refresh_edges_;
  gi.key_alignment = key_alignment_;
  gi.training_queries = training_queries_;
  gi.knn_partitions = knn_stats_.partitions;
  gi.knn_scanned_fraction = knn_stats_.scanned_fraction;
  gi.knn_partition_seconds = knn_stats_.partition_seconds;
  gi.knn_probe_seconds = knn_stats_.probe_seconds;
  gi.knn_scan_seconds = knn_stats_.scan_seconds;
  gi.knn_on_gpu = knn_stats_.gpu;
  gi.knn_gpu_open_seconds = knn_stats_.gpu_open_seconds;
  gi.knn_gpu_upload_seconds = knn_stats_.gpu_upload_seconds;
  gi.knn_gpu_kernel_seconds = knn_stats_.gpu_kernel_seconds;
  gi.knn_gpu_download_seconds = knn_stats_.gpu_download_seconds;
  gi.shifted_queries = shifted_queries_;
  gi.key_metric = key_metric_used_;
  gi.insert_keys_scored = insert_scored_;
  gi.build_phases = build_phases_;
  gi.entry_points = int(entries_.size());
  gi.insert_queue = insert_queue_;
  gi.insert_pivots = insert_pivots_;
  gi.insert_reverse = insert_reverse_;
  gi.insert_key_queue = insert_key_queue_;
  return gi;
}

std::vector<int32_t> ProjectedGraph::neighbors(int32_t id) const {
  if (id < 0 || id >= nodes() || node(id)[0] == kAbsent)
    fail(Status::invalid_argument, "projected graph: id " + std::to_string(id) + " is not in the index");
  const int32_t* nbr = node(id);
  return std::vector<int32_t>(nbr + 1, nbr + 1 + nbr[0]);
}

// Distinct keys among the entry points, `ids` and the ids' neighbour lists.
int64_t ProjectedGraph::expansion_footprint(const int32_t* ids, int n) const {
  std::vector<uint8_t> seen(size_t(nodes()), 0);
  int64_t count = 0;
  auto mark = [&](int32_t id) {
    if (!seen[size_t(id)]) {
      seen[size_t(id)] = 1;
      ++count;
    }
  };
  for (int32_t e : entries_) mark(e);
  for (int i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= nodes() || node(ids[i])[0] == kAbsent)
      fail(Status::invalid_argument, "expansion_footprint: id " + std::to_string(ids[i]) + " is not in the index");
    mark(ids[i]);
    const int32_t* nbr = node(ids[i]);
    for (int j = 1; j <= nbr[0]; ++j) mark(nbr[j]);
  }
  return count;
}

std::vector<float> rope_shifted_queries(const float* queries, int64_t num_queries, int dim,
                                        const GraphBuildParams& p) {
  std::vector<float> out;
  const int64_t n = std::min<int64_t>(p.shift_queries, num_queries);
  if (n <= 0 || dim < 2) return out;
  const int shifts[4] = {p.shift_span / 8, p.shift_span / 4, p.shift_span / 2, p.shift_span};
  out.resize(size_t(4 * n) * size_t(dim));
  float* o = out.data();
  for (int shift : shifts) {
    const RopeAngles angles(dim, double(shift), p.rope_base);
    for (int64_t t = num_queries - n; t < num_queries; ++t, o += dim)
      angles.rotate(queries + size_t(t) * size_t(dim), o, p.rope_interleaved);
  }
  return out;
}

}  // namespace internal

namespace {
// `queries` [n, dim] followed by their RoPE-shifted copies
// (internal::rope_shifted_queries); `who` names the caller in the errors on
// shift parameters RoPE cannot take.
std::vector<float> with_shifted_copies(const float* queries, int64_t n, int dim, const GraphBuildParams& p,
                                       const char* who) {
  const auto bad = [who](const std::string& m) { fail(Status::invalid_argument, std::string(who) + ": " + m); };
  if (p.shift_queries < 0) bad("shift_queries must be >= 0");
  if (p.shift_queries > 0) {
    if (p.shift_span < 8) bad("shift_span must be >= 8");
    if (!(p.rope_base > 1.0)) bad("rope_base must be > 1");
    if (dim % 2 != 0) bad("RoPE-shifted queries need an even head dimension");
  }
  const std::vector<float> extra = internal::rope_shifted_queries(queries, n, dim, p);
  std::vector<float> out;
  out.reserve(size_t(n) * size_t(dim) + extra.size());
  out.assign(queries, queries + size_t(n) * size_t(dim));
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}
}  // namespace

std::unique_ptr<KeyIndex> build_projected_graph(const RowsView& keys, const float* train_queries, int64_t num_queries,
                                                const GraphBuildParams& p, std::shared_ptr<CpuKernels> kernels,
                                                const ProgressFn& progress) {
  const auto bad = [](const std::string& m) { fail(Status::invalid_argument, "build_projected_graph: " + m); };
  if (!keys.data || keys.rows < 1 || keys.dim < 1) bad("no keys");
  if (keys.rows > std::numeric_limits<int32_t>::max()) bad("more than 2^31 keys");
  if (keys.dtype != DType::f32 && keys.dtype != DType::f16 && keys.dtype != DType::bf16) bad("unknown key dtype");
  if (num_queries < 0 || (num_queries > 0 && !train_queries)) bad("bad training queries");
  if (p.degree < 2 || p.degree > 1024) bad("degree must be in [2, 1024]");
  if (p.query_neighbors < 2) bad("query_neighbors must be >= 2");
  if (!(p.sample_fraction > 0.0 && p.sample_fraction <= 1.0)) bad("sample_fraction must be in (0, 1]");
  if (!(p.repair_fraction >= 0.0 && p.repair_fraction <= 1.0)) bad("repair_fraction must be in [0, 1]");
  if (p.repair_max_queries < 0) bad("repair_max_queries must be >= 0");
  if (p.key_metric < 0 || p.key_metric > 2) bad("key_metric must be 0, 1 or 2");
  if (p.causal_key_offset < 0) bad("causal_key_offset must be >= 0");
  if (!(p.key_metric_ridge > 0.0) || p.key_metric_passes < 0 || p.key_metric_passes > 7)
    bad("key_metric_ridge must be > 0 and key_metric_passes in [0, 7]");
  if (p.build_queue < 1 || p.threads < 1 || p.pivot_capacity < 1 || p.extra_slots < 0 || p.entry_points < 1)
    bad("build_queue, threads, pivot_capacity and entry_points must be >= 1, extra_slots >= 0");
  internal::check_insert_params(p, "build_projected_graph");
  if (p.knn_cluster_keys < 0 || p.knn_probes < 0 || p.knn_iterations < 0 || p.knn_min_keys < 0)
    bad("knn_cluster_keys, knn_probes, knn_iterations and knn_min_keys must be >= 0");
  if (p.shift_queries < 0) bad("shift_queries must be >= 0");
  if (p.causal && p.shift_queries > 0 && num_queries > 0) bad("shift_queries does not combine with causal training lists");
  // The build never trusts its data: a NaN score has no rank, and an
  // unranked top-k list would index outside the graph.
  if (const int64_t at = first_out_of_range(keys.dtype, keys.data, size_t(keys.rows) * size_t(keys.dim), DType::f32);
      at >= 0)
    bad("key " + std::to_string(at / keys.dim) + ", element " + std::to_string(at % keys.dim) + ": " +
        describe_out_of_range(keys.dtype, keys.data, size_t(at), DType::f32));
  if (num_queries > 0)
    if (const int64_t at = first_out_of_range(train_queries, size_t(num_queries) * size_t(keys.dim)); at >= 0)
      bad("training query " + std::to_string(at / keys.dim) + ", element " + std::to_string(at % keys.dim) + ": " +
          describe_out_of_range(DType::f32, train_queries, size_t(at), DType::f32));
  std::vector<float> train;
  const int64_t original_queries = num_queries;
  if (p.shift_queries > 0 && num_queries > 0) {
    train = with_shifted_copies(train_queries, num_queries, keys.dim, p, "build_projected_graph");
    train_queries = train.data();
    num_queries = int64_t(train.size() / size_t(keys.dim));
  }
  auto g = std::make_unique<internal::ProjectedGraph>(p.degree, p.degree + p.extra_slots, p.build_queue,
                                                      p.query_neighbors, std::move(kernels));
  g->set_insert_params(p.insert_queue, p.insert_pivots, p.insert_reverse, p.insert_key_queue);
  g->build(keys, train_queries, num_queries, p, progress);
  g->set_shifted_queries(num_queries - original_queries);
  return g;
}

bool is_projected_graph(const KeyIndex& index) {
  return dynamic_cast<const internal::ProjectedGraph*>(&index) != nullptr;
}

void refresh_projected_graph(KeyIndex& index, const RowsView& keys, const float* queries, int64_t num_queries,
                             const GraphBuildParams& p) {
  auto* g = dynamic_cast<internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "refresh_projected_graph: not a projected graph index");
  if (num_queries < 0 || (num_queries > 0 && !queries))
    fail(Status::invalid_argument, "refresh_projected_graph: needs num_queries >= 0 query rows");
  if (keys.dim < 1) fail(Status::invalid_argument, "refresh_projected_graph: no key dimension");
  g->refresh(keys, with_shifted_copies(queries, num_queries, keys.dim, p, "refresh_projected_graph"), p);
}

void set_insert_params(KeyIndex& index, const GraphBuildParams& p) {
  auto* g = dynamic_cast<internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "set_insert_params: not a projected graph index");
  internal::check_insert_params(p, "set_insert_params");
  g->set_insert_params(p.insert_queue, p.insert_pivots, p.insert_reverse, p.insert_key_queue);
}

GraphInfo projected_graph_info(const KeyIndex& index) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_info: not a projected graph index");
  return g->info();
}

int64_t projected_graph_insert_keys_scored(const KeyIndex& index) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  return g ? g->insert_keys_scored() : -1;
}

std::vector<int32_t> projected_graph_neighbors(const KeyIndex& index, int32_t id) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_neighbors: not a projected graph index");
  return g->neighbors(id);
}

std::vector<int32_t> projected_graph_entries(const KeyIndex& index) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "projected_graph_entries: not a projected graph index");
  return g->entries();
}

int64_t expansion_footprint(const KeyIndex& index, const int32_t* ids, int n) {
  const auto* g = dynamic_cast<const internal::ProjectedGraph*>(&index);
  if (!g) fail(Status::invalid_argument, "expansion_footprint: not a projected graph index");
  if (n < 0 || (n > 0 && !ids)) fail(Status::invalid_argument, "expansion_footprint: bad id list");
  return g->expansion_footprint(ids, n);
}

}  // namespace rattn

