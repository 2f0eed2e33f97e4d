#pragma once
// .npy (format 1.0/2.0) reading and atomic writing: little-endian f4, f2, i4, i8,
// and bf16 stored as '<u2' with a dtype note kept by callers (manifest.json).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rattn {

enum class NpyType : uint8_t { f32, f16, i32, i64, u16 };
size_t npy_type_size(NpyType t);

struct NpyArray {
  NpyType type = NpyType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // C order
  int64_t size() const;        // element count
  template <class T> const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
  template <class T> T* as() { return reinterpret_cast<T*>(bytes.data()); }
};

// Throws rattn::Error(corrupt_data) naming the file on a truncated or malformed file.
NpyArray read_npy(const std::string& path);
// The same on a file's bytes; `path` names it in errors.
NpyArray parse_npy(std::string_view raw, const std::string& path);
// Writes via a temporary file in the same directory and rename(), so readers
// never see a partial file.
void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape,
               const void* data);

}  // namespace rattn
