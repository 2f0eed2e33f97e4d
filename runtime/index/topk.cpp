// select_best: the k best pairs of a buffer moved to its front. On CPUs with
// AVX-512 a quickselect whose partitions are compress-stores, eight pairs at
// a time; elsewhere std::nth_element.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/cpu_info.h"
#include "runtime/index/topk.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RATTN_TOPK_X86 1
#endif

namespace rattn::internal {

namespace {

#ifdef RATTN_TOPK_X86
// Splits in[0, m) into the pairs better than `pivot` (to `better`) and the
// pairs worse than it (to `worse`); the pivot itself goes to neither.
// Returns how many were better. A pair is 8 bytes: its score in the even
// 32-bit lane, its id in the odd one.
__attribute__((target("avx512f,bmi2"))) size_t partition_avx512(const ScoredId* in, size_t m, ScoredId pivot,
                                                                ScoredId* better, ScoredId* worse) {
  const __m512 pivot_score = _mm512_set1_ps(pivot.score);
  const __m512i pivot_id = _mm512_set1_epi32(pivot.id);
  size_t nb = 0, nw = 0;
  for (size_t i = 0; i < m; i += 8) {
    const size_t left = m - i;
    const __mmask8 valid = left >= 8 ? __mmask8(0xff) : __mmask8((1u << left) - 1);
    const __m512i v = _mm512_maskz_loadu_epi64(valid, in + i);
    const __m512 s = _mm512_castsi512_ps(v);
    const unsigned gt = _pext_u32(_mm512_cmp_ps_mask(s, pivot_score, _CMP_GT_OQ), 0x5555u);
    const unsigned eq = _pext_u32(_mm512_cmp_ps_mask(s, pivot_score, _CMP_EQ_OQ), 0x5555u);
    const unsigned id_lt = _pext_u32(_mm512_cmplt_epi32_mask(v, pivot_id), 0xaaaau);
    const unsigned id_eq = _pext_u32(_mm512_cmpeq_epi32_mask(v, pivot_id), 0xaaaau);
    const unsigned b = (gt | (eq & id_lt)) & valid;
    const unsigned w = ~(b | (eq & id_eq)) & valid;
    _mm512_mask_compressstoreu_epi64(better + nb, __mmask8(b), v);
    _mm512_mask_compressstoreu_epi64(worse + nw, __mmask8(w), v);
    nb += size_t(__builtin_popcount(b));
    nw += size_t(__builtin_popcount(w));
  }
  return nb;
}

void select_best_avx512(ScoredId* v, size_t n, size_t k) {
  thread_local std::vector<ScoredId> better, worse;
  better.resize(n);
  worse.resize(n);
  size_t lo = 0, hi = n, need = k;  // the best `need` of [lo, hi) still to move to its front
  for (;;) {
    const size_t m = hi - lo;
    if (m <= 64) {
      std::nth_element(v + lo, v + lo + (need - 1), v + hi, Better{});
      return;
    }
    // Pivot: of 7 evenly spaced pairs, the one at about the wanted rank.
    std::array<ScoredId, 7> sample;
    for (size_t i = 0; i < sample.size(); ++i) sample[i] = v[lo + (2 * i + 1) * m / (2 * sample.size())];
    std::sort(sample.begin(), sample.end(), Better{});
    const ScoredId pivot = sample[std::min(sample.size() - 1, need * sample.size() / m)];
    const size_t nb = partition_avx512(v + lo, m, pivot, better.data(), worse.data());
    std::copy(better.begin(), better.begin() + std::ptrdiff_t(nb), v + lo);
    v[lo + nb] = pivot;
    std::copy(worse.begin(), worse.begin() + std::ptrdiff_t(m - nb - 1), v + lo + nb + 1);
    if (nb + 1 == need) return;
    if (nb >= need) {
      hi = lo + nb;
    } else {
      need -= nb + 1;
      lo += nb + 1;
    }
  }
}
#endif

}  // namespace

void sort_best(std::vector<ScoredId>& v) {
  thread_local std::vector<uint64_t> keys;
  keys.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float s = v[i].score + 0.0f;  // -0 -> +0
    uint32_t b;
    std::memcpy(&b, &s, sizeof b);
    const uint32_t ascending = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // the float order as unsigned
    keys[i] = (uint64_t(~ascending) << 32) | (uint32_t(v[i].id) ^ 0x80000000u);
  }
  std::sort(keys.begin(), keys.end());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t ascending = ~uint32_t(keys[i] >> 32);
    const uint32_t b = (ascending & 0x80000000u) ? (ascending & 0x7fffffffu) : ~ascending;
    std::memcpy(&v[i].score, &b, sizeof b);
    v[i].id = int32_t(uint32_t(keys[i]) ^ 0x80000000u);
  }
}

void select_best(std::vector<ScoredId>& v, size_t k) {
  if (k == 0 || k >= v.size()) return;
#ifdef RATTN_TOPK_X86
  if (cpu_has_avx512f_bmi2()) {
    select_best_avx512(v.data(), v.size(), k);
    return;
  }
#endif
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k - 1), v.end(), Better{});
}

}  // namespace rattn::internal
