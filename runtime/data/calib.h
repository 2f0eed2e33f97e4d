#pragma once
// The calibration directory every tool reads and writes:
//   DIR/manifest.json        {"format": "rattn-calib", "version": 1, "model": ...,
//                             "layers": [ids], "num_q_heads", "num_kv_heads",
//                             "head_dim", "tokens", "dtype": "f32"|"f16",
//                             "rope_applied": true}
//   DIR/layer_<id>.q.npy     queries [Hq, T, d]
//   DIR/layer_<id>.k.npy     keys    [Hkv, T, d]
//   DIR/layer_<id>.v.npy     values  [Hkv, T, d]
// Query head h belongs to KV head h / (Hq / Hkv). All writes are atomic; a
// missing, truncated or mismatched file is an Error naming the file.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace rattn {

struct CalibManifest {
  std::string model;
  std::vector<int> layers;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int64_t tokens = 0;
  DType dtype = DType::f32;  // f32 or f16 on disk
  bool rope_applied = true;
  int group() const { return num_kv_heads > 0 ? num_q_heads / num_kv_heads : 0; }
};

// One layer, always fp32 in memory.
struct CalibLayer {
  int layer_id = 0;
  std::vector<float> q;  // [Hq, T, d]
  std::vector<float> k;  // [Hkv, T, d]
  std::vector<float> v;  // [Hkv, T, d]
};

// Throws Error(invalid_argument) when the manifest is inconsistent.
void validate_calib_manifest(const CalibManifest& m);
std::string calib_layer_path(const std::string& dir, int layer_id, char which /* 'q','k','v' */);

// Creates `dir` if needed; writes manifest.json atomically.
void write_calib_manifest(const std::string& dir, const CalibManifest& m);
// q: [Hq, T, d], k and v: [Hkv, T, d], fp32; stored in m.dtype.
void write_calib_layer(const std::string& dir, int layer_id, const float* q, const float* k, const float* v,
                       const CalibManifest& m);

CalibManifest read_calib_manifest(const std::string& dir);
CalibLayer read_calib_layer(const std::string& dir, const CalibManifest& m, int layer_id);

}  // namespace rattn
