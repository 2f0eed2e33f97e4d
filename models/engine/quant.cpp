#include "models/engine/quant.h"

#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "models/engine/gguf.h"

namespace rattn::engine {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

void deq_q8_0(const uint8_t* b, float* y, int64_t nblocks) {
  for (int64_t i = 0; i < nblocks; ++i, b += 34, y += 32) {
    const float d = f16_to_f32(load_u16(b));
    const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < 32; ++j) y[j] = d * float(q[j]);
  }
}

void deq_q4_0(const uint8_t* b, float* y, int64_t nblocks) {
  for (int64_t i = 0; i < nblocks; ++i, b += 18, y += 32) {
    const float d = f16_to_f32(load_u16(b));
    const uint8_t* q = b + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * float(int(q[j] & 0xf) - 8);
      y[j + 16] = d * float(int(q[j] >> 4) - 8);
    }
  }
}

void deq_q5_0(const uint8_t* b, float* y, int64_t nblocks) {
  for (int64_t i = 0; i < nblocks; ++i, b += 22, y += 32) {
    const float d = f16_to_f32(load_u16(b));
    uint32_t high;
    std::memcpy(&high, b + 2, 4);
    const uint8_t* q = b + 6;
    for (int j = 0; j < 16; ++j) {
      const int lo = int(q[j] & 0xf) | int(((high >> j) & 1u) << 4);
      const int hi = int(q[j] >> 4) | int(((high >> (j + 16)) & 1u) << 4);
      y[j] = d * float(lo - 16);
      y[j + 16] = d * float(hi - 16);
    }
  }
}

// The 6-bit scale and min of sub-block j (0..7) from Q4_K's 12 packed bytes:
// sub-blocks 0-3 use the low 6 bits of bytes j and j+4; 4-7 combine a nibble
// of byte j+4 with the top 2 bits of bytes j-4 and j.
void q4k_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void deq_q4_k(const uint8_t* b, float* y, int64_t nblocks) {
  for (int64_t i = 0; i < nblocks; ++i, b += 144) {
    const float d = f16_to_f32(load_u16(b));
    const float dmin = f16_to_f32(load_u16(b + 2));
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    // Four groups of 64 values: 32 bytes, low nibbles = first sub-block,
    // high nibbles = second.
    for (int g = 0; g < 4; ++g, q += 32) {
      int sc0, m0, sc1, m1;
      q4k_scale_min(2 * g, scales, &sc0, &m0);
      q4k_scale_min(2 * g + 1, scales, &sc1, &m1);
      const float d0 = d * float(sc0), o0 = dmin * float(m0);
      const float d1 = d * float(sc1), o1 = dmin * float(m1);
      for (int l = 0; l < 32; ++l) *y++ = d0 * float(q[l] & 0xf) - o0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] >> 4) - o1;
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y, int64_t nblocks) {
  for (int64_t i = 0; i < nblocks; ++i, b += 210) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16_to_f32(load_u16(b + 208));
    // Two halves of 128 values: 64 bytes of ql, 32 bytes of qh, 8 scales each.
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int s = l / 16;
        const int q1 = int((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = int((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * float(sc[s]) * float(q1);
        y[l + 32] = d * float(sc[s + 2]) * float(q2);
        y[l + 64] = d * float(sc[s + 4]) * float(q3);
        y[l + 96] = d * float(sc[s + 6]) * float(q4);
      }
    }
  }
}

}  // namespace

void dequantize(uint32_t type, const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int bs = ggml_block_size(type);
  if (n % bs != 0)
    fail(Status::invalid_argument, "dequantize: " + std::to_string(n) + " values is not a multiple of the " +
                                       ggml_type_name(type) + " block size " + std::to_string(bs));
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case GgmlType::f16: to_f32(DType::f16, src, dst, size_t(n)); return;
    case GgmlType::bf16: to_f32(DType::bf16, src, dst, size_t(n)); return;
    case GgmlType::q8_0: deq_q8_0(b, dst, n / 32); return;
    case GgmlType::q4_0: deq_q4_0(b, dst, n / 32); return;
    case GgmlType::q5_0: deq_q5_0(b, dst, n / 32); return;
    case GgmlType::q4_k: deq_q4_k(b, dst, n / 256); return;
    case GgmlType::q6_k: deq_q6_k(b, dst, n / 256); return;
    default:
      fail(Status::unsupported, std::string("dequantize: ggml type ") + ggml_type_name(type) + " is not supported");
  }
}

}  // namespace rattn::engine
