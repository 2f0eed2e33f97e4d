// Built-in inner-product loops: an AVX2+FMA+F16C version compiled with a
// per-function target attribute (so the library still runs on any x86-64) and
// chosen at run time, and a portable fallback.
#include "runtime/index/distance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/error.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RATTN_HAVE_X86 1
#endif

namespace rattn::internal {
namespace {

// 8-bit code sums in int32 are exact up to this many dimensions (32767 * 255 * 257 < 2^31).
constexpr int kMaxInt32Dims = 257;

float dot_plain(const float* q, const void* row, DType dt, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (dt == DType::f32) {
    const float* r = static_cast<const float*>(row);
    int j = 0;
    for (; j + 8 <= d; j += 8)
      for (int u = 0; u < 8; ++u) acc[u] += q[j + u] * r[j + u];
    for (; j < d; ++j) acc[0] += q[j] * r[j];
  } else {
    const uint16_t* r = static_cast<const uint16_t*>(row);
    for (int j = 0; j < d; ++j)
      acc[j & 7] += q[j] * (dt == DType::f16 ? f16_to_f32(r[j]) : bf16_to_f32(r[j]));
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

#ifdef RATTN_HAVE_X86
__attribute__((target("avx2,fma,f16c"))) inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// Eight stored values widened to fp32, and one scalar, per storage type.
struct LoadF32 {
  using T = float;
  static inline __attribute__((target("avx2,fma,f16c"), always_inline)) __m256 eight(const float* r) {
    return _mm256_loadu_ps(r);
  }
  static float one(float x) { return x; }
};
struct LoadF16 {
  using T = uint16_t;
  static inline __attribute__((target("avx2,fma,f16c"), always_inline)) __m256 eight(const uint16_t* r) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
  }
  static float one(uint16_t x) { return f16_to_f32(x); }
};
struct LoadBF16 {  // bf16 is the upper half of an fp32: widen and shift up
  using T = uint16_t;
  static inline __attribute__((target("avx2,fma,f16c"), always_inline)) __m256 eight(const uint16_t* r) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static float one(uint16_t x) { return bf16_to_f32(x); }
};

template <class Load>
inline __attribute__((target("avx2,fma,f16c"), always_inline)) float dot_avx2(const float* q, const typename Load::T* r,
                                                                               int d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
         a3 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 32 <= d; j += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), Load::eight(r + j), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), Load::eight(r + j + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 16), Load::eight(r + j + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 24), Load::eight(r + j + 24), a3);
  }
  for (; j + 8 <= d; j += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), Load::eight(r + j), a0);
  float s = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; j < d; ++j) s += q[j] * Load::one(r[j]);
  return s;
}
constexpr auto dot_avx2_f32 = dot_avx2<LoadF32>;
constexpr auto dot_avx2_f16 = dot_avx2<LoadF16>;
constexpr auto dot_avx2_bf16 = dot_avx2<LoadBF16>;

inline __attribute__((target("avx2,fma,f16c"))) int32_t hsum_epi32(__m256i a) {
  __m128i x = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
  return _mm_cvtsi128_si32(x);
}

// sum_j qi[j] * code[j] over `stride` entries (a multiple of 64; qi zero
// past d), exact in int32 for d <= 257 (|qi| <= 32767, code <= 255: the
// total stays below 32767 * 255 * 257 < 2^31; ScalarCodes::dots takes int64
// sums beyond).
__attribute__((target("avx2,fma,f16c"))) int32_t dot_avx2_u8(const int16_t* qi, const uint8_t* c, int stride) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int j = 0; j < stride; j += 32) {
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(c + j));
    const __m256i k0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(b));
    const __m256i k1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1));
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(k0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + j))));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(k1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + j + 16))));
  }
  return hsum_epi32(_mm256_add_epi32(a0, a1));
}

// One row of 32 * kBlocks codes against the query held in q[2 * kBlocks].
template <int kBlocks>
inline __attribute__((target("avx2,fma,f16c"), always_inline)) __m256i row_sum(const __m256i* q, const uint8_t* c) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int t = 0; t < kBlocks; ++t) {
    const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(c + 32 * t));
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(b)), q[2 * t]));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(b, 1)), q[2 * t + 1]));
  }
  return _mm256_add_epi32(a0, a1);
}

// Rows of 32 * kBlocks codes with the query kept in registers, two rows per
// iteration.
template <int kBlocks>
inline __attribute__((target("avx2,fma,f16c"), always_inline)) void dots_fixed_u8(const int16_t* qi,
                                                                                 const uint8_t* codes,
                                                                                 const int32_t* ids, int n,
                                                                                 int32_t* sums) {
  constexpr size_t kStride = 32 * kBlocks;
  __m256i q[2 * kBlocks];
  for (int t = 0; t < 2 * kBlocks; ++t) q[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + 16 * t));
  int i = 0;
  for (; i + 2 <= n; i += 2) {
    const __m256i r0 = row_sum<kBlocks>(q, codes + size_t(ids[i]) * kStride);
    const __m256i r1 = row_sum<kBlocks>(q, codes + size_t(ids[i + 1]) * kStride);
    // Both horizontal sums at once: lanes of r0 and r1 interleaved by pairs.
    const __m256i h = _mm256_hadd_epi32(r0, r1);  // r0: 0+1,2+3 | r1: 0+1,2+3 (per 128-bit half)
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
    x = _mm_hadd_epi32(x, x);  // r0 total, r1 total, ...
    sums[i] = _mm_cvtsi128_si32(x);
    sums[i + 1] = _mm_extract_epi32(x, 1);
  }
  for (; i < n; ++i) sums[i] = hsum_epi32(row_sum<kBlocks>(q, codes + size_t(ids[i]) * kStride));
}

// A whole batch in one call (no call and vzeroupper per row). Rows of 128
// codes (d <= 128) or 64 (projected codes: one cache line) keep the query in
// registers; other strides use dot_avx2_u8.
// Integer sums only: the caller turns them into scores in plain code, so that
// this path and the portable one round identically (no FMA contraction here).
__attribute__((target("avx2,fma,f16c"))) void dots_avx2_u8(const int16_t* qi, const uint8_t* codes, int stride,
                                                          const int32_t* ids, int n, int32_t* sums) {
  if (stride == 128) return dots_fixed_u8<4>(qi, codes, ids, n, sums);
  if (stride == 64) return dots_fixed_u8<2>(qi, codes, ids, n, sums);
  for (int i = 0; i < n; ++i) sums[i] = dot_avx2_u8(qi, codes + size_t(ids[i]) * size_t(stride), stride);
}

// One row with coarse dims (ScalarCodes' layout): `fine_chunks` 16-byte
// chunks of 8-bit codes, then `blocks` 16-byte blocks of 4-bit pairs, against
// qi in the same layout unpacked (per block: low nibbles' qi, high nibbles').
inline __attribute__((target("avx2,fma,f16c"), always_inline)) __m256i qi_chunk(const int16_t* qi, int chunk) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + 16 * chunk));
}
inline __attribute__((target("avx2,fma,f16c"), always_inline)) int32_t row_sum_coarse(const int16_t* qi,
                                                                                    const uint8_t* c,
                                                                                    int fine_chunks, int blocks) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int t = 0; t < fine_chunks; ++t) {
    const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(c + 16 * t));
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_cvtepu8_epi16(b), qi_chunk(qi, t)));
  }
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int t = 0; t < blocks; ++t) {
    const __m128i b = _mm_load_si128(reinterpret_cast<const __m128i*>(c + 16 * (fine_chunks + t)));
    const __m128i lo = _mm_and_si128(b, low4), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low4);
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepu8_epi16(lo), qi_chunk(qi, fine_chunks + 2 * t)));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_cvtepu8_epi16(hi), qi_chunk(qi, fine_chunks + 2 * t + 1)));
  }
  return hsum_epi32(_mm256_add_epi32(a0, a1));
}

// A batch of rows with coarse dims. Instantiated with the shape as constants
// for the one-line layout of 48 fine + 32 coarse projected dims (3, 1): the
// loops unroll and the query stays in registers across rows.
template <int kFine, int kBlocks>
__attribute__((target("avx2,fma,f16c"))) void dots_coarse_fixed(const int16_t* qi, const uint8_t* codes, int stride,
                                                               const int32_t* ids, int n, int32_t* sums) {
  for (int i = 0; i < n; ++i) sums[i] = row_sum_coarse(qi, codes + size_t(ids[i]) * size_t(stride), kFine, kBlocks);
}

__attribute__((target("avx2,fma,f16c"))) void dots_avx2_coarse(const int16_t* qi, const uint8_t* codes, int stride,
                                                              int fine_chunks, int blocks, const int32_t* ids, int n,
                                                              int32_t* sums) {
  for (int i = 0; i < n; ++i)
    sums[i] = row_sum_coarse(qi, codes + size_t(ids[i]) * size_t(stride), fine_chunks, blocks);
}

// Random rows in one call (a graph walk's batch): no call through a
// function pointer and no vzeroupper per row; rows fetched kAhead ahead.
template <class Row, float (*Dot)(const float*, const Row*, int)>
__attribute__((target("avx2,fma,f16c"))) void gather_dots_avx2(const float* q, const char* base, size_t row_bytes,
                                                              int d, const int32_t* ids, int n, float* scores) {
  constexpr int kAhead = 4;
  const auto fetch = [&](int32_t id) {
    prefetch_span(base + size_t(id) * row_bytes, row_bytes);
  };
  for (int i = 0; i < n && i < kAhead; ++i) fetch(ids[i]);
  for (int i = 0; i < n; ++i) {
    if (i + kAhead < n) fetch(ids[i + kAhead]);
    scores[i] = Dot(q, reinterpret_cast<const Row*>(base + size_t(ids[i]) * row_bytes), d);
  }
}

// Distance::dots_multi on AVX2: each row fetched kAhead ahead, then scored
// for every query that wants it with the row loop dots() runs (the same
// operations in the same order, so the same score); the later queries find
// the row in L1. A 16-bit row that several queries want is widened once:
// the fp32 products of its exact widened values, in dot()'s order, give the
// same scores.
constexpr int kMaxWidenDim = 512;
template <class Load>
__attribute__((target("avx2,fma,f16c"))) void multi_dots_avx2(const float* const* queries, int nq, const char* base,
                                                             size_t row_bytes, int d, const int32_t* ids,
                                                             const uint32_t* masks, int n, float* scores) {
  using Row = typename Load::T;
  constexpr int kAhead = 4;
  alignas(32) float wide[kMaxWidenDim];
  // Whole vectors only: a scalar tail may be contracted differently.
  const bool widen = !std::is_same_v<Row, float> && d <= kMaxWidenDim && d % 8 == 0;
  for (int i = 0; i < n && i < kAhead; ++i) prefetch_span(base + size_t(ids[i]) * row_bytes, row_bytes);
  for (int i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_span(base + size_t(ids[i + kAhead]) * row_bytes, row_bytes);
    const Row* row = reinterpret_cast<const Row*>(base + size_t(ids[i]) * row_bytes);
    uint32_t m = masks[i];
    if (widen && (m & (m - 1)) != 0) {
      for (int j = 0; j < d; j += 8) _mm256_store_ps(wide + j, Load::eight(row + j));
      for (; m != 0; m &= m - 1) {
        const int q = __builtin_ctz(m);
        if (q < nq) scores[size_t(q) * size_t(n) + size_t(i)] = dot_avx2<LoadF32>(queries[q], wide, d);
      }
      continue;
    }
    for (; m != 0; m &= m - 1) {
      const int q = __builtin_ctz(m);
      if (q < nq) scores[size_t(q) * size_t(n) + size_t(i)] = dot_avx2<Load>(queries[q], row, d);
    }
  }
}

#endif

using RowDot = float (*)(const float* q, const void* row, int d);

float row_plain(const float* q, const void* row, int d) { return dot_plain(q, row, DType::f32, d); }
float row_plain_f16(const float* q, const void* row, int d) { return dot_plain(q, row, DType::f16, d); }
float row_plain_bf16(const float* q, const void* row, int d) { return dot_plain(q, row, DType::bf16, d); }
#ifdef RATTN_HAVE_X86
__attribute__((target("avx2,fma,f16c"))) float row_avx2_f32(const float* q, const void* row, int d) {
  return dot_avx2_f32(q, static_cast<const float*>(row), d);
}
__attribute__((target("avx2,fma,f16c"))) float row_avx2_f16(const float* q, const void* row, int d) {
  return dot_avx2_f16(q, static_cast<const uint16_t*>(row), d);
}
__attribute__((target("avx2,fma,f16c"))) float row_avx2_bf16(const float* q, const void* row, int d) {
  return dot_avx2_bf16(q, static_cast<const uint16_t*>(row), d);
}
#endif

// The row kernel for a storage dtype, chosen once per call rather than per row.
RowDot row_dot_for(DType dt, bool portable = false) {
#ifdef RATTN_HAVE_X86
  if (!portable && cpu_has_avx2_fma_f16c()) {
    if (dt == DType::f32) return row_avx2_f32;
    if (dt == DType::f16) return row_avx2_f16;
    if (dt == DType::bf16) return row_avx2_bf16;
  }
#endif
  return dt == DType::f32 ? row_plain : dt == DType::f16 ? row_plain_f16 : row_plain_bf16;
}

inline float dot_any(const float* q, const RowsView& keys, int64_t row) {
  return row_dot_for(keys.dtype)(q, keys.row(row), keys.dim);
}

class BuiltinDistance final : public Distance {
 public:
  explicit BuiltinDistance(bool portable) : portable_(portable) {}
  static constexpr int kAhead = 4;  // rows fetched ahead of use
  void dots(const float* q, const RowsView& keys, const int32_t* ids, int n, float* scores) const override {
    const RowDot dot = row_dot_for(keys.dtype, portable_);
    if (n > 0 && int64_t(ids[n - 1]) - ids[0] == n - 1 && consecutive(ids, n)) {
      // A scan: contiguous rows, still fetched kAhead rows ahead (the
      // hardware prefetcher alone measured slower on the shared machine).
      const char* row = static_cast<const char*>(keys.row(ids[0]));
      const size_t row_bytes = size_t(keys.dim) * dtype_size(keys.dtype);
      const size_t ahead = row_bytes * size_t(kAhead);
      for (int i = 0; i < n; ++i, row += row_bytes) {
        if (i + kAhead < n)
          for (size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + ahead + off, 0, 1);
        scores[i] = dot(q, row, keys.dim);
      }
      return;
    }
    // Random rows (a graph walk): fetched a few ahead.
#ifdef RATTN_HAVE_X86
    if (!portable_ && cpu_has_avx2_fma_f16c()) {
      const char* base = static_cast<const char*>(keys.data);
      const size_t row_bytes = size_t(keys.dim) * dtype_size(keys.dtype);
      if (keys.dtype == DType::f32) gather_dots_avx2<float, dot_avx2_f32>(q, base, row_bytes, keys.dim, ids, n, scores);
      else if (keys.dtype == DType::f16) gather_dots_avx2<uint16_t, dot_avx2_f16>(q, base, row_bytes, keys.dim, ids, n, scores);
      else gather_dots_avx2<uint16_t, dot_avx2_bf16>(q, base, row_bytes, keys.dim, ids, n, scores);
      return;
    }
#endif
    for (int i = 0; i < n && i < kAhead; ++i) prefetch_row(keys, ids[i]);
    for (int i = 0; i < n; ++i) {
      if (i + kAhead < n) prefetch_row(keys, ids[i + kAhead]);
      scores[i] = dot(q, keys.row(ids[i]), keys.dim);
    }
  }
  void dots_multi(const float* const* queries, int nq, const RowsView& keys, const int32_t* ids,
                  const uint32_t* masks, int n, float* scores) const override {
#ifdef RATTN_HAVE_X86
    if (!portable_ && cpu_has_avx2_fma_f16c()) {
      const char* base = static_cast<const char*>(keys.data);
      const size_t row_bytes = size_t(keys.dim) * dtype_size(keys.dtype);
      if (keys.dtype == DType::f32)
        multi_dots_avx2<LoadF32>(queries, nq, base, row_bytes, keys.dim, ids, masks, n, scores);
      else if (keys.dtype == DType::f16)
        multi_dots_avx2<LoadF16>(queries, nq, base, row_bytes, keys.dim, ids, masks, n, scores);
      else multi_dots_avx2<LoadBF16>(queries, nq, base, row_bytes, keys.dim, ids, masks, n, scores);
      return;
    }
#endif
    Distance::dots_multi(queries, nq, keys, ids, masks, n, scores);
  }
  const char* name() const override { return portable_ ? "portable" : "builtin"; }

 private:
  bool portable_;
  static bool consecutive(const int32_t* ids, int n) {
    for (int i = 1; i < n; ++i)
      if (ids[i] != ids[0] + i) return false;
    return true;
  }
};

class KernelsDistance final : public Distance {
 public:
  explicit KernelsDistance(std::shared_ptr<CpuKernels> k) : kernels_(std::move(k)) {}
  void dots(const float* q, const RowsView& keys, const int32_t* ids, int n, float* scores) const override {
    kernels_->gathered_dot(q, 1, keys, ids, n, scores);
  }
  const char* name() const override { return "cpu_kernels"; }

 private:
  std::shared_ptr<CpuKernels> kernels_;
};

int32_t dot_plain_u8(const int16_t* qi, const uint8_t* c, int stride) {
  int32_t acc = 0;
  for (int j = 0; j < stride; ++j) acc += int32_t(qi[j]) * int32_t(c[j]);
  return acc;
}

// The coarse-dims layout (ScalarCodes): fine_bytes 8-bit codes, then blocks
// of 16 bytes of 4-bit pairs.
int32_t dot_plain_coarse(const int16_t* qi, const uint8_t* c, int fine_bytes, int blocks) {
  int32_t acc = dot_plain_u8(qi, c, fine_bytes);
  for (int t = 0; t < blocks; ++t) {
    const uint8_t* b = c + fine_bytes + 16 * t;
    const int16_t* q = qi + fine_bytes + 32 * t;
    for (int j = 0; j < 16; ++j) acc += int32_t(q[j]) * int32_t(b[j] & 15) + int32_t(q[16 + j]) * int32_t(b[j] >> 4);
  }
  return acc;
}

}  // namespace

int ScalarCodes::row_stride(int dim, int coarse_dims) {
  // The row layout: fine codes padded to 16 bytes, then 16-byte blocks of 32 coarse dims.
  const int row_bytes = coarse_dims == 0 ? dim : (dim - coarse_dims + 15) / 16 * 16 + 16 * ((coarse_dims + 31) / 32);
  return (row_bytes + 63) / 64 * 64;
}

void ScalarCodes::clear() {
  dim_ = coarse_ = stride_ = 0;
  rows_ = fitted_rows_ = 0;
  scale_.clear();
  offset_.clear();
  inv_scale_.clear();
  codes_.clear();
  codes_.shrink_to_fit();
}

void SharedTraversalCodes::update(const RowsView& keys, int64_t upto) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (upto <= rows_.load(std::memory_order_relaxed) && codes_.fitted()) return;
  if (!codes_.fitted() || upto >= 2 * std::max<int64_t>(codes_.fitted_rows(), 8)) codes_.fit(keys, upto);
  else codes_.append(keys, upto);
  rows_.store(codes_.rows(), std::memory_order_release);
}

void SharedTraversalCodes::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  codes_.clear();
  rows_.store(0, std::memory_order_release);
}

void ScalarCodes::fit(const RowsView& keys, int64_t rows, int coarse_dims) {
  if (keys.dim <= 0 || rows < 0 || rows > keys.rows) fail(Status::invalid_argument, "scalar codes: bad key rows");
  if (coarse_dims < 0 || coarse_dims > keys.dim)
    fail(Status::invalid_argument, "scalar codes: coarse_dims must be in [0, dim]");
  // int32 sums stay exact while 32767 * (255 * fine + 15 * coarse) < 2^31
  // (the 8-bit-only path switches to int64 sums beyond kMaxInt32Dims).
  if (coarse_dims > 0 && 255 * (keys.dim - coarse_dims) + 15 * coarse_dims > 255 * kMaxInt32Dims)
    fail(Status::invalid_argument, "scalar codes: too many dimensions for coarse codes (255 fine + 15 coarse per dimension, at most 65535)");
  clear();
  dim_ = keys.dim;
  coarse_ = coarse_dims;
  stride_ = row_stride(dim_, coarse_);
  std::vector<float> lo(size_t(dim_), std::numeric_limits<float>::infinity()),
      hi(size_t(dim_), -std::numeric_limits<float>::infinity()), x(static_cast<size_t>(dim_));
  float* lo_p = lo.data();
  float* hi_p = hi.data();
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x.data();
    if (keys.dtype == DType::f32) row = static_cast<const float*>(keys.row(i));
    else to_f32(keys.dtype, keys.row(i), x.data(), x.size());
    for (int j = 0; j < dim_; ++j) {
      lo_p[j] = row[j] < lo_p[j] ? row[j] : lo_p[j];
      hi_p[j] = row[j] > hi_p[j] ? row[j] : hi_p[j];
    }
  }
  scale_.assign(size_t(dim_), 0.0f);
  offset_.assign(size_t(dim_), 0.0f);
  inv_scale_.assign(size_t(dim_), 0.0f);
  for (int j = 0; j < dim_; ++j) {
    if (rows == 0 || !std::isfinite(lo[size_t(j)]) || !std::isfinite(hi[size_t(j)])) continue;
    offset_[size_t(j)] = lo[size_t(j)];
    const float range = hi[size_t(j)] - lo[size_t(j)];
    const float levels = j < fine() ? 255.0f : 15.0f;
    if (range > 0) {
      scale_[size_t(j)] = range / levels;
      inv_scale_[size_t(j)] = levels / range;
    }
  }
  encode_rows(keys, 0, rows);
  fitted_rows_ = rows;
}

void ScalarCodes::append(const RowsView& keys, int64_t upto) {
  if (!fitted()) fail(Status::invalid_argument, "scalar codes: append before fit");
  if (keys.dim != dim_ || upto > keys.rows) fail(Status::invalid_argument, "scalar codes: key store does not match the codes");
  if (upto > rows_) encode_rows(keys, rows_, upto);
}

namespace {
void encode_row(const float* __restrict row, const float* __restrict off, const float* __restrict inv,
                uint8_t* __restrict c, int d, float top = 255.0f) {
  for (int j = 0; j < d; ++j) {
    float v = (row[j] - off[j]) * inv[j];
    v = v > 0.0f ? v : 0.0f;
    v = v < top ? v : top;
    c[j] = uint8_t(int(v + 0.5f));
  }
}
}  // namespace

// Round half up after clamping to [0, 255] ([0, 15] for coarse dims); NaN
// fails both compares -> 0.
// (encode_row is a plain loop the compiler vectorises - restrict: the uint8_t
// stores could alias the floats otherwise. Encoding 128K keys is part of a
// search's first call.)
void ScalarCodes::encode_into(const float* row, int64_t i) {
  uint8_t* c = codes_.data() + size_t(i) * size_t(stride_);
  const int fine_dims = fine();
  encode_row(row, offset_.data(), inv_scale_.data(), c, fine_dims);
  std::fill(c + fine_dims, c + stride_, uint8_t(0));
  for (int k0 = 0; k0 < coarse_; k0 += 32) {  // 4-bit codes, 32 per 16-byte block
    uint8_t codes4[32];
    const int n = std::min(32, coarse_ - k0), j0 = fine_dims + k0;
    encode_row(row + j0, offset_.data() + j0, inv_scale_.data() + j0, codes4, n, 15.0f);
    uint8_t* block = c + fine_bytes() + k0 / 2;
    for (int pos = 0; pos < n; ++pos) block[pos % 16] |= uint8_t(pos < 16 ? codes4[pos] : codes4[pos] << 4);
  }
}

void ScalarCodes::encode_rows(const RowsView& keys, int64_t from, int64_t to) {
  codes_.resize(size_t(to) * size_t(stride_), 0);
  std::vector<float> x(static_cast<size_t>(dim_));
  for (int64_t i = from; i < to; ++i) {
    const float* row = x.data();
    if (keys.dtype == DType::f32) row = static_cast<const float*>(keys.row(i));
    else to_f32(keys.dtype, keys.row(i), x.data(), x.size());
    encode_into(row, i);
  }
  rows_ = to;
}

void ScalarCodes::append_rows(const float* rows, int64_t n) {
  if (!fitted()) fail(Status::invalid_argument, "scalar codes: append before fit");
  if (n < 0) fail(Status::invalid_argument, "scalar codes: negative row count");
  codes_.resize(size_t(rows_ + n) * size_t(stride_), 0);
  for (int64_t i = 0; i < n; ++i) encode_into(rows + size_t(i) * size_t(dim_), rows_ + i);
  rows_ += n;
}

void ScalarCodes::prepare_query(const float* q, Query* out) const {
  double bias = 0;
  float qmax = 0;
  for (int j = 0; j < dim_; ++j) {
    bias += double(q[j]) * double(offset_[size_t(j)]);
    qmax = std::max(qmax, std::fabs(q[j] * scale_[size_t(j)]));
  }
  out->bias = float(bias);
  out->qi.assign(coarse_ == 0 ? size_t(stride_) : size_t(fine_bytes() + 32 * coarse_blocks()), 0);
  out->qscale = qmax > 0 && std::isfinite(qmax) ? qmax / 32767.0f : 0.0f;
  if (out->qscale == 0) return;
  const float inv = 1.0f / out->qscale;
  for (int j = 0; j < dim_; ++j) {
    const int k = j - fine();  // coarse: block k / 32, low nibbles first
    const size_t at = k < 0 ? size_t(j) : size_t(fine_bytes() + 32 * (k / 32) + k % 32);
    out->qi[at] = int16_t(std::clamp(std::nearbyint(q[j] * scale_[size_t(j)] * inv), -32767.0f, 32767.0f));
  }
}

float ScalarCodes::error_bound(const float* q, const Query& prepared) const {
  double e = 0;
  for (int j = 0; j < dim_; ++j) e += std::fabs(double(q[j])) * double(scale_[size_t(j)]) * 0.5;
  e += (255.0 * double(fine()) + 15.0 * double(coarse_)) * double(prepared.qscale) * 0.5;
  return float(e);
}

void ScalarCodes::dots(const Query& q, const int32_t* ids, int n, float* scores) const {
  const int16_t* qi = q.qi.data();
  if (coarse_ > 0) {  // int32 sums: fit() bounds the dims
    int32_t sums[64];
    for (int i0 = 0; i0 < n; i0 += 64) {
      const int m = std::min(64, n - i0);
#ifdef RATTN_HAVE_X86
      if (!portable_ && cpu_has_avx2_fma_f16c()) {
        if (fine_bytes() == 48 && coarse_blocks() == 1) dots_coarse_fixed<3, 1>(qi, codes_.data(), stride_, ids + i0, m, sums);
        else dots_avx2_coarse(qi, codes_.data(), stride_, fine_bytes() / 16, coarse_blocks(), ids + i0, m, sums);
      } else
#endif
      {
        for (int i = 0; i < m; ++i) sums[i] = dot_plain_coarse(qi, row(ids[i0 + i]), fine_bytes(), coarse_blocks());
      }
      for (int i = 0; i < m; ++i) scores[i0 + i] = q.bias + q.qscale * float(sums[i]);
    }
    return;
  }
#ifdef RATTN_HAVE_X86
  if (!portable_ && cpu_has_avx2_fma_f16c() && dim_ <= kMaxInt32Dims) {
    int32_t sums[64];
    for (int i0 = 0; i0 < n; i0 += 64) {
      const int m = std::min(64, n - i0);
      dots_avx2_u8(qi, codes_.data(), stride_, ids + i0, m, sums);
      for (int i = 0; i < m; ++i) scores[i0 + i] = q.bias + q.qscale * float(sums[i]);
    }
    return;
  }
#endif
  if (dim_ <= kMaxInt32Dims) {
    for (int i = 0; i < n; ++i) scores[i] = q.bias + q.qscale * float(dot_plain_u8(qi, row(ids[i]), stride_));
    return;
  }
  for (int i = 0; i < n; ++i) {  // more than kMaxInt32Dims dimensions: int64 sums
    const uint8_t* c = row(ids[i]);
    int64_t acc = 0;
    for (int j = 0; j < stride_; ++j) acc += int64_t(qi[j]) * int64_t(c[j]);
    scores[i] = q.bias + q.qscale * float(acc);
  }
}

float dot_row(const float* query, const RowsView& keys, int64_t row) { return dot_any(query, keys, row); }

void Distance::dots_multi(const float* const* queries, int nq, const RowsView& keys, const int32_t* ids,
                          const uint32_t* masks, int n, float* scores) const {
  thread_local std::vector<int32_t> sub_ids;
  thread_local std::vector<float> sub_scores;
  sub_ids.resize(size_t(n));
  sub_scores.resize(size_t(n));
  for (int q = 0; q < nq; ++q) {
    int m = 0;
    for (int i = 0; i < n; ++i)
      if (masks[i] >> q & 1u) sub_ids[size_t(m++)] = ids[i];
    if (m == 0) continue;
    dots(queries[q], keys, sub_ids.data(), m, sub_scores.data());
    for (int i = 0, k = 0; i < n; ++i)
      if (masks[i] >> q & 1u) scores[size_t(q) * size_t(n) + size_t(i)] = sub_scores[size_t(k++)];
  }
}

std::unique_ptr<Distance> make_distance(std::shared_ptr<CpuKernels> kernels) {
  if (kernels) return std::make_unique<KernelsDistance>(std::move(kernels));
  return std::make_unique<BuiltinDistance>(false);
}

std::unique_ptr<Distance> make_portable_distance() { return std::make_unique<BuiltinDistance>(true); }

}  // namespace rattn::internal
