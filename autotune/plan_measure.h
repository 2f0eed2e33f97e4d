#pragma once
// Internal to the plan tuner: the measurements behind one tuning run (a
// sampled layer's searches and output errors, the CPU kernels' times, the
// GPU's static set) and their JSON form in the tuning database.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "autotune/plan_tuner.h"
#include "core/dtype.h"
#include "runtime/data/calib.h"
#include "runtime/index/key_index.h"

namespace rattn {

// The paper's static set and top-k (RetrievalAttention, arXiv 2409.10516):
// the baseline the tuner measures beside its choice.
inline constexpr int64_t kPaperWindow = 512;
inline constexpr int kPaperTopK = 100;

// Windows whose indexes would differ in size by at most this share share
// the larger one (a few percent more keys scores a little more: the
// estimate errs slow); each other size is built and swept on its own.
inline constexpr double kIndexShareTolerance = 0.15;

// Window -> the keys its index holds out of `keys` before the test queries:
// keys - window + 1, at least max(4 top_k, keys / 4), shared per
// kIndexShareTolerance (ascending windows share the previous size).
std::map<int64_t, int64_t> index_keys_per_window(int64_t keys, const std::vector<int64_t>& windows, int top_k);

struct MeasureInputs {
  const Program* program = nullptr;
  bool synthetic = false;
  std::string distribution = "topics";  // synthetic generator: topics or documents
  uint64_t seed = 1;
  std::string calib_dir;
  CalibManifest manifest;
  std::string set_name;  // with several calibration sets, this one's name (progress lines)
  int64_t context = 0;
  int threads = 2;
  double min_recall = 0.95;
  int recall_k = 0;  // recall@min(top_k, recall_k); 0: recall@top_k
  double confidence = 0.95;
  int test_queries = 256;
  int q_heads = 0;  // query heads of the group measured; 0: all
  double holdout = 0.5;
  int holdout_block = 32;
  int64_t sinks = 128;
  std::vector<int64_t> windows;  // output errors are measured for each window x tail
  std::vector<int64_t> tails{0};  // tail_samples (0: none)
  uint64_t tail_seed = 1;         // the runtime's (RuntimeConfig::seed default)
  std::vector<int> top_ks;
};

// One KV head and its query heads over the context, K and V rounded to the
// model's storage dtype (what the runtime stores and attends).
struct GroupData {
  int64_t tokens = 0;
  int d = 0, group = 0;
  DType dtype = DType::f32;
  std::vector<float> keys, values;  // [T, d], rounded
  std::vector<uint16_t> keys_stored;  // [T, d] in dtype when it is 16-bit
  std::vector<float> queries;       // [group, T, d]
  const float* query(int g, int64_t t) const { return queries.data() + (size_t(g) * size_t(tokens) + size_t(t)) * size_t(d); }
  RowsView rounded_keys() const { return RowsView{keys.data(), DType::f32, tokens, d}; }
  RowsView key_rows(int64_t rows) const {
    return dtype == DType::f32 ? RowsView{keys.data(), DType::f32, rows, d} : RowsView{keys_stored.data(), dtype, rows, d};
  }
};

// `layer`'s KV head `kv` and its query heads over in.context tokens: the
// synthetic generator's (seeded by layer and head) or the calibration data's.
GroupData load_group(const MeasureInputs& in, int layer, int kv);

// One insertion into `index`: the tokens from `from` on (head 0's queries),
// timed after a few untimed ones (an index's first growth is a one-off);
// microseconds per token. `m`: tokens past `from` the data holds. rounds >
// 1: the median of that many runs of consecutive tokens (a preempted run
// does not move it).
double time_insertion(KeyIndex& index, const GroupData& data, int64_t from, int m, int rounds = 1);

// One sampled layer and KV head: its query heads' indexes built as the
// plan's defaults say over the context's keys before the test queries;
// per top_k every decode search of the layer's grid along ascending queues
// up to the first that meets min_recall on the tuning queries; the output
// error of each setting that met, for each window; the baseline's sweep;
// one insertion's time.
// `step(units, now)` reports progress: the units of one call add up to 1.
LayerSample measure_layer_sample(const MeasureInputs& in, int layer, int kv_head,
                                 const std::function<void(double, const std::string&)>& step);

// Halide kernels of the model's kernel set, timed on this machine (one
// thread, medians): partial attention of one query head over n gathered
// rows of a large table, dense attention of a GQA group over n rows, one
// query head's tail estimate over n sampled rows.
// `halide_knobs`: the plan's "halide.*" kernel keys (HalideSchedule::from_kernel_map).
KernelTimes measure_kernel_times(const ModelLayout& model, const std::vector<int64_t>& gathered_rows,
                                 const std::vector<int64_t>& dense_rows, const std::vector<int64_t>& tail_rows = {},
                                 const std::map<std::string, double>& halide_knobs = {});

// The static set's attention on the GPU present (codegen/cuda), one
// decode step of one layer, per window and kernel variant (plan cuda.*
// knobs; without cuda.splits the runtime's static_set_splits): rows ->
// microseconds per variant, NaN where the generator refuses a variant.
std::map<int64_t, std::vector<double>> measure_gpu_static_set(
    const ModelLayout& model, int64_t sinks, const std::vector<int64_t>& windows,
    const std::vector<std::map<std::string, double>>& variants, const std::function<void(const std::string&)>& say);

boost::json::value layer_sample_to_json(const LayerSample& s);
LayerSample layer_sample_from_json(const boost::json::value& v);
boost::json::value kernel_times_to_json(const KernelTimes& k);
KernelTimes kernel_times_from_json(const boost::json::value& v);

}  // namespace rattn
