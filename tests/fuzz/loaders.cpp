#include "tests/fuzz/loaders.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/npy.h"
#include "kernels/kv_store.h"
#include "models/engine/gguf.h"
#include "models/engine/quant.h"
#include "models/engine/tokenizer.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/key_index.h"
#include "runtime/index/projected_graph.h"
#include "runtime/index/serial.h"
#include "tests/models/engine/gguf_builder.h"

namespace rattn::fuzz {
namespace {

constexpr int kDim = 8;               // the seeds' head dimension
constexpr int64_t kMaxRows = 4096;    // larger loaded indexes are not exercised (keeps each input cheap)
constexpr int64_t kMaxElements = 1 << 16;  // nor larger GGUF tensors dequantised

// Runs `body`; a rattn::Error is an accepted outcome, any other exception a finding.
template <class F> std::string guarded(F&& body) {
  try {
    return body();
  } catch (const Error&) {
    return {};
  } catch (const std::exception& e) {
    return std::string("exception other than rattn::Error: ") + e.what();
  }
}

void fill_key(int64_t i, float* row) {
  for (int j = 0; j < kDim; ++j) row[j] = float(std::sin(0.7 * double(i) + 1.3 * double(j)));
}

std::string check_result(const SearchResult& r, int k, int64_t rows, const char* what) {
  if (int(r.ids.size()) > k || r.ids.size() != r.scores.size())
    return std::string(what) + ": result sizes " + std::to_string(r.ids.size()) + " / " +
           std::to_string(r.scores.size());
  for (int32_t id : r.ids)
    if (id < 0 || id >= rows) return std::string(what) + ": id " + std::to_string(id) + " outside the store";
  if (r.keys_scored < 0) return std::string(what) + ": negative keys_scored";
  return {};
}

// Searches a loaded index in every mode, inserts a key, and searches again.
std::string exercise(KeyIndex& index) {
  const int64_t rows = is_projected_graph(index) ? projected_graph_info(index).nodes : index.size();
  if (rows < 0) return "negative node count";
  if (rows > kMaxRows) return {};
  RowStore keys(DType::f32, kDim);
  float row[kDim];
  for (int64_t i = 0; i < rows; ++i) {
    fill_key(i, row);
    keys.append_f32(row, 1);
  }
  float query[kDim];
  for (int j = 0; j < kDim; ++j) query[j] = float(std::cos(0.3 * j));
  const int32_t seeds[] = {0, int32_t(rows) - 1, 1 << 30, -5};
  auto scratch = index.make_scratch();
  SearchResult r;
  struct Mode {
    const char* name;
    bool codes;
    int code_dims, coarse;
  };
  const Mode modes[] = {{"exact walk", false, 0, 0}, {"codes", true, 0, 0}, {"projected codes", true, 6, 2}};
  for (const Mode& m : modes) {
    SearchParams sp;
    sp.k = 5;
    sp.queue_length = 12;
    sp.traversal_codes = m.codes;
    sp.code_dims = m.code_dims;
    sp.code_coarse_dims = m.coarse;
    sp.seeds = seeds;
    sp.num_seeds = 4;
    try {
      index.search(query, keys.view(), sp, *scratch, r);
    } catch (const Error&) {
      continue;  // e.g. codes that this image's parameters cannot fit
    }
    if (std::string bad = check_result(r, sp.k, rows, m.name); !bad.empty()) return bad;
  }
  fill_key(rows, row);
  keys.append_f32(row, 1);
  index.insert(int32_t(rows), query, keys.view());
  SearchParams sp;
  sp.k = 5;
  sp.queue_length = 12;
  index.search(query, keys.view(), sp, *scratch, r);
  return check_result(r, sp.k, rows + 1, "search after insert");
}

}  // namespace

std::string index_image_of(const uint8_t* data, size_t size) {
  std::string image;
  if (size == 0) return image;
  if ((data[0] & 1) == 0) {
    image.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else if (size >= 3) {
    const auto kind = internal::IndexKind(1 + (data[1] & 1));
    internal::append_index_image(&image, kind, data[2], std::string(reinterpret_cast<const char*>(data + 3), size - 3));
  }
  return image;
}

std::string check_index_image(const uint8_t* data, size_t size) {
  const std::string image = index_image_of(data, size);
  if (image.empty()) return {};
  return guarded([&] {
    std::unique_ptr<KeyIndex> index = deserialize_index(image);
    return exercise(*index);
  });
}

std::string check_npy(const uint8_t* data, size_t size) {
  return guarded([&]() -> std::string {
    const NpyArray a = parse_npy(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    uint64_t n = 1;
    for (int64_t d : a.shape) {
      if (d < 0) return "negative dimension " + std::to_string(d);
      n *= uint64_t(d);
    }
    if (a.bytes.size() != n * npy_type_size(a.type))
      return "array holds " + std::to_string(a.bytes.size()) + " bytes for " + std::to_string(n) + " elements";
    // The calibration reader's range check against a plain scan.
    if (a.type == NpyType::f32 || a.type == NpyType::f16) {
      const DType t = a.type == NpyType::f32 ? DType::f32 : DType::f16;
      int64_t plain = -1;
      for (size_t i = 0; i < size_t(n) && plain < 0; ++i) {
        const float x = value_at(t, a.bytes.data(), i);
        if (!std::isfinite(x) || std::fabs(x) >= float(kMaxInputMagnitude)) plain = int64_t(i);
      }
      const int64_t fast = first_out_of_range(t, a.bytes.data(), size_t(n), DType::f32);
      if (fast != plain)
        return "first_out_of_range says " + std::to_string(fast) + ", a plain scan " + std::to_string(plain);
    }
    return {};
  });
}

std::string check_gguf(const uint8_t* data, size_t size) {
  using namespace engine;
  return guarded([&]() -> std::string {
    const std::unique_ptr<GgufFile> f = GgufFile::parse(data, size, "fuzz.gguf");
    for (const GgufTensor& t : f->tensors()) {
      if (t.bytes > 0 && (t.data < data || t.bytes > size || t.data > data + size - t.bytes))
        return "tensor '" + t.name + "' lies outside the file";
      if (t.dims.empty() || t.elements() > kMaxElements) continue;
      try {
        const int64_t cols = t.dims[0];
        const size_t row_bytes = ggml_row_bytes(t.type, cols);
        if (row_bytes * size_t(t.rows()) > t.bytes)
          return "tensor '" + t.name + "': rows need " + std::to_string(row_bytes * size_t(t.rows())) +
                 " bytes, it has " + std::to_string(t.bytes);
        std::vector<float> out(static_cast<size_t>(cols));
        for (int64_t r = 0; r < t.rows(); ++r) dequantize(t.type, t.data + size_t(r) * row_bytes, out.data(), cols);
      } catch (const Error&) {
      }
    }
    for (const auto& [key, value] : f->metadata()) {
      (void)value;
      try {
        (void)f->get_int(key);
      } catch (const Error&) {
      }
      try {
        (void)f->get_float(key);
      } catch (const Error&) {
      }
      try {
        (void)f->get_string(key);
      } catch (const Error&) {
      }
      try {
        (void)f->get_bool(key, false);
      } catch (const Error&) {
      }
    }
    const Tokenizer tok = Tokenizer::from_gguf(*f);
    const std::vector<int32_t> ids = tok.encode("Hello, world!\n\n  tabs\tand bytes \xc3\xa9 \xff\xfe <bos>", true);
    for (int32_t id : ids)
      if (id < 0 || id >= tok.size()) return "token id " + std::to_string(id) + " outside the vocabulary";
    (void)tok.decode(ids);
    for (int32_t id = -1; id <= tok.size(); ++id) (void)tok.piece(id);
    return {};
  });
}

std::vector<Seed> index_seeds() {
  constexpr int64_t T = 60;
  std::vector<float> keys(size_t(T) * kDim), queries(size_t(T) * kDim);
  for (int64_t i = 0; i < T; ++i) fill_key(i, &keys[size_t(i) * kDim]);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.5f, 1.0f);
  for (float& x : queries) x = nd(rng);
  RowStore store(DType::f32, kDim);
  store.append_f32(keys.data(), T);
  GraphBuildParams p;
  p.degree = 6;
  p.extra_slots = 2;
  p.query_neighbors = 10;
  p.build_queue = 16;
  p.threads = 1;
  std::vector<Seed> seeds;
  for (int centre = 0; centre < 2; ++centre) {
    p.center_keys = centre == 1;
    std::string image;
    build_projected_graph(store.view(), queries.data(), T, p)->serialize(&image);
    std::vector<uint8_t> whole{0};
    whole.insert(whole.end(), image.begin(), image.end());
    seeds.push_back({"graph-image-" + std::to_string(centre), whole});
    internal::IndexKind kind;
    uint32_t version;
    const std::string_view payload = internal::open_index_image(image, &kind, &version);
    std::vector<uint8_t> wrapped{1, uint8_t(uint32_t(kind) - 1), uint8_t(version)};
    wrapped.insert(wrapped.end(), payload.begin(), payload.end());
    seeds.push_back({"graph-payload-" + std::to_string(centre), wrapped});
  }
  std::string image;
  make_brute_force_index(T)->serialize(&image);
  std::vector<uint8_t> whole{0};
  whole.insert(whole.end(), image.begin(), image.end());
  seeds.push_back({"brute-force-image", whole});
  return seeds;
}

std::vector<Seed> npy_seeds() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("rattn_fuzz_npy_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<Seed> seeds;
  auto add = [&](const std::string& name, NpyType type, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> data(size_t(n) * npy_type_size(type));
    for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t(i * 37 + 11);
    const fs::path path = dir / (name + ".npy");
    write_npy(path.string(), type, shape, data.data());
    std::ifstream in(path, std::ios::binary);
    seeds.push_back({name, std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {})});
  };
  add("f32-3x4", NpyType::f32, {3, 4});
  add("f16-2x3x2", NpyType::f16, {2, 3, 2});
  add("i32-5", NpyType::i32, {5});
  add("i64-2", NpyType::i64, {2});
  add("u16-scalar", NpyType::u16, {});
  // Calibration-shaped tensors ([heads, tokens, dim]) with the values the
  // calibration reader refuses: NaN, +-Inf, 2^40 and beyond.
  auto add_values = [&](const std::string& name, NpyType type, const std::vector<float>& values) {
    std::vector<uint16_t> half(values.size());
    for (size_t i = 0; i < values.size(); ++i) half[i] = f32_to_f16(values[i]);
    const fs::path path = dir / (name + ".npy");
    write_npy(path.string(), type, {1, int64_t(values.size() / 4), 4},
              type == NpyType::f32 ? static_cast<const void*>(values.data()) : half.data());
    std::ifstream in(path, std::ios::binary);
    seeds.push_back({name, std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {})});
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  add_values("f32-nonfinite", NpyType::f32, {0.5f, -1.0f, 1e12f, 1099511627776.0f, nan, inf, -inf, 1e30f});
  add_values("f16-nonfinite", NpyType::f16, {0.5f, -1.0f, 65504.0f, -0.0f, 1e-7f, inf, nan, -inf});
  fs::remove_all(dir);
  return seeds;
}

std::vector<Seed> gguf_seeds() {
  using engine::testing::GgufBuilder;
  GgufBuilder b;
  b.kv_str("general.architecture", "gemma3");
  b.kv_u32("gemma3.block_count", 2);
  b.kv_f32("gemma3.rope.freq_base", 1e6f);
  b.kv_bool("gemma3.flag", true);
  b.kv_u64("gemma3.context_length", 1024);
  b.kv_f64("gemma3.scale", 0.125);
  b.kv_i32("gemma3.offset", -3);
  b.kv_i32_array("gemma3.pattern", {1, 0, 1});
  std::vector<std::string> tokens{"<pad>", "<eos>", "<bos>", "<unk>", "\xe2\x96\x81", "\xe2\x96\x81Hello", "Hello",
                                  "world", ",", "!", "\n", "\n\n", "<0x0A>", "<0xC3>", "<0xA9>", "<0xFF>", "lo",
                                  "He", "l", "o", "\xe2\x96\x81world"};
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (size_t i = 0; i < tokens.size(); ++i) {
    scores.push_back(-float(i));
    const bool is_byte = tokens[i].rfind("<0x", 0) == 0;
    types.push_back(i < 4 ? 3 : is_byte ? 6 : tokens[i][0] == '\n' ? 4 : 1);
  }
  b.kv_str("tokenizer.ggml.model", "llama");
  b.kv_str_array("tokenizer.ggml.tokens", tokens);
  b.kv_f32_array("tokenizer.ggml.scores", scores);
  b.kv_i32_array("tokenizer.ggml.token_type", types);
  b.kv_u32("tokenizer.ggml.bos_token_id", 2);
  b.kv_u32("tokenizer.ggml.eos_token_id", 1);
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(std::sin(double(i)));
  b.tensor("f32.weight", {16, 4}, uint32_t(engine::GgmlType::f32), engine::testing::f32_bytes(w));
  // Quantised blocks: any bytes are valid codes; the scales are small f16s.
  auto blocks = [](size_t n_bytes) {
    std::vector<uint8_t> q(n_bytes);
    for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i * 29 + 7) & 0x3b;
    return q;
  };
  const struct {
    const char* name;
    engine::GgmlType type;
  } quantised[] = {{"f16.weight", engine::GgmlType::f16},   {"bf16.weight", engine::GgmlType::bf16},
                   {"q8_0.weight", engine::GgmlType::q8_0}, {"q4_k.weight", engine::GgmlType::q4_k},
                   {"q6_k.weight", engine::GgmlType::q6_k}};
  for (const auto& q : quantised)
    b.tensor(q.name, {256, 2}, uint32_t(q.type), blocks(2 * engine::ggml_row_bytes(uint32_t(q.type), 256)));
  return {{"gemma-like", b.build()}};
}

}  // namespace rattn::fuzz
