// Sequence save/load for prefix reuse. File layout (little-endian), as in
// runtime/sequence_format.h:
//   magic "RATTNSQ1" | u32 version | u32 flags (0) | u64 payload bytes |
//   payload | u64 fnv1a64(payload)
// payload: layout fingerprint, then per layer its static set, CPU store,
// pending-token count, window and pending queries, and index images (each
// index image is itself checksummed). Version 2 added the pending tokens,
// version 3 each query head's last search results (the next step's seeds,
// plan search_seeds), version 4 the insertion hints of the window's and the
// pending tokens (their own searches' results, where their insertion starts);
// older versions still load (no seeds for the first step, no hints: those
// tokens' insertions search), so only a version-4 or later image decodes
// exactly as the sequence it was taken from. Version 5 writes a query head
// that shares its group's first head's index (plan shared_graph) as a
// reference to it instead of a second image.
// The whole file is checked before any of it is used, and every length is
// bounds-checked while parsing, so a truncated or corrupted file is
// Error(corrupt_data), never a crash.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>

#include "core/atomic_file.h"
#include "core/error.h"
#include "runtime/layer_state.h"
#include "runtime/runtime.h"
#include "runtime/sequence_format.h"

namespace rattn {

using internal::KvHeadState;
using internal::LayerState;
using internal::QueryHeadState;

namespace internal {
// Where a sequence image goes: a file (save) or memory (clone).
class ImageSink {
 public:
  virtual ~ImageSink() = default;
  virtual void write(const void* data, size_t n) = 0;
  virtual void write_at(uint64_t offset, const void* data, size_t n) = 0;  // over bytes already written
};
}  // namespace internal

namespace {

class FileSink final : public internal::ImageSink {
 public:
  explicit FileSink(const std::string& path) : file_(path) {}
  void write(const void* data, size_t n) override { file_.write(data, n); }
  void write_at(uint64_t offset, const void* data, size_t n) override { file_.write_at(offset, data, n); }
  void commit() { file_.commit(); }

 private:
  AtomicFileWriter file_;
};

class StringSink final : public internal::ImageSink {
 public:
  void write(const void* data, size_t n) override { bytes.append(static_cast<const char*>(data), n); }
  void write_at(uint64_t offset, const void* data, size_t n) override {
    std::memcpy(bytes.data() + offset, data, n);
  }
  std::string bytes;
};

constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8;
constexpr size_t kTrailerBytes = 8;

// The payload, streamed to the sink with its length and checksum kept as it
// goes: a sequence is never copied whole into memory to be saved.
class Writer {
 public:
  explicit Writer(internal::ImageSink& sink) : sink_(sink) {}
  template <class T> void put(T v) { raw(&v, sizeof(T)); }
  void put_bytes(const void* p, size_t n) {
    put<uint64_t>(n);
    raw(p, n);
  }
  uint64_t bytes() const { return bytes_; }
  uint64_t checksum() const { return checksum_; }

 private:
  void raw(const void* p, size_t n) {
    if (n == 0) return;
    checksum_ = fnv1a64(p, n, checksum_);
    bytes_ += n;
    sink_.write(p, n);
  }
  internal::ImageSink& sink_;
  uint64_t bytes_ = 0;
  uint64_t checksum_ = fnv1a64(nullptr, 0);  // FNV-1a's offset basis
};

class Reader {
 public:
  Reader(std::string_view b, const std::string& path) : b_(b), path_(path) {}
  template <class T> T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  // A length-prefixed block that must be exactly `expected` bytes long.
  std::string_view block(uint64_t expected, const char* what) {
    const uint64_t n = get<uint64_t>();
    if (n != expected)
      corrupt(std::string(what) + " holds " + std::to_string(n) + " bytes, expected " +
              std::to_string(expected));
    return {take(n), size_t(n)};
  }
  // A length-prefixed block of any length.
  std::string_view any_block() {
    const uint64_t n = get<uint64_t>();
    return {take(n), size_t(n)};
  }
  const char* take(uint64_t n) {
    if (n > b_.size() - pos_) corrupt("truncated");
    const char* p = b_.data() + pos_;
    pos_ += size_t(n);
    return p;
  }
  bool at_end() const { return pos_ == b_.size(); }
  [[noreturn]] void corrupt(const std::string& what) const {
    fail(Status::corrupt_data, path_ + ": sequence file: " + what);
  }

 private:
  std::string_view b_;
  std::string path_;
  size_t pos_ = 0;
};

// Read-only mapping of a whole file (falls back to reading it for empty files).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    uint64_t size = 0;
    const int fd = open_regular_file(path, &size);
    size_ = size_t(size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const int e = errno;
        ::close(fd);
        fail(Status::io_error, path + ": cannot map: " + std::strerror(e));
      }
      data_ = static_cast<const char*>(p);
    }
    ::close(fd);
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {data_ ? data_ : "", size_}; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void Sequence::check_savable(const char* what) const {
  check_no_builds(what);
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l]->chunks)
      fail(Status::invalid_argument, std::string(what) + ": layer " + std::to_string(l) +
                                         " has a chunked prefill in progress (finish it with prefill_end)");
}

void Sequence::save(const std::string& path) const {
  check_savable("save");
  FileSink file(path);
  write_image(file);
  file.commit();
}

std::unique_ptr<Sequence> Sequence::clone() const {
  check_savable("clone");
  StringSink image;
  write_image(image);
  return load_image(runtime_, image.bytes, "clone of a sequence");
}

void Sequence::write_image(internal::ImageSink& file) const {
  const auto& c = runtime_->config();
  const auto& m = c.layout;
  file.write(kSequenceFileMagic, 8);
  const uint32_t version = kSequenceFileVersion, flags = 0;
  uint64_t payload_bytes = 0;  // written once known
  file.write(&version, 4);
  file.write(&flags, 4);
  file.write(&payload_bytes, 8);
  Writer w(file);
  w.put<uint32_t>(uint32_t(m.num_layers));
  w.put<uint32_t>(uint32_t(m.num_q_heads));
  w.put<uint32_t>(uint32_t(m.num_kv_heads));
  w.put<uint32_t>(uint32_t(m.head_dim));
  w.put<uint8_t>(uint8_t(c.kv_storage));
  w.put<int64_t>(c.plan.sinks);
  w.put<int64_t>(c.plan.window);
  for (const auto& stp : layers_) {
    const LayerState& st = *stp;
    w.put<uint8_t>(st.global);
    w.put<uint8_t>(st.prefilled);
    if (!st.prefilled) continue;
    w.put<int64_t>(st.sinks);
    w.put<int64_t>(st.window);
    w.put<int64_t>(st.tokens);
    w.put<int64_t>(st.sinks_filled);
    w.put<int64_t>(st.window_filled);
    w.put<int64_t>(st.ring_head);
    w.put<int64_t>(st.pending);
    for (const KvHeadState& kv : st.kv) {
      w.put_bytes(kv.static_keys.data(), kv.static_keys.size());
      w.put_bytes(kv.static_values.data(), kv.static_values.size());
      w.put<int64_t>(kv.cpu_keys.rows());
      const size_t n = size_t(kv.cpu_keys.rows()) * kv.cpu_keys.row_bytes();
      w.put_bytes(kv.cpu_keys.row(0), n);
      w.put_bytes(kv.cpu_values.row(0), n);
    }
    for (size_t h = 0; h < st.q.size(); ++h) {
      const QueryHeadState& qh = st.q[h];
      w.put_bytes(qh.window_queries.data(), qh.window_queries.size() * sizeof(float));
      w.put_bytes(qh.pending_queries.data(), qh.pending_queries.size() * sizeof(float));
      // The last search's ids: a loaded copy seeds its next search as the
      // original would (plan search_seeds), so both decode alike.
      w.put<int64_t>(int64_t(qh.found.ids.size()));
      w.put_bytes(qh.found.ids.data(), qh.found.ids.size() * sizeof(int32_t));
      for (const std::vector<int32_t>* hints :
           {&qh.window_hints, &qh.window_hint_count, &qh.pending_hints, &qh.pending_hint_count})
        w.put_bytes(hints->data(), hints->size() * sizeof(int32_t));
      // 0: none, 1: its own image follows, 2: the group's first head's index.
      const bool shared = st.shares_index(h);
      w.put<uint8_t>(shared ? 2 : qh.index != nullptr);
      if (qh.index && !shared) {
        std::string image;
        qh.index->serialize(&image);
        w.put_bytes(image.data(), image.size());
      }
    }
  }
  payload_bytes = w.bytes();
  const uint64_t checksum = w.checksum();
  file.write_at(kHeaderBytes - 8, &payload_bytes, 8);
  file.write(&checksum, 8);
}

std::unique_ptr<Sequence> Sequence::load(std::shared_ptr<const Runtime> runtime,
                                         const std::string& path) {
  MappedFile mapped(path);
  return load_image(std::move(runtime), mapped.bytes(), path);
}

std::unique_ptr<Sequence> Sequence::load_image(std::shared_ptr<const Runtime> runtime, std::string_view file,
                                               const std::string& path) {
  Reader header(file, path);
  if (file.size() < kHeaderBytes + kTrailerBytes) header.corrupt("truncated (" + std::to_string(file.size()) + " bytes)");
  if (std::memcmp(file.data(), kSequenceFileMagic, 8) != 0) header.corrupt("bad magic (not a rattn sequence file)");
  header.take(8);
  const uint32_t version = header.get<uint32_t>();
  if (version < kSequenceFileOldestVersion || version > kSequenceFileVersion)
    header.corrupt("unsupported version " + std::to_string(version) + " (this build reads " +
                   std::to_string(kSequenceFileOldestVersion) + " to " + std::to_string(kSequenceFileVersion) + ")");
  header.get<uint32_t>();  // flags
  const uint64_t payload_bytes = header.get<uint64_t>();
  if (payload_bytes != file.size() - kHeaderBytes - kTrailerBytes)
    header.corrupt("truncated or padded: header says " + std::to_string(payload_bytes) +
                   " payload bytes, file has " + std::to_string(file.size() - kHeaderBytes - kTrailerBytes));
  const std::string_view payload = file.substr(kHeaderBytes, size_t(payload_bytes));
  uint64_t stored;
  std::memcpy(&stored, file.data() + kHeaderBytes + payload_bytes, 8);
  if (stored != fnv1a64(payload.data(), payload.size())) header.corrupt("checksum mismatch");

  const auto& c = runtime->config();
  const auto& m = c.layout;
  const int d = m.head_dim;
  Reader r(payload, path);
  const uint32_t layers = r.get<uint32_t>(), hq = r.get<uint32_t>(), hkv = r.get<uint32_t>(),
                 dim = r.get<uint32_t>();
  const uint8_t dtype = r.get<uint8_t>();
  const int64_t sinks = r.get<int64_t>(), window = r.get<int64_t>();
  if (layers != uint32_t(m.num_layers) || hq != uint32_t(m.num_q_heads) ||
      hkv != uint32_t(m.num_kv_heads) || dim != uint32_t(d) || dtype != uint8_t(c.kv_storage) ||
      sinks != c.plan.sinks || window != c.plan.window)
    fail(Status::invalid_argument,
         path + ": sequence file was saved by a context with a different layout or plan (layers " +
             std::to_string(layers) + ", q heads " + std::to_string(hq) + ", kv heads " +
             std::to_string(hkv) + ", head_dim " + std::to_string(dim) + ", sinks " +
             std::to_string(sinks) + ", window " + std::to_string(window) + ")");

  auto seq = std::make_unique<Sequence>(runtime);
  const size_t row_bytes = size_t(d) * dtype_size(c.kv_storage);
  for (auto& stp : seq->layers_) {
    LayerState& st = *stp;
    const bool global = r.get<uint8_t>() != 0;
    const bool prefilled = r.get<uint8_t>() != 0;
    if (global != st.global) r.corrupt("layer kinds differ from the context's model");
    if (!prefilled) continue;
    const int64_t sink_cap = r.get<int64_t>(), window_cap = r.get<int64_t>();
    if (sink_cap != st.sinks || window_cap != st.window) r.corrupt("static set capacity differs");
    st.tokens = r.get<int64_t>();
    st.sinks_filled = r.get<int64_t>();
    st.window_filled = r.get<int64_t>();
    st.ring_head = r.get<int64_t>();
    st.pending = version >= 2 ? r.get<int64_t>() : 0;
    if (st.pending < 0 || (!st.global && st.pending != 0)) r.corrupt("bad pending token count");
    if (st.sinks_filled < 0 || st.sinks_filled > st.sinks || st.window_filled < 0 ||
        st.window_filled > st.window || st.ring_head < 0 || st.ring_head >= std::max<int64_t>(st.window, 1) ||
        (st.window_filled > 0 && st.sinks_filled < st.sinks) || st.tokens < st.static_rows() ||
        st.static_rows() == 0)
      r.corrupt("inconsistent static set counters");
    const uint64_t static_bytes = uint64_t(st.static_capacity()) * row_bytes;
    int64_t cpu_rows_0 = -1;
    for (KvHeadState& kv : st.kv) {
      std::string_view sk = r.block(static_bytes, "static keys");
      std::string_view sv = r.block(static_bytes, "static values");
      kv.static_keys.assign(sk.begin(), sk.end());
      kv.static_values.assign(sv.begin(), sv.end());
      const int64_t rows = r.get<int64_t>();
      if (rows < 0 || uint64_t(rows) > payload.size() / std::max<size_t>(row_bytes, 1))
        r.corrupt("CPU store row count out of range");
      if (cpu_rows_0 >= 0 && rows != cpu_rows_0) r.corrupt("KV heads hold different token counts");
      cpu_rows_0 = rows;
      if (!st.global && rows != 0) r.corrupt("a local layer holds offloaded tokens");
      if (st.global && rows != st.tokens - st.static_rows()) r.corrupt("token counts disagree");
      if (st.pending > rows) r.corrupt("more pending tokens than offloaded tokens");
      std::string_view ck = r.block(uint64_t(rows) * row_bytes, "CPU keys");
      std::string_view cv = r.block(uint64_t(rows) * row_bytes, "CPU values");
      kv.cpu_keys.reserve(rows + 4096);
      kv.cpu_values.reserve(rows + 4096);
      kv.cpu_keys.append_raw(ck.data(), rows);
      kv.cpu_values.append_raw(cv.data(), rows);
    }
    for (size_t h = 0; h < st.q.size(); ++h) {
      QueryHeadState& qh = st.q[h];
      std::string_view wq = r.block(uint64_t(st.window) * uint64_t(d) * sizeof(float), "window queries");
      qh.window_queries.resize(size_t(st.window) * size_t(d));
      std::memcpy(qh.window_queries.data(), wq.data(), wq.size());
      if (version >= 2) {
        std::string_view pq = r.block(uint64_t(st.pending) * uint64_t(d) * sizeof(float), "pending queries");
        qh.pending_queries.resize(size_t(st.pending) * size_t(d));
        if (!pq.empty()) std::memcpy(qh.pending_queries.data(), pq.data(), pq.size());
      }
      if (version >= 3) {
        const int64_t n_found = r.get<int64_t>();
        if (n_found < 0 || n_found > cpu_rows_0) r.corrupt("bad count of last search results");
        std::string_view ids = r.block(uint64_t(n_found) * sizeof(int32_t), "last search results");
        qh.found.ids.resize(size_t(n_found));
        if (n_found > 0) std::memcpy(qh.found.ids.data(), ids.data(), ids.size());
        for (const int32_t id : qh.found.ids)
          if (id < 0 || id >= cpu_rows_0) r.corrupt("a last search result outside the CPU store");
      }
      qh.clear_hints(st.window, st.pending);  // before version 4: the loaded tokens' insertions search
      if (version >= 4) {
        auto read_ints = [&](std::vector<int32_t>& into, const char* what) {
          const std::string_view b = r.block(uint64_t(into.size()) * sizeof(int32_t), what);
          if (!b.empty()) std::memcpy(into.data(), b.data(), b.size());
        };
        read_ints(qh.window_hints, "window insertion hints");
        read_ints(qh.window_hint_count, "window insertion hint counts");
        read_ints(qh.pending_hints, "pending insertion hints");
        read_ints(qh.pending_hint_count, "pending insertion hint counts");
        // Hints are entry points of an insertion: rows of the CPU store.
        auto check_hints = [&](const std::vector<int32_t>& hints, const std::vector<int32_t>& counts) {
          for (size_t t = 0; t < counts.size(); ++t) {
            if (counts[t] < 0 || counts[t] > internal::kInsertHints) r.corrupt("bad insertion hint count");
            for (int i = 0; i < counts[t]; ++i) {
              const int32_t id = hints[t * size_t(internal::kInsertHints) + size_t(i)];
              if (id < 0 || id >= cpu_rows_0) r.corrupt("an insertion hint outside the CPU store");
            }
          }
        };
        check_hints(qh.window_hints, qh.window_hint_count);
        check_hints(qh.pending_hints, qh.pending_hint_count);
      }
      const uint8_t index_kind = r.get<uint8_t>();
      if (index_kind > (version >= 5 ? 2 : 1)) r.corrupt("bad index kind");
      const bool has_index = index_kind != 0;
      if (has_index != (c.plan.top_k > 0))
        fail(Status::invalid_argument, path + ": sequence file was saved with retrieval " +
                                           (has_index ? "on" : "off") + ", the context has it " +
                                           (has_index ? "off" : "on"));
      if (!has_index) continue;
      if (index_kind == 2) {
        const size_t first = h / size_t(st.group()) * size_t(st.group());
        if (first == h || !st.q[first].index) r.corrupt("a shared index with no index to share");
        qh.index = st.q[first].index;
        qh.scratch = qh.index->make_scratch();
        continue;
      }
      qh.index = deserialize_index(r.any_block());
      runtime->apply_insert_params(*qh.index);
      if (qh.index->size() > cpu_rows_0 - st.pending) r.corrupt("index larger than the CPU store's indexed part");
      qh.scratch = qh.index->make_scratch();
    }
    internal::share_traversal_codes(st, c);
    st.gpu = runtime->open_gpu_stream(st.static_capacity());
    internal::upload_static_set_to_gpu(st, d, c.kv_storage);
    st.prefilled = true;
  }
  if (!r.at_end()) r.corrupt("trailing bytes after the last layer");
  return seq;
}

}  // namespace rattn
