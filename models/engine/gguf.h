#pragma once
// GGUF (version 2/3) container reader: header, metadata key/values of every
// type (arrays included), the tensor table and the aligned data section. The
// file is memory-mapped; tensor data are pointers into the mapping.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rattn::engine {

// ggml tensor types this engine knows by name (numbers as stored in GGUF).
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  bf16 = 30,
};
const char* ggml_type_name(uint32_t type);

// GGUF metadata value types.
enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

struct GgufValue;
using GgufArray = std::vector<GgufValue>;
// Integers widen to int64/uint64, floats to double; arrays of strings and of
// numbers are stored element by element.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;
  GgufValueType elem_type = GgufValueType::u8;  // for arrays
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] first: dims[0] is the contiguous (row) length
  uint32_t type = 0;
  uint64_t offset = 0;        // relative to the data section
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  int64_t elements() const;
  int64_t rows() const { return dims.empty() ? 1 : elements() / dims[0]; }
};

class GgufFile {
 public:
  // Maps and parses `path`; throws Error(io_error) if it cannot be opened and
  // Error(corrupt_data) naming the file if it is truncated or malformed.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image (kept alive by the caller).
  static std::unique_ptr<GgufFile> parse(const uint8_t* data, size_t size, const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  // Typed getters: throw Error(not_found / corrupt_data) naming the key.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  const GgufArray& get_array(const std::string& key) const;
  const GgufTensor& tensor(const std::string& name) const;  // throws not_found
  const GgufTensor* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  std::string name_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Bytes that `n` consecutive elements of a ggml type take (n a multiple of the
// block size); throws Error(unsupported) for an unknown type.
size_t ggml_row_bytes(uint32_t type, int64_t n);
int ggml_block_size(uint32_t type);

}  // namespace rattn::engine
