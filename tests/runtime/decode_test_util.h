#pragma once
// Shared pieces of the runtime tests that drive rattn::Sequence directly:
// a small model through the C++ API, a prefill and a decode run, and a
// stand-in GPU backend that runs on any machine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "codegen/cuda/gpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu_kernels.h"
#include "runtime/runtime.h"
#include "tests/runtime/test_util.h"

namespace rattn::testing {

// A small model through the C++ API (the knobs the C API does not expose).
inline rattn::RuntimeConfig cpp_config(int hq, int hkv, int d, int sinks, int window) {
  rattn::RuntimeConfig c;
  c.layout.name = "test";
  c.layout.num_layers = 1;
  c.layout.num_q_heads = hq;
  c.layout.num_kv_heads = hkv;
  c.layout.head_dim = d;
  c.layout.layers.assign(1, rattn::LayerSpec{});
  c.plan.sinks = sinks;
  c.plan.window = window;
  c.plan.top_k = 20;
  c.plan.search_queue = 32;
  c.plan.graph_degree = 16;
  c.plan.query_neighbors = 20;
  c.plan.build_sample = 0.5;
  c.kv_storage = rattn::DType::f16;
  c.kernels = rattn::KernelPreference::reference;
  c.threads = 1;
  c.use_gpu = false;
  return c;
}

inline std::string temp_path(const char* what) {
  return ::testing::TempDir() + "rattn-decode-" + what + "-" + std::to_string(::getpid()) + ".seq";
}

// Expects `call` to throw Error(invalid_argument) whose message holds `needle`.
inline void expect_refused(const std::function<void()>& call, const char* needle) {
  try {
    call();
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const rattn::Error& e) {
    EXPECT_EQ(e.status(), rattn::Status::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Prefills layer 0 of `seq` with the first `prompt` tokens of `s`.
inline void prefill_prompt(rattn::Sequence& seq, const TokenStream& s, int64_t prompt) {
  const auto pq = s.prefix(s.q, s.hq, prompt), pk = s.prefix(s.k, s.hkv, prompt), pv = s.prefix(s.v, s.hkv, prompt);
  seq.prefill(0, prompt, pq.data(), pk.data(), pv.data(), rattn::DType::f32);
}

// Decodes `steps` tokens of `s` from token `from` on; returns every output.
inline std::vector<float> decode_run(rattn::Sequence& seq, const TokenStream& s, int64_t from, int steps) {
  std::vector<float> outs, out(size_t(s.hq) * size_t(s.d)), lse(size_t(s.hq));
  for (int step = 0; step < steps; ++step) {
    const int64_t t = from + step;
    const auto q = s.token(s.q, s.hq, t), k = s.token(s.k, s.hkv, t), v = s.token(s.v, s.hkv, t);
    seq.decode(0, q.data(), k.data(), v.data(), rattn::DType::f32, out.data(), lse.data());
    outs.insert(outs.end(), out.begin(), out.end());
    outs.insert(outs.end(), lse.begin(), lse.end());
  }
  return outs;
}

// A stand-in for the GPU backend that runs on any machine: it keeps its own
// copy of the static set exactly as the CUDA backend keeps device memory
// (capacity rows per head, rows [0, rows) live) and attends it with the
// reference kernels. Counts what crosses the "bus".
// Atomic: a batch's sequences update their stand-ins from several threads.
struct StandInCounters {
  std::atomic<int> full_uploads{0};
  std::atomic<int64_t> rows_uploaded{0};  // by full uploads
  std::atomic<int64_t> row_updates{0};    // update_static_row calls
};

class StandInGpu final : public rattn::GpuAttention {
 public:
  StandInGpu(const rattn::KernelSpec& spec, StandInCounters* counters)
      : spec_(spec), kernels_(rattn::make_reference_kernels(spec)), counters_(counters) {}
  using GpuAttention::upload_static_set;
  const rattn::KernelSpec& spec() const override { return spec_; }
  std::string device_name() const override { return "stand-in"; }
  void upload_static_set(int kv_heads, const rattn::RowsView* keys, const rattn::RowsView* values,
                         int64_t capacity_rows) override {
    ASSERT_GE(capacity_rows, keys[0].rows);
    heads_ = kv_heads;
    capacity_ = capacity_rows;
    rows_ = keys[0].rows;
    k_.assign(size_t(kv_heads), std::vector<uint8_t>(size_t(capacity_rows) * row_bytes()));
    v_ = k_;
    for (int h = 0; h < kv_heads; ++h) {
      ASSERT_EQ(keys[h].dtype, spec_.kv_dtype);
      std::memcpy(k_[size_t(h)].data(), keys[h].data, size_t(rows_) * row_bytes());
      std::memcpy(v_[size_t(h)].data(), values[h].data, size_t(rows_) * row_bytes());
    }
    ++counters_->full_uploads;
    counters_->rows_uploaded += rows_ * kv_heads;
  }
  void update_static_row(int64_t row, const void* const* keys, const void* const* values) override {
    if (row < 0 || row > rows_ || row >= capacity_) throw rattn::Error(rattn::Status::invalid_argument, "row");
    for (int h = 0; h < heads_; ++h) {
      std::memcpy(k_[size_t(h)].data() + size_t(row) * row_bytes(), keys[h], row_bytes());
      std::memcpy(v_[size_t(h)].data() + size_t(row) * row_bytes(), values[h], row_bytes());
    }
    if (row == rows_) ++rows_;
    ++counters_->row_updates;
  }
  int64_t rows() const override { return rows_; }
  void partial_attention(const float* queries, float* out, float* lse) override {
    const int g = spec_.group_size, d = spec_.head_dim;
    for (int h = 0; h < heads_; ++h) {
      const rattn::RowsView k{k_[size_t(h)].data(), spec_.kv_dtype, rows_, d};
      const rattn::RowsView v{v_[size_t(h)].data(), spec_.kv_dtype, rows_, d};
      kernels_->dense_attention(queries + size_t(h) * size_t(g) * size_t(d), g, k, v, 0, rows_,
                                out + size_t(h) * size_t(g) * size_t(d), lse + size_t(h) * size_t(g));
    }
  }

 private:
  size_t row_bytes() const { return size_t(spec_.head_dim) * rattn::dtype_size(spec_.kv_dtype); }
  rattn::KernelSpec spec_;
  std::unique_ptr<rattn::CpuKernels> kernels_;
  StandInCounters* counters_;
  int heads_ = 0;
  int64_t rows_ = 0, capacity_ = 0;
  std::vector<std::vector<uint8_t>> k_, v_;
};

}  // namespace rattn::testing
