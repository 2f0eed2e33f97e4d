#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rattn {
// Writes `data` to `path` atomically: temp file in the same directory, fsync, rename.
void write_file_atomic(const std::string& path, std::string_view data);

// The same, streamed: a file too large to build in memory first is written
// piece by piece into a temporary file beside `path`, which commit() syncs
// and renames over `path`. Until then `path` is untouched; a writer
// destroyed without commit() (an exception) removes its temporary file.
// Errors: rattn::Error(io_error) naming the path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  // Appends n bytes (buffered).
  void write(const void* data, size_t n);
  // Overwrites n bytes already written at `offset` (e.g. a header's length field).
  void write_at(uint64_t offset, const void* data, size_t n);
  uint64_t size() const { return size_; }
  void commit();

 private:
  void flush();
  void write_all(const char* p, size_t n);
  [[noreturn]] void fail_io(const std::string& what);
  std::string path_, tmp_;
  int fd_ = -1;
  std::string buffer_;
  uint64_t size_ = 0;
};
// Opens `path` read-only and returns the descriptor (the caller closes it).
// Anything but a regular file is refused with rattn::Error(io_error): a
// directory ("is a directory"), a FIFO, socket or device (opening a FIFO
// would wait for a writer). `size`, if given, receives the file's size.
int open_regular_file(const std::string& path, uint64_t* size = nullptr);
// Reads a whole regular file; throws rattn::Error(io_error) naming the path.
std::string read_file(const std::string& path);
// 64-bit FNV-1a, used for checksums of saved files and cache keys.
uint64_t fnv1a64(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ull);
}  // namespace rattn
