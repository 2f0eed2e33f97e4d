// check_sequence_file and its seeds (loaders.h): the C API's sequence loader.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/atomic_file.h"
#include "rattn.h"
#include "runtime/sequence_format.h"
#include "tests/fuzz/loaders.h"

namespace rattn::fuzz {
namespace {

constexpr int kLayers = 2, kHq = 2, kHkv = 1, kDim = 4;

// One context for every input (made on first use, kept for the process).
rattn_context* context() {
  static rattn_context* ctx = [] {
    rattn_context_params p = rattn_context_default_params();
    p.n_layers = kLayers;
    p.n_q_heads = kHq;
    p.n_kv_heads = kHkv;
    p.head_dim = kDim;
    p.sinks = 2;
    p.window = 4;
    p.top_k = 3;
    p.search_queue = 6;
    p.index_kind = RATTN_INDEX_EXACT;  // graph indexes start at 2048 keys: index images have their own target
    p.kernels = RATTN_KERNELS_REFERENCE;
    p.n_threads = 1;
    rattn_context* c = nullptr;
    if (rattn_context_create(&p, &c) != RATTN_OK) std::abort();
    return c;
  }();
  return ctx;
}

std::string temp_path() {
  return (std::filesystem::temp_directory_path() / ("rattn_fuzz_seq_" + std::to_string(::getpid()) + ".bin")).string();
}

void fill(float* x, int n, int seed) {
  for (int i = 0; i < n; ++i) x[i] = float(std::sin(0.37 * double(i) + 1.1 * double(seed)));
}

}  // namespace

std::string check_sequence_file(const uint8_t* data, size_t size) { return check_sequence_file(data, size, nullptr); }

std::string check_sequence_file(const uint8_t* data, size_t size, bool* loaded) {
  if (loaded) *loaded = false;
  if (size == 0) return {};
  std::string file;
  if ((data[0] & 1) == 0) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    if (size < 2) return {};
    const std::string payload(reinterpret_cast<const char*>(data + 2), size - 2);
    const uint32_t version = data[1] % (kSequenceFileVersion + 1), flags = 0;  // 0 (refused) to the newest
    const uint64_t bytes = payload.size(), sum = fnv1a64(payload.data(), payload.size());
    file.append(kSequenceFileMagic, 8);
    file.append(reinterpret_cast<const char*>(&version), 4);
    file.append(reinterpret_cast<const char*>(&flags), 4);
    file.append(reinterpret_cast<const char*>(&bytes), 8);
    file += payload;
    file.append(reinterpret_cast<const char*>(&sum), 8);
  }
  const std::string path = temp_path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(file.data(), std::streamsize(file.size()));
    if (!out) return "cannot write " + path;
  }
  rattn_context* ctx = context();
  rattn_sequence* seq = nullptr;
  const rattn_status st = rattn_sequence_load(ctx, path.c_str(), &seq);
  std::filesystem::remove(path);
  if (st != RATTN_OK) {
    if (seq) return "a failed load returned a sequence";
    if (st == RATTN_INTERNAL) return std::string("internal error: ") + rattn_context_last_error(ctx);
    if (std::strlen(rattn_context_last_error(ctx)) == 0) return "a failed load left no message";
    return {};
  }
  if (loaded) *loaded = true;
  std::string finding;
  float q[kHq * kDim], k[kHkv * kDim], v[kHkv * kDim], o[kHq * kDim];
  fill(q, kHq * kDim, 1);
  fill(k, kHkv * kDim, 2);
  fill(v, kHkv * kDim, 3);
  for (int layer = 0; layer < kLayers && finding.empty(); ++layer) {
    const int64_t before = rattn_sequence_n_tokens(seq, layer);
    const rattn_status ds = rattn_sequence_decode(seq, layer, q, k, v, RATTN_F32, o, nullptr);
    if (ds == RATTN_INTERNAL) finding = std::string("decode: internal error: ") + rattn_context_last_error(ctx);
    else if (ds == RATTN_OK && rattn_sequence_n_tokens(seq, layer) != before + 1)
      finding = "decode did not add a token to layer " + std::to_string(layer);
  }
  rattn_sequence_free(seq);
  return finding;
}

std::vector<Seed> sequence_seeds() {
  rattn_context* ctx = context();
  std::vector<Seed> seeds;
  const std::string path = temp_path();
  for (int decoded = 0; decoded <= 1; ++decoded) {
    rattn_sequence* seq = nullptr;
    if (rattn_sequence_create(ctx, &seq) != RATTN_OK) std::abort();
    constexpr int n = 12;
    float q[kHq * n * kDim], k[kHkv * n * kDim], v[kHkv * n * kDim], o[kHq * kDim];
    for (int layer = 0; layer < kLayers; ++layer) {
      fill(q, kHq * n * kDim, 10 * layer + 1);
      fill(k, kHkv * n * kDim, 10 * layer + 2);
      fill(v, kHkv * n * kDim, 10 * layer + 3);
      if (rattn_sequence_prefill(seq, layer, n, q, k, v, RATTN_F32) != RATTN_OK) std::abort();
      // A decoded token leaves last search results and insertion hints in the file (versions 3, 4).
      if (decoded && rattn_sequence_decode(seq, layer, q, k, v, RATTN_F32, o, nullptr) != RATTN_OK) std::abort();
    }
    if (rattn_sequence_save(seq, path.c_str()) != RATTN_OK) std::abort();
    rattn_sequence_free(seq);
    std::ifstream in(path, std::ios::binary);
    const std::string file{std::istreambuf_iterator<char>(in), {}};
    std::filesystem::remove(path);
    std::vector<uint8_t> whole{0};
    whole.insert(whole.end(), file.begin(), file.end());
    seeds.push_back({"sequence-" + std::to_string(decoded), whole});
    // The payload alone: after the 24-byte header, before the 8-byte checksum.
    uint32_t version;
    std::memcpy(&version, file.data() + 8, 4);
    std::vector<uint8_t> wrapped{1, uint8_t(version)};
    wrapped.insert(wrapped.end(), file.begin() + 24, file.end() - 8);
    seeds.push_back({"sequence-payload-" + std::to_string(decoded), wrapped});
  }
  return seeds;
}

}  // namespace rattn::fuzz
