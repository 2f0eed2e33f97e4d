#pragma once
// Matrix products on oneDNN (f32 matmul primitives with run-time shapes and
// strides, created once and reused for every shape).
#include <cstdint>

namespace rattn::engine {

// C[M,N] (row stride ldc) = alpha * A[M,K] (row stride lda) x op(B) + beta * C.
// b_transposed: B is stored as [N,K] rows (row stride ldb), e.g. a weight
// matrix with one row per output or a key matrix; otherwise B is [K,N].
void matmul(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
            bool b_transposed, float* C, int64_t ldc, float alpha = 1.0f, float beta = 0.0f);

// Threads used by oneDNN and the engine's own OpenMP loops.
void set_engine_threads(int threads);
int engine_threads();

}  // namespace rattn::engine
