#pragma once
// Byte-image helpers for index save/load. Layout of every image:
//   magic "RATTNIX1" | u32 format version | u32 kind | u64 payload bytes |
//   payload | u64 fnv1a64(payload)
// The reader checks every length before touching bytes, so a truncated or
// corrupted image becomes Error(corrupt_data), never an out-of-bounds read.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "kernels/byte_region.h"

namespace rattn::internal {

enum class IndexKind : uint32_t { brute_force = 1, projected_graph = 2 };
inline constexpr char kIndexMagic[8] = {'R', 'A', 'T', 'T', 'N', 'I', 'X', '1'};

class ByteWriter {
 public:
  template <class T> void put(const T& v) { append(&v, sizeof(T)); }
  // A std::vector or a RegionArray: its length, then its elements.
  template <class Array> void put_vec(const Array& v) {
    put<uint64_t>(v.size());
    append(v.data(), v.size() * sizeof(*v.data()));
  }
  void append(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  template <class T> T get() {
    T v;
    take(&v, sizeof(T));
    return v;
  }
  // `max_elems` bounds the allocation a corrupted length could request.
  template <class T, class A = std::allocator<T>> std::vector<T, A> get_vec(uint64_t max_elems) {
    const uint64_t n = get_length(max_elems, sizeof(T));
    std::vector<T, A> v(n);
    take(v.data(), n * sizeof(T));
    return v;
  }
  template <class T> RegionArray<T> get_region(uint64_t max_elems) {
    const uint64_t n = get_length(max_elems, sizeof(T));
    RegionArray<T> v;
    v.resize_for_overwrite(size_t(n));
    take(v.data(), n * sizeof(T));
    return v;
  }
  void take(void* dst, size_t n) {
    if (n > b_.size() - pos_) fail(Status::corrupt_data, "index image: truncated");
    if (n == 0) return;  // an empty array's data() may be null: memcpy(null, ..) is UB
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
  }
  bool at_end() const { return pos_ == b_.size(); }

 private:
  // An array's length, checked before anything is allocated for it.
  uint64_t get_length(uint64_t max_elems, size_t elem_bytes) {
    const uint64_t n = get<uint64_t>();
    if (n > max_elems || n * elem_bytes > b_.size() - pos_)
      fail(Status::corrupt_data, "index image: array length " + std::to_string(n) + " out of range");
    return n;
  }

  std::string_view b_;
  size_t pos_ = 0;
};

// Wraps a payload in the header and checksum.
void append_index_image(std::string* out, IndexKind kind, uint32_t version, const std::string& payload);
// Checks magic, length and checksum; returns the payload and sets kind/version.
std::string_view open_index_image(std::string_view bytes, IndexKind* kind, uint32_t* version);

}  // namespace rattn::internal
