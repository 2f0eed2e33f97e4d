#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rattn {
// Writes `data` to `path` atomically: temp file in the same directory, fsync, rename.
void write_file_atomic(const std::string& path, std::string_view data);
// Reads a whole file; throws rattn::Error(io_error) naming the path.
std::string read_file(const std::string& path);
// 64-bit FNV-1a, used for checksums of saved files and cache keys.
uint64_t fnv1a64(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);
}  // namespace rattn
