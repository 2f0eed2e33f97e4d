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

double time_engine_steps(const EngineStepSetup& setup, const GroupData& data, const std::string& state_path) {
  const int d = data.d, G = data.group;
  auto runtime = std::make_shared<const Runtime>(group_config(setup, G));
  std::unique_ptr<Sequence> seq = Sequence::load(runtime, state_path);
  const int warm = 8;
  const int64_t available = data.tokens - setup.prefix;
  const int steps = int(std::min<int64_t>(setup.steps + warm, available));
  if (steps <= warm) fail(Status::invalid_argument, "engine check: too few tokens after the prefix");
  std::vector<float> q(size_t(G) * size_t(d)), out(q.size());
  std::vector<double> us;
  for (int i = 0; i < steps; ++i) {
    const int64_t t = setup.prefix + i;
    for (int g = 0; g < G; ++g) std::copy_n(data.query(g, t), size_t(d), q.data() + size_t(g) * size_t(d));
    const float* k = data.keys.data() + size_t(t) * size_t(d);
    const float* v = data.values.data() + size_t(t) * size_t(d);
    flush_caches();
    const auto t0 = std::chrono::steady_clock::now();
    seq->decode(setup.layer, q.data(), k, v, DType::f32, out.data(), nullptr);
    const double took = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warm) us.push_back(took);
  }
  std::nth_element(us.begin(), us.begin() + std::ptrdiff_t(us.size() / 2), us.end());
  return us[us.size() / 2];
}

}  // namespace rattn
