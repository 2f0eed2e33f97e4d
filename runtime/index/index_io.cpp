// Image framing (header + checksum) and deserialize_index's dispatch by kind.
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"
#include "runtime/index/key_index.h"
#include "runtime/index/serial.h"

namespace rattn {
namespace internal {

std::unique_ptr<KeyIndex> load_brute_force(std::string_view payload, uint32_t version);
std::unique_ptr<KeyIndex> load_projected_graph(std::string_view payload, uint32_t version);

void append_index_image(std::string* out, IndexKind kind, uint32_t version, const std::string& payload) {
  ByteWriter w;
  w.append(kIndexMagic, sizeof(kIndexMagic));
  w.put<uint32_t>(version);
  w.put<uint32_t>(uint32_t(kind));
  w.put<uint64_t>(payload.size());
  w.append(payload.data(), payload.size());
  w.put<uint64_t>(fnv1a64(payload.data(), payload.size()));
  out->append(w.bytes());
}

std::string_view open_index_image(std::string_view bytes, IndexKind* kind, uint32_t* version) {
  constexpr size_t kHeader = sizeof(kIndexMagic) + 4 + 4 + 8;
  if (bytes.size() < kHeader + 8) fail(Status::corrupt_data, "index image: truncated header");
  if (std::string_view(bytes.data(), sizeof(kIndexMagic)) != std::string_view(kIndexMagic, sizeof(kIndexMagic)))
    fail(Status::corrupt_data, "index image: bad magic (not a rattn index)");
  ByteReader r(bytes.substr(sizeof(kIndexMagic)));
  *version = r.get<uint32_t>();
  *kind = IndexKind(r.get<uint32_t>());
  const uint64_t n = r.get<uint64_t>();
  if (n != bytes.size() - kHeader - 8)
    fail(Status::corrupt_data, "index image: payload length " + std::to_string(n) + " does not match the " +
                                   std::to_string(bytes.size()) + "-byte image (truncated?)");
  std::string_view payload = bytes.substr(kHeader, n);
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + kHeader + n, 8);
  if (sum != fnv1a64(payload.data(), payload.size())) fail(Status::corrupt_data, "index image: checksum mismatch");
  return payload;
}

}  // namespace internal

std::unique_ptr<KeyIndex> deserialize_index(std::string_view bytes) {
  internal::IndexKind kind;
  uint32_t version;
  std::string_view payload = internal::open_index_image(bytes, &kind, &version);
  switch (kind) {
    case internal::IndexKind::brute_force: return internal::load_brute_force(payload, version);
    case internal::IndexKind::projected_graph: return internal::load_projected_graph(payload, version);
  }
  fail(Status::corrupt_data, "index image: unknown index kind " + std::to_string(uint32_t(kind)));
}

}  // namespace rattn
