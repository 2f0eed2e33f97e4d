// The build's training-query kNN, dispatched: the generated GPU kernel
// (codegen/cuda/gpu_knn.h) when the parameters and a GPU allow, else the
// CPU's cpu_training_knn (projected_graph_knn.cpp).
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/gpu_knn.h"
#include "core/clock.h"
#include "core/error.h"
#include "runtime/index/projected_graph.h"

namespace rattn::internal {

namespace {

// Below this many query-key pairs the CPU's GEMM finishes before the GPU's
// copies and module load pay off.
constexpr double kGpuMinPairs = 1 << 26;

// One loaded kernel per (head_dim, nq) for the process; null entries record
// "no GPU" so that it is asked once. Never destroyed: at exit the driver may
// already be tearing down, and the process's end frees the GPU's memory.
GpuKnn* gpu_knn(int dim, int nq, std::string* why_not) {
  static std::mutex mutex;
  static auto& loaded = *new std::map<std::pair<int, int>, std::pair<std::unique_ptr<GpuKnn>, std::string>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find({dim, nq});
  if (it == loaded.end()) {
    std::string why;
    std::unique_ptr<GpuKnn> g = GpuKnn::open(dim, nq, &why);
    it = loaded.emplace(std::make_pair(dim, nq), std::make_pair(std::move(g), why)).first;
  }
  if (!it->second.first && why_not) *why_not = it->second.second;
  return it->second.first.get();
}

bool kernel_covers(int dim, int nq) { return dim >= 1 && dim <= 512 && nq >= 1 && nq <= 256; }

}  // namespace

bool training_knn_on_gpu(const GraphBuildParams& p, int64_t num_keys, int64_t num_queries, int dim, int nq) {
  switch (p.knn_device) {
    case GraphBuildParams::KnnDevice::cpu: return false;
    case GraphBuildParams::KnnDevice::gpu: return true;
    case GraphBuildParams::KnnDevice::automatic: break;
  }
  if (!kernel_covers(dim, nq) || double(num_keys) * double(num_queries) < kGpuMinPairs) return false;
  return gpu_knn(dim, nq, nullptr) != nullptr;
}

std::vector<int32_t> training_knn(const RowsView& keys, const float* queries, const std::vector<int64_t>& picked,
                                  int nq, const GraphBuildParams& p, const std::function<void(double)>& step,
                                  KnnStats* stats) {
  const int64_t causal_offset = p.causal ? p.causal_key_offset : -1;
  const int64_t Q = int64_t(picked.size()), N = keys.rows;
  const int d = keys.dim;
  const double open_start = seconds_now();  // the first check opens the device (automatic)
  if (!training_knn_on_gpu(p, N, Q, d, nq))
    return cpu_training_knn(keys, queries, picked, nq, p, step, causal_offset, stats);
  if (!kernel_covers(d, nq))
    fail(Status::unsupported, "training_knn: the GPU kernel covers head_dim <= 512 and query_neighbors <= 256, not " +
                                  std::to_string(d) + " and " + std::to_string(nq));
  if (keys.dtype != DType::f32) fail(Status::internal, "training_knn: the build's keys must be fp32");
  std::string why;
  GpuKnn* gpu = gpu_knn(d, nq, &why);
  if (!gpu) fail(Status::unsupported, "training_knn: knn_device gpu, but no GPU: " + why);
  KnnStats gpu_stats = KnnStats::exact(Q);
  gpu_stats.gpu = true;
  gpu_stats.gpu_open_seconds = seconds_now() - open_start;
  // The picked queries packed, and each one's visible keys.
  std::vector<float> packed(size_t(Q) * size_t(d));
  std::vector<int32_t> limits;
  if (causal_offset >= 0) limits.resize(size_t(Q));
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t t = picked[size_t(i)];
    std::copy(queries + t * d, queries + (t + 1) * d, packed.begin() + i * d);
    if (causal_offset >= 0) limits[size_t(i)] = int32_t(std::clamp<int64_t>(t - causal_offset + 1, 0, N));
  }
  std::vector<int32_t> ids(size_t(Q) * size_t(nq));
  std::vector<float> scores(ids.size());
  try {
    GpuKnnTimes times;
    gpu->run(packed.data(), Q, static_cast<const float*>(keys.data), N, limits.empty() ? nullptr : limits.data(),
             ids.data(), scores.data(), &times);
    gpu_stats.gpu_upload_seconds = times.upload_seconds;
    gpu_stats.gpu_kernel_seconds = times.kernel_seconds;
    gpu_stats.gpu_download_seconds = times.download_seconds;
    for (int32_t id : ids)
      if (id < 0) fail(Status::invalid_argument, "training_knn: a training query sees fewer than query_neighbors keys");
  } catch (const Error&) {
    // Chosen automatically: a GPU that fails (its memory full in a host
    // engine, say) or lists it cannot fill leave the build to the CPU.
    if (p.knn_device != GraphBuildParams::KnnDevice::automatic) throw;
    return cpu_training_knn(keys, queries, picked, nq, p, step, causal_offset, stats);
  }
  if (stats) *stats = std::move(gpu_stats);
  if (step) step(1.0);
  return ids;
}

}  // namespace rattn::internal
