#pragma once
// Writes small GGUF images in tests (hand-built files, truncations).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace rattn::engine::testing {

// fp32 values as a tensor's raw bytes (GgufBuilder::tensor with type 0).
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}
  void kv_u32(const std::string& k, uint32_t v) { key(k, 4); put(v); ++n_kv_; }
  void kv_i32(const std::string& k, int32_t v) { key(k, 5); put(v); ++n_kv_; }
  void kv_f32(const std::string& k, float v) { key(k, 6); put(v); ++n_kv_; }
  void kv_bool(const std::string& k, bool v) { key(k, 7); put(uint8_t(v)); ++n_kv_; }
  void kv_u64(const std::string& k, uint64_t v) { key(k, 10); put(v); ++n_kv_; }
  void kv_f64(const std::string& k, double v) { key(k, 12); put(v); ++n_kv_; }
  void kv_str(const std::string& k, const std::string& v) { key(k, 8); str(kv_, v); ++n_kv_; }
  void kv_str_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, 9); put(uint32_t(8)); put(uint64_t(v.size()));
    for (const auto& s : v) str(kv_, s);
    ++n_kv_;
  }
  void kv_f32_array(const std::string& k, const std::vector<float>& v) {
    key(k, 9); put(uint32_t(6)); put(uint64_t(v.size()));
    for (float x : v) put(x);
    ++n_kv_;
  }
  void kv_i32_array(const std::string& k, const std::vector<int32_t>& v) {
    key(k, 9); put(uint32_t(5)); put(uint64_t(v.size()));
    for (int32_t x : v) put(x);
    ++n_kv_;
  }
  // A tensor of ggml type `type` with raw block bytes; dims ne[0] first.
  void tensor(const std::string& name, std::vector<int64_t> dims, uint32_t type, const std::vector<uint8_t>& bytes) {
    tensors_.push_back({name, std::move(dims), type, bytes});
  }
  std::vector<uint8_t> build(uint64_t alignment = 32) const {
    std::vector<uint8_t> out;
    app(out, "GGUF", 4);
    app_v(out, version_);
    app_v(out, uint64_t(tensors_.size()));
    app_v(out, uint64_t(n_kv_));
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t off = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      offsets.push_back(off);
      off += (t.bytes.size() + alignment - 1) / alignment * alignment;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      std::vector<uint8_t> tmp;
      str(tmp, t.name);
      out.insert(out.end(), tmp.begin(), tmp.end());
      app_v(out, uint32_t(t.dims.size()));
      for (int64_t d : t.dims) app_v(out, uint64_t(d));
      app_v(out, t.type);
      app_v(out, offsets[i]);
    }
    while (out.size() % alignment) out.push_back(0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      // Padding between tensors only: every shorter prefix misses data.
      if (i > 0) while (out.size() % alignment) out.push_back(0);
      out.insert(out.end(), tensors_[i].bytes.begin(), tensors_[i].bytes.end());
    }
    return out;
  }

 private:
  struct T { std::string name; std::vector<int64_t> dims; uint32_t type; std::vector<uint8_t> bytes; };
  template <class V> static void app_v(std::vector<uint8_t>& o, V v) { app(o, &v, sizeof v); }
  static void app(std::vector<uint8_t>& o, const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    o.insert(o.end(), b, b + n);
  }
  static void str(std::vector<uint8_t>& o, const std::string& s) { app_v(o, uint64_t(s.size())); app(o, s.data(), s.size()); }
  template <class V> void put(V v) { app_v(kv_, v); }
  void key(const std::string& k, uint32_t type) { str(kv_, k); put(type); }
  uint32_t version_;
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

}  // namespace rattn::engine::testing
