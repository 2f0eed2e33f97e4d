#include "autotune/engine_check.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "runtime/runtime.h"

namespace rattn {
namespace {

RuntimeConfig group_config(const EngineStepSetup& s, int group) {
  RuntimeConfig c;
  c.layout = s.program->model;
  c.layout.num_kv_heads = 1;
  c.layout.num_q_heads = group;
  c.plan = default_concrete_plan(s.program->plan);
  c.kv_storage = s.program->model.kv_dtype;
  c.threads = s.threads;
  c.use_gpu = false;
  return c;
}

// Reads a buffer twice this machine's last-level cache (32 MiB if unknown):
// what a decode step finds after the rest of the model's layers ran.
void flush_caches() {
  static const std::vector<uint8_t> buffer = [] {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 <= 0) l3 = 32L << 20;
    return std::vector<uint8_t>(size_t(2 * l3), 1);
  }();
  volatile uint64_t sum = 0;
  uint64_t s = 0;
  for (size_t i = 0; i < buffer.size(); i += 64) s += buffer[i];
  sum = sum + s;
}

}  // namespace

void prefill_engine_state(const EngineStepSetup& setup, const GroupData& data, const std::string& state_path) {
  const int d = data.d, G = data.group;
  const int64_t n = setup.prefix;
  if (n <= 0 || n >= data.tokens) fail(Status::invalid_argument, "engine check: bad prefix");
  auto runtime = std::make_shared<const Runtime>(group_config(setup, G));
  Sequence seq(runtime);
  std::vector<float> q(size_t(G) * size_t(n) * size_t(d));
  for (int g = 0; g < G; ++g) std::copy_n(data.query(g, 0), size_t(n) * size_t(d), q.data() + size_t(g) * size_t(n) * size_t(d));
  seq.prefill(setup.layer, n, q.data(), data.keys.data(), data.values.data(), DType::f32);
  seq.save(state_path);
}

std::vector<double> time_engine_steps(const std::vector<EngineStepSetup>& setups, const GroupData& data,
                                      const std::vector<std::string>& state_paths) {
  if (setups.empty() || setups.size() != state_paths.size())
    fail(Status::invalid_argument, "engine check: one state per setup");
  const int d = data.d, G = data.group;
  const EngineStepSetup& first = setups.front();
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (size_t i = 0; i < setups.size(); ++i) {
    if (setups[i].layer != first.layer || setups[i].prefix != first.prefix || setups[i].steps != first.steps)
      fail(Status::invalid_argument, "engine check: interleaved setups must share the layer, prefix and steps");
    seqs.push_back(Sequence::load(std::make_shared<const Runtime>(group_config(setups[i], G)), state_paths[i]));
  }
  const int warm = 8;
  const int64_t available = data.tokens - first.prefix;
  const int steps = int(std::min<int64_t>(first.steps + warm, available));
  if (steps <= warm) fail(Status::invalid_argument, "engine check: too few tokens after the prefix");
  std::vector<float> q(size_t(G) * size_t(d)), out(q.size());
  std::vector<std::vector<double>> us(setups.size());
  for (int i = 0; i < steps; ++i) {
    const int64_t t = first.prefix + i;
    for (int g = 0; g < G; ++g) std::copy_n(data.query(g, t), size_t(d), q.data() + size_t(g) * size_t(d));
    const float* k = data.keys.data() + size_t(t) * size_t(d);
    const float* v = data.values.data() + size_t(t) * size_t(d);
    for (size_t s = 0; s < seqs.size(); ++s) {
      flush_caches();
      const auto t0 = std::chrono::steady_clock::now();
      seqs[s]->decode(first.layer, q.data(), k, v, DType::f32, out.data(), nullptr);
      const double took = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= warm) us[s].push_back(took);
    }
  }
  std::vector<double> median(setups.size());
  for (size_t s = 0; s < us.size(); ++s) {
    std::nth_element(us[s].begin(), us[s].begin() + std::ptrdiff_t(us[s].size() / 2), us[s].end());
    median[s] = us[s][us[s].size() / 2];
  }
  return median;
}

}  // namespace rattn
