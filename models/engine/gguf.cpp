#include "models/engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "core/atomic_file.h"
#include "core/error.h"

namespace rattn::engine {

const char* ggml_type_name(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: return "F32";
    case GgmlType::f16: return "F16";
    case GgmlType::q4_0: return "Q4_0";
    case GgmlType::q4_1: return "Q4_1";
    case GgmlType::q5_0: return "Q5_0";
    case GgmlType::q5_1: return "Q5_1";
    case GgmlType::q8_0: return "Q8_0";
    case GgmlType::q8_1: return "Q8_1";
    case GgmlType::q2_k: return "Q2_K";
    case GgmlType::q3_k: return "Q3_K";
    case GgmlType::q4_k: return "Q4_K";
    case GgmlType::q5_k: return "Q5_K";
    case GgmlType::q6_k: return "Q6_K";
    case GgmlType::q8_k: return "Q8_K";
    case GgmlType::bf16: return "BF16";
  }
  return "unknown";
}

namespace {

// (block size in values, bytes per block) of the types whose layout we know.
bool block_layout(uint32_t type, int* values, int* bytes) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::f32: *values = 1; *bytes = 4; return true;
    case GgmlType::f16: *values = 1; *bytes = 2; return true;
    case GgmlType::bf16: *values = 1; *bytes = 2; return true;
    case GgmlType::q4_0: *values = 32; *bytes = 18; return true;
    case GgmlType::q4_1: *values = 32; *bytes = 20; return true;
    case GgmlType::q5_0: *values = 32; *bytes = 22; return true;
    case GgmlType::q5_1: *values = 32; *bytes = 24; return true;
    case GgmlType::q8_0: *values = 32; *bytes = 34; return true;
    case GgmlType::q2_k: *values = 256; *bytes = 84; return true;
    case GgmlType::q3_k: *values = 256; *bytes = 110; return true;
    case GgmlType::q4_k: *values = 256; *bytes = 144; return true;
    case GgmlType::q5_k: *values = 256; *bytes = 176; return true;
    case GgmlType::q6_k: *values = 256; *bytes = 210; return true;
    default: return false;
  }
}

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& name) : p_(p), n_(n), name_(name) {}
  size_t pos() const { return pos_; }
  [[noreturn]] void corrupt(const std::string& what) const {
    fail(Status::corrupt_data, "GGUF file '" + name_ + "': " + what + " (at byte " +
                                   std::to_string(pos_) + " of " + std::to_string(n_) + ")");
  }
  void need(size_t k, const char* what) const {
    if (k > n_ - pos_) corrupt(std::string("truncated while reading ") + what);
  }
  template <class T> T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > (1u << 30)) corrupt(std::string("implausible string length in ") + what);
    need(size_t(len), what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& name_;
};

GgufValue read_value(Reader& r, GgufValueType t, const std::string& key, int depth) {
  GgufValue out;
  out.type = t;
  switch (t) {
    case GgufValueType::u8: out.v = uint64_t(r.read<uint8_t>(key.c_str())); break;
    case GgufValueType::i8: out.v = int64_t(r.read<int8_t>(key.c_str())); break;
    case GgufValueType::u16: out.v = uint64_t(r.read<uint16_t>(key.c_str())); break;
    case GgufValueType::i16: out.v = int64_t(r.read<int16_t>(key.c_str())); break;
    case GgufValueType::u32: out.v = uint64_t(r.read<uint32_t>(key.c_str())); break;
    case GgufValueType::i32: out.v = int64_t(r.read<int32_t>(key.c_str())); break;
    case GgufValueType::u64: out.v = r.read<uint64_t>(key.c_str()); break;
    case GgufValueType::i64: out.v = r.read<int64_t>(key.c_str()); break;
    case GgufValueType::f32: out.v = double(r.read<float>(key.c_str())); break;
    case GgufValueType::f64: out.v = r.read<double>(key.c_str()); break;
    case GgufValueType::boolean: {
      const uint8_t b = r.read<uint8_t>(key.c_str());
      if (b > 1) r.corrupt("boolean value of '" + key + "' is " + std::to_string(b));
      out.v = b != 0;
      break;
    }
    case GgufValueType::string: out.v = r.read_string(key.c_str()); break;
    case GgufValueType::array: {
      if (depth > 4) r.corrupt("arrays nested too deeply in '" + key + "'");
      const uint32_t et = r.read<uint32_t>(key.c_str());
      if (et > uint32_t(GgufValueType::f64)) r.corrupt("unknown array element type " + std::to_string(et) + " of '" + key + "'");
      const uint64_t n = r.read<uint64_t>(key.c_str());
      // Each element takes at least one byte: reject counts the file cannot hold
      // before allocating.
      r.need(size_t(std::min<uint64_t>(n, uint64_t(1) << 40)), key.c_str());
      auto arr = std::make_shared<GgufArray>();
      arr->reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) arr->push_back(read_value(r, GgufValueType(et), key, depth + 1));
      out.elem_type = GgufValueType(et);
      out.v = std::move(arr);
      break;
    }
    default: r.corrupt("unknown value type " + std::to_string(uint32_t(t)) + " of '" + key + "'");
  }
  return out;
}

}  // namespace

int ggml_block_size(uint32_t type) {
  int v, b;
  if (!block_layout(type, &v, &b))
    fail(Status::unsupported, std::string("ggml tensor type ") + std::to_string(type) + " (" + ggml_type_name(type) + ") is not supported");
  return v;
}

size_t ggml_row_bytes(uint32_t type, int64_t n) {
  int v, b;
  if (!block_layout(type, &v, &b))
    fail(Status::unsupported, std::string("ggml tensor type ") + std::to_string(type) + " (" + ggml_type_name(type) + ") is not supported");
  return size_t(n / v) * size_t(b);
}

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::unique_ptr<GgufFile> GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->name_ = name;
  Reader r(data, size, f->name_);
  r.need(4, "magic");
  if (std::memcmp(data, "GGUF", 4) != 0) r.corrupt("bad magic (not a GGUF file)");
  r.read<uint32_t>("magic");
  f->version_ = r.read<uint32_t>("version");
  if (f->version_ < 2 || f->version_ > 3) r.corrupt("unsupported GGUF version " + std::to_string(f->version_));
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  if (n_tensors > size / 8 || n_kv > size / 8) r.corrupt("implausible tensor or metadata count for the file size (truncated or corrupt)");
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.read_string("metadata key");
    const uint32_t t = r.read<uint32_t>("metadata value type");
    if (t > uint32_t(GgufValueType::f64)) r.corrupt("unknown value type " + std::to_string(t) + " of '" + key + "'");
    GgufValue v = read_value(r, GgufValueType(t), key, 0);
    f->kv_[key] = std::move(v);
  }
  if (f->has("general.alignment")) {
    const int64_t a = f->get_int("general.alignment");
    if (a <= 0 || (a & (a - 1)) != 0) r.corrupt("general.alignment " + std::to_string(a) + " is not a power of two");
    f->alignment_ = uint64_t(a);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.read_string("tensor name");
    const uint32_t nd = r.read<uint32_t>("tensor rank");
    if (nd == 0 || nd > 4) r.corrupt("tensor '" + t.name + "' has rank " + std::to_string(nd));
    int64_t elements = 1;  // bounded as it grows, so that elements() cannot overflow
    for (uint32_t d = 0; d < nd; ++d) {
      const int64_t v = r.read<int64_t>("tensor dimension");
      if (v <= 0 || v > (int64_t(1) << 40)) r.corrupt("tensor '" + t.name + "' has dimension " + std::to_string(v));
      if (v > (int64_t(1) << 40) / elements) r.corrupt("tensor '" + t.name + "' is implausibly large");
      elements *= v;
      t.dims.push_back(v);
    }
    t.type = r.read<uint32_t>("tensor type");
    t.offset = r.read<uint64_t>("tensor offset");
    int bv, bb;
    if (!block_layout(t.type, &bv, &bb))
      fail(Status::unsupported, "GGUF file '" + name + "': tensor '" + t.name + "' has type " +
                                    std::to_string(t.type) + " (" + ggml_type_name(t.type) + "), which this engine cannot read");
    if (t.dims[0] % bv != 0) r.corrupt("tensor '" + t.name + "' row length is not a multiple of its block size");
    t.bytes = ggml_row_bytes(t.type, t.dims[0]) * size_t(t.rows());
    if (f->tensor_index_.count(t.name)) r.corrupt("duplicate tensor '" + t.name + "'");
    f->tensor_index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  const uint64_t a = f->alignment_;
  const uint64_t data_start = (uint64_t(r.pos()) + a - 1) / a * a;
  for (auto& t : f->tensors_) {
    if (t.offset % a != 0) r.corrupt("tensor '" + t.name + "' offset is not aligned to " + std::to_string(a));
    if (data_start > size || t.offset > size - data_start || t.bytes > size - data_start - t.offset)
      r.corrupt("tensor '" + t.name + "' data lies past the end of the file (file truncated?)");
    t.data = data + data_start + t.offset;
  }
  return f;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  uint64_t file_size = 0;
  const int fd = open_regular_file(path, &file_size);
  const size_t size = size_t(file_size);
  if (size == 0) {
    ::close(fd);
    fail(Status::corrupt_data, "GGUF file '" + path + "' is empty");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) fail(Status::io_error, "cannot map '" + path + "'");
  std::unique_ptr<GgufFile> f;
  try {
    f = parse(static_cast<const uint8_t*>(map), size, path);
  } catch (...) {
    ::munmap(map, size);
    throw;
  }
  f->map_ = map;
  f->map_size_ = size;
  return f;
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, map_size_);
}

namespace {
const GgufValue& lookup(const std::map<std::string, GgufValue>& kv, const std::string& key, const std::string& file) {
  auto it = kv.find(key);
  if (it == kv.end()) fail(Status::not_found, "GGUF file '" + file + "' has no metadata key '" + key + "'");
  return it->second;
}
}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = lookup(kv_, key, name_);
  if (auto* u = std::get_if<uint64_t>(&v.v)) return int64_t(*u);
  if (auto* i = std::get_if<int64_t>(&v.v)) return *i;
  fail(Status::corrupt_data, "GGUF file '" + name_ + "': metadata '" + key + "' is not an integer");
}
int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = lookup(kv_, key, name_);
  if (auto* d = std::get_if<double>(&v.v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v.v)) return double(*u);
  if (auto* i = std::get_if<int64_t>(&v.v)) return double(*i);
  fail(Status::corrupt_data, "GGUF file '" + name_ + "': metadata '" + key + "' is not a number");
}
double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const GgufValue& v = lookup(kv_, key, name_);
  if (auto* b = std::get_if<bool>(&v.v)) return *b;
  fail(Status::corrupt_data, "GGUF file '" + name_ + "': metadata '" + key + "' is not a boolean");
}
std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = lookup(kv_, key, name_);
  if (auto* s = std::get_if<std::string>(&v.v)) return *s;
  fail(Status::corrupt_data, "GGUF file '" + name_ + "': metadata '" + key + "' is not a string");
}
const GgufArray& GgufFile::get_array(const std::string& key) const {
  const GgufValue& v = lookup(kv_, key, name_);
  if (auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v)) return **a;
  fail(Status::corrupt_data, "GGUF file '" + name_ + "': metadata '" + key + "' is not an array");
}
const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) fail(Status::not_found, "GGUF file '" + name_ + "' has no tensor '" + name + "'");
  return *t;
}

}  // namespace rattn::engine
