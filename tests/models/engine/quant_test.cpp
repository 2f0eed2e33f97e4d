// Dequantisation of hand-built blocks against a float64 re-implementation of
// each documented formula, written per value index (not per loop structure).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "models/engine/gguf.h"
#include "models/engine/quant.h"

namespace rattn::engine {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng() & 0xff);
  return b;
}
void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
double get_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return double(f16_to_f32(h));
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(double(got[i]), want[i], 1e-6 * (1.0 + std::fabs(want[i]))) << "value " << i;
}

TEST(Dequant, Q8_0) {
  const int nb = 3;
  auto b = random_bytes(34 * nb, 1);
  for (int i = 0; i < nb; ++i) put_f16(&b[34 * i], 0.0123f * float(i + 1) * (i % 2 ? -1 : 1));
  std::vector<double> want(32 * nb);
  for (int i = 0; i < 32 * nb; ++i) {
    const uint8_t* blk = &b[34 * (i / 32)];
    want[i] = get_f16(blk) * double(int8_t(blk[2 + i % 32]));
  }
  std::vector<float> got(32 * nb);
  dequantize(uint32_t(GgmlType::q8_0), b.data(), got.data(), 32 * nb);
  expect_close(got, want);
}

TEST(Dequant, Q5_0) {
  const int nb = 2;
  auto b = random_bytes(22 * nb, 2);
  for (int i = 0; i < nb; ++i) put_f16(&b[22 * i], 0.5f + float(i));
  std::vector<double> want(32 * nb);
  for (int i = 0; i < 32 * nb; ++i) {
    const uint8_t* blk = &b[22 * (i / 32)];
    const int j = i % 32;
    const uint32_t high = uint32_t(blk[2]) | uint32_t(blk[3]) << 8 | uint32_t(blk[4]) << 16 | uint32_t(blk[5]) << 24;
    const int nib = j < 16 ? (blk[6 + j] & 15) : (blk[6 + j - 16] >> 4);
    const int code = nib + 16 * int((high >> j) & 1);  // value j's fifth bit is bit j
    want[i] = get_f16(blk) * double(code - 16);
  }
  std::vector<float> got(32 * nb);
  dequantize(uint32_t(GgmlType::q5_0), b.data(), got.data(), 32 * nb);
  expect_close(got, want);
}

// Q4_K's 6-bit scale (s) and min (m) of sub-block j, from the bit layout:
// bytes 0-3: low 6 bits = scale of j 0-3, top 2 bits = bits 4-5 of scale j 4-7;
// bytes 4-7: low 6 bits = min of j 0-3, top 2 bits = bits 4-5 of min j 4-7;
// bytes 8-11: low nibble = bits 0-3 of scale j 4-7, high nibble = bits 0-3 of min j 4-7.
void q4k_ref_scale_min(const uint8_t* s, int j, double* scale, double* min) {
  if (j < 4) {
    *scale = s[j] % 64;
    *min = s[4 + j] % 64;
  } else {
    *scale = (s[8 + j - 4] % 16) + 16 * (s[j - 4] / 64);
    *min = (s[8 + j - 4] / 16) + 16 * (s[4 + j - 4] / 64);
  }
}

TEST(Dequant, Q4_K) {
  const int nb = 2;
  auto b = random_bytes(144 * nb, 3);
  for (int i = 0; i < nb; ++i) {
    put_f16(&b[144 * i], 0.02f * float(i + 1));
    put_f16(&b[144 * i + 2], 0.01f * float(i + 2));
  }
  std::vector<double> want(256 * nb);
  for (int i = 0; i < 256 * nb; ++i) {
    const uint8_t* blk = &b[144 * (i / 256)];
    const int r = i % 256, j = r / 32;
    double sc, mn;
    q4k_ref_scale_min(blk + 4, j, &sc, &mn);
    const uint8_t byte = blk[16 + (r / 64) * 32 + r % 32];
    const int q = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
    want[i] = get_f16(blk) * sc * q - get_f16(blk + 2) * mn;
  }
  std::vector<float> got(256 * nb);
  dequantize(uint32_t(GgmlType::q4_k), b.data(), got.data(), 256 * nb);
  expect_close(got, want);
}

TEST(Dequant, Q6_K) {
  const int nb = 2;
  auto b = random_bytes(210 * nb, 4);
  for (int i = 0; i < nb; ++i) put_f16(&b[210 * i + 208], 0.003f * float(i + 1));
  std::vector<double> want(256 * nb);
  for (int i = 0; i < 256 * nb; ++i) {
    const uint8_t* blk = &b[210 * (i / 256)];
    const int r = i % 256, half = r / 128, w = r % 128, quarter = w / 32, l = w % 32;
    const uint8_t lo_byte = blk[half * 64 + l + (quarter % 2) * 32];
    const int low = quarter < 2 ? (lo_byte & 15) : (lo_byte >> 4);
    const int high = (blk[128 + half * 32 + l] >> (2 * quarter)) & 3;
    const double scale = double(int8_t(blk[192 + half * 8 + l / 16 + 2 * quarter]));
    want[i] = get_f16(blk + 208) * scale * double(low + 16 * high - 32);
  }
  std::vector<float> got(256 * nb);
  dequantize(uint32_t(GgmlType::q6_k), b.data(), got.data(), 256 * nb);
  expect_close(got, want);
}

TEST(Dequant, F16Bf16F32) {
  const std::vector<float> vals = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-3f, -0.1f};
  std::vector<uint16_t> h, bf;
  for (float v : vals) {
    h.push_back(f32_to_f16(v));
    bf.push_back(f32_to_bf16(v));
  }
  std::vector<float> got(vals.size());
  dequantize(uint32_t(GgmlType::f16), h.data(), got.data(), int64_t(vals.size()));
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(got[i], vals[i], std::fabs(vals[i]) * 1e-3 + 1e-7);
  dequantize(uint32_t(GgmlType::bf16), bf.data(), got.data(), int64_t(vals.size()));
  for (size_t i = 0; i < vals.size(); ++i) EXPECT_NEAR(got[i], vals[i], std::fabs(vals[i]) * 8e-3 + 1e-7);
  dequantize(uint32_t(GgmlType::f32), vals.data(), got.data(), int64_t(vals.size()));
  EXPECT_EQ(got, vals);
}

TEST(Dequant, RejectsPartialBlocksAndUnknownTypes) {
  std::vector<uint8_t> b(34);
  std::vector<float> out(32);
  EXPECT_THROW(dequantize(uint32_t(GgmlType::q8_0), b.data(), out.data(), 16), Error);
  try {
    dequantize(uint32_t(GgmlType::q2_k), b.data(), out.data(), 256);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::unsupported);
  }
  EXPECT_EQ(ggml_row_bytes(uint32_t(GgmlType::q4_k), 512), 288u);
  EXPECT_EQ(ggml_row_bytes(uint32_t(GgmlType::q6_k), 256), 210u);
}

}  // namespace
}  // namespace rattn::engine
