#include "models/engine/matmul.h"

#include <omp.h>

#include <mutex>
#include <unordered_map>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"

namespace rattn::engine {
namespace {

// One primitive per concrete shape: oneDNN's run-time-dimension matmul
// falls back to slow reference code, while fixed shapes get its JIT GEMM.
// A model uses few shapes (weights x chunk lengths, attention blocks).
struct ShapeKey {
  int64_t M, N, K, lda, ldb, ldc;
  bool trans, scaled;
  bool operator==(const ShapeKey& o) const {
    return M == o.M && N == o.N && K == o.K && lda == o.lda && ldb == o.ldb && ldc == o.ldc && trans == o.trans &&
           scaled == o.scaled;
  }
};
struct ShapeHash {
  size_t operator()(const ShapeKey& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t(k.trans), int64_t(k.scaled)}) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

struct Primitives {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::unordered_map<ShapeKey, dnnl::matmul, ShapeHash> cache;
  std::mutex mu;
  dnnl::matmul get(const ShapeKey& k, const dnnl::memory::desc& a, const dnnl::memory::desc& b,
                   const dnnl::memory::desc& c) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(k);
    if (it != cache.end()) return it->second;
    dnnl::primitive_attr attr;
    if (k.scaled) {
      attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    if (cache.size() > 4096) cache.clear();
    dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, eng));
    cache.emplace(k, mm);
    return mm;
  }
};

Primitives& prims() {
  static Primitives p;
  return p;
}

int g_threads = 2;

}  // namespace

void set_engine_threads(int threads) {
  g_threads = threads < 1 ? 1 : threads;
  omp_set_num_threads(g_threads);
}
int engine_threads() { return g_threads; }

void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
            bool b_transposed, float* C, int64_t ldc, float alpha, float beta) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) fail(Status::invalid_argument, "matmul: K must be positive");
  using dt = dnnl::memory::data_type;
  Primitives& p = prims();
  const dnnl::memory::desc a({M, K}, dt::f32, {lda, 1});
  const dnnl::memory::desc b = b_transposed ? dnnl::memory::desc({K, N}, dt::f32, {1, ldb})
                                            : dnnl::memory::desc({K, N}, dt::f32, {ldb, 1});
  const dnnl::memory::desc c({M, N}, dt::f32, {ldc, 1});
  dnnl::memory am(a, p.eng, const_cast<float*>(A));
  dnnl::memory bm(b, p.eng, const_cast<float*>(B));
  dnnl::memory cm(c, p.eng, C);
  const bool scaled = !(alpha == 1.0f && beta == 0.0f);
  dnnl::matmul mm = p.get({M, N, K, lda, ldb, ldc, b_transposed, scaled}, a, b, c);
  if (!scaled) {
    mm.execute(p.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  } else {
    if (beta != 0.0f && beta != 1.0f) fail(Status::invalid_argument, "matmul: beta must be 0 or 1");
    if (beta == 0.0f) {
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = 0.0f;
    }
    float scale = alpha;
    dnnl::memory sm({{1}, dt::f32, {1}}, p.eng, &scale);
    mm.execute(p.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm},
                                             {DNNL_ARG_ATTR_OUTPUT_SCALES, sm}});
  }
  p.stream.wait();
}

}  // namespace rattn::engine
