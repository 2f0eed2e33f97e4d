#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>

#include "core/atomic_file.h"
#include "core/cpu_info.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/npy.h"

#if defined(__SANITIZE_THREAD__)
#define RATTN_TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RATTN_TSAN_BUILD 1
#endif
#endif
#ifdef RATTN_TSAN_BUILD
// The Halide runtime inside each compiled kernel is not instrumented: its
// thread pool hands a parked worker's mutex to another thread through its own
// atomics, which ThreadSanitizer cannot see, so it reports a race there.
extern "C" const char* __tsan_default_suppressions() {
  return "race:Halide::Runtime::Internal::Synchronization::\n";
}
#endif

namespace rattn {

const char* status_name(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::invalid_argument: return "invalid argument";
    case Status::parse_error: return "parse error";
    case Status::io_error: return "I/O error";
    case Status::corrupt_data: return "corrupt data";
    case Status::unsupported: return "unsupported";
    case Status::not_found: return "not found";
    case Status::internal: return "internal error";
    case Status::out_of_memory: return "out of memory";
  }
  return "unknown status";
}

bool parse_dtype(std::string_view s, DType* out) {
  if (s == "f32" || s == "fp32" || s == "float32") { *out = DType::f32; return true; }
  if (s == "f16" || s == "fp16" || s == "float16") { *out = DType::f16; return true; }
  if (s == "bf16" || s == "bfloat16") { *out = DType::bf16; return true; }
  return false;
}

void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::bf16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
  }
}

namespace {

#if defined(__x86_64__)
// f32_to_bf16 eight at a time (the same bits: round to nearest even, NaN
// quieted); the index build converts its keys and queries this way.
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i high = _mm256_srli_epi32(x, 16);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, _mm256_and_si256(high, one))), 16);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
    // packus works within 128-bit lanes: r0-3 r0-3 | r4-7 r4-7, then 64-bit lanes 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
#endif

}  // namespace

void from_f32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::f32: std::memcpy(dst, src, n * 4); return;
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
#if defined(__x86_64__)
      if (cpu_has_avx2()) {
        f32_to_bf16_avx2(src, d, n);
        return;
      }
#endif
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
  }
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) { h ^= p[i]; h *= 0x100000001b3ull; }
  return h;
}

void write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFileWriter f(path);
  f.write(data.data(), data.size());
  f.commit();
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." +
         std::to_string(rd());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(Status::io_error, path_ + ": cannot create temporary file: " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::fail_io(const std::string& what) {
  const int e = errno;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  fail(Status::io_error, path_ + ": " + what + ": " + std::strerror(e));
}

void AtomicFileWriter::write_all(const char* p, size_t n) {
  size_t off = 0;
  while (off < n) {
    const ssize_t w = ::write(fd_, p + off, n - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_io("write failed");
    }
    off += size_t(w);
  }
}

void AtomicFileWriter::flush() {
  write_all(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  if (fd_ < 0) fail(Status::internal, path_ + ": write after commit or failure");
  if (n == 0) return;
  constexpr size_t kBuffer = size_t(1) << 20;
  size_ += n;
  if (buffer_.size() + n > kBuffer) flush();
  if (n > kBuffer) write_all(static_cast<const char*>(data), n);  // large blocks: no copy
  else buffer_.append(static_cast<const char*>(data), n);
}

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  if (fd_ < 0) fail(Status::internal, path_ + ": write after commit or failure");
  if (offset + n > size_) fail(Status::internal, path_ + ": write_at beyond the bytes written");
  flush();
  size_t off = 0;
  while (off < n) {
    const ssize_t w = ::pwrite(fd_, static_cast<const char*>(data) + off, n - off, off_t(offset + off));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_io("write failed");
    }
    off += size_t(w);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) fail(Status::internal, path_ + ": commit after commit or failure");
  flush();
  if (::fsync(fd_) != 0) fail_io("fsync failed");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail(Status::io_error, path_ + ": close failed: " + std::strerror(e));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    fail(Status::io_error, path_ + ": rename failed: " + std::strerror(e));
  }
}

namespace {
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  if (S_ISCHR(mode)) return "is a character device, not a regular file";
  if (S_ISBLK(mode)) return "is a block device, not a regular file";
  return "is not a regular file";
}
}  // namespace

int open_regular_file(const std::string& path, uint64_t* size) {
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; it is
  // refused below, and a regular file reads the same either way.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(Status::io_error, path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail(Status::io_error, path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(Status::io_error, path + ": " + file_kind(st.st_mode));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = uint64_t(st.st_size);
  return fd;
}

std::string read_file(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  std::string out;
  try {
    out.reserve(size_t(size));
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        fail(Status::io_error, path + ": read failed: " + std::strerror(errno));
      }
      out.append(buf, size_t(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

// ---- npy ----

size_t npy_type_size(NpyType t) {
  switch (t) {
    case NpyType::f32: case NpyType::i32: return 4;
    case NpyType::f16: case NpyType::u16: return 2;
    case NpyType::i64: return 8;
  }
  return 0;
}

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

static const char* npy_descr(NpyType t) {
  switch (t) {
    case NpyType::f32: return "<f4";
    case NpyType::f16: return "<f2";
    case NpyType::i32: return "<i4";
    case NpyType::i64: return "<i8";
    case NpyType::u16: return "<u2";
  }
  return "";
}

NpyArray read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

NpyArray parse_npy(std::string_view raw, const std::string& path) {
  auto bad = [&](const std::string& why) -> void { fail(Status::corrupt_data, path + ": not a valid .npy file: " + why); };
  if (raw.size() < 10 || raw.compare(0, 6, "\x93NUMPY") != 0) bad("missing magic");
  const int major = static_cast<unsigned char>(raw[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(raw[8]) | (size_t(static_cast<unsigned char>(raw[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (raw.size() < 12) bad("truncated header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t(static_cast<unsigned char>(raw[8 + i])) << (8 * i);
    header_start = 12;
  } else {
    bad("unsupported version " + std::to_string(major));
    return {};
  }
  if (raw.size() < header_start + header_len) bad("truncated header");
  const std::string header(raw.substr(header_start, header_len));
  NpyArray arr;
  auto field = [&](const char* key) -> std::string {
    size_t k = header.find(key);
    if (k == std::string::npos) bad(std::string("header lacks ") + key);
    size_t colon = header.find(':', k);
    if (colon == std::string::npos) bad("malformed header");
    return header.substr(colon + 1);
  };
  std::string descr = field("'descr'");
  size_t q1 = descr.find('\''), q2 = q1 == std::string::npos ? q1 : descr.find('\'', q1 + 1);
  if (q2 == std::string::npos) bad("malformed descr");
  descr = descr.substr(q1 + 1, q2 - q1 - 1);
  if (descr == "<f4") arr.type = NpyType::f32;
  else if (descr == "<f2") arr.type = NpyType::f16;
  else if (descr == "<i4") arr.type = NpyType::i32;
  else if (descr == "<i8") arr.type = NpyType::i64;
  else if (descr == "<u2") arr.type = NpyType::u16;
  else bad("unsupported dtype " + descr);
  std::string fo = field("'fortran_order'");
  if (fo.find("False") == std::string::npos || fo.find("False") > fo.find_first_of(",}")) bad("fortran_order arrays are not supported");
  std::string sh = field("'shape'");
  size_t lp = sh.find('('), rp = sh.find(')');
  if (lp == std::string::npos || rp == std::string::npos || rp < lp) bad("malformed shape");
  std::string dims = sh.substr(lp + 1, rp - lp - 1);
  size_t pos = 0;
  while (pos < dims.size()) {
    while (pos < dims.size() && (dims[pos] == ' ' || dims[pos] == ',')) ++pos;
    if (pos >= dims.size()) break;
    size_t end = pos;
    while (end < dims.size() && dims[end] >= '0' && dims[end] <= '9') ++end;
    if (end == pos || end - pos > 15) bad("malformed shape");
    arr.shape.push_back(std::stoll(dims.substr(pos, end - pos)));
    pos = end;
  }
  const size_t data_start = header_start + header_len;
  uint64_t need = npy_type_size(arr.type);
  for (auto d : arr.shape) {
    if (__builtin_mul_overflow(need, uint64_t(d), &need) || need > (uint64_t(1) << 50)) bad("shape too large");
  }
  if (raw.size() - data_start != size_t(need))
    bad("data holds " + std::to_string(raw.size() - data_start) + " bytes, shape needs " +
        std::to_string(int64_t(need)) + " (truncated?)");
  arr.bytes.assign(raw.begin() + long(data_start), raw.end());
  return arr;
}

void write_npy(const std::string& path, NpyType type, const std::vector<int64_t>& shape, const void* data) {
  std::string dict = std::string("{'descr': '") + npy_descr(type) + "', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
    n *= shape[i];
  }
  dict += "), }";
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  dict.append(pad, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += char(1);
  out += char(0);
  out += char(dict.size() & 0xff);
  out += char((dict.size() >> 8) & 0xff);
  out += dict;
  out.append(static_cast<const char*>(data), size_t(n) * npy_type_size(type));
  write_file_atomic(path, out);
}

}  // namespace rattn
