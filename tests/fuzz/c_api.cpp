// The C API on random calls with random float payloads (tests/fuzz/loaders.h,
// check_c_api): NaN, +-Inf, values past fp16 or past 2^40, denormals,
// negative zero and raw bit patterns, in every input dtype, with shapes,
// layers and call orders picked by the input.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/dtype.h"
#include "rattn.h"
#include "tests/fuzz/loaders.h"

namespace rattn::fuzz {
namespace {

struct Shape {
  int layers, hq, hkv, d, sinks, window, top_k;
  rattn_dtype storage;
  rattn_index_kind index;
  int insert_batch, tail_samples;
};

const Shape kShapes[] = {
    {2, 2, 1, 4, 2, 4, 3, RATTN_F16, RATTN_INDEX_EXACT, 1, 0},
    {2, 4, 2, 8, 1, 3, 2, RATTN_BF16, RATTN_INDEX_GRAPH, 2, 0},
    {1, 3, 3, 8, 0, 2, 4, RATTN_F32, RATTN_INDEX_EXACT, 3, 2},
    {2, 4, 1, 16, 4, 8, 4, RATTN_F16, RATTN_INDEX_GRAPH, 1, 3},
};
constexpr int kNumShapes = int(sizeof kShapes / sizeof kShapes[0]);

// One context per shape for the whole process (creating one per input would
// spend the fuzzer's time in plan set-up).
rattn_context* context_for(int shape) {
  static rattn_context* contexts[kNumShapes] = {};
  if (!contexts[shape]) {
    const Shape& s = kShapes[shape];
    rattn_context_params p = rattn_context_default_params();
    p.n_layers = s.layers;
    p.n_q_heads = s.hq;
    p.n_kv_heads = s.hkv;
    p.head_dim = s.d;
    p.sinks = s.sinks;
    p.window = s.window;
    p.top_k = s.top_k;
    p.search_queue = 8;
    p.kv_storage = s.storage;
    p.index_kind = s.index;
    p.insert_batch = s.insert_batch;
    p.tail_samples = s.tail_samples;
    p.kernels = RATTN_KERNELS_REFERENCE;
    p.use_gpu = false;
    p.n_threads = 1;
    if (rattn_context_create(&p, &contexts[shape]) != RATTN_OK) return nullptr;
  }
  return contexts[shape];
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool done() const { return pos_ >= size_; }
  // A value from a palette weighted towards ordinary numbers.
  float value() {
    const uint8_t b = byte();
    if (b < 176) return float(int8_t(byte())) / 32.0f;
    switch (b % 16) {
      case 0: return std::nanf("");
      case 1: return INFINITY;
      case 2: return -INFINITY;
      case 3: return 1e30f;
      case 4: return -65504.0f;
      case 5: return 65520.0f;
      case 6: return 7e4f;
      case 7: return 1e13f;
      case 8: return 1e-40f;  // denormal
      case 9: return -0.0f;
      case 10: return 1099511627776.0f;  // 2^40, the first refused magnitude
      case 11: return 1e12f;             // just accepted
      default: {
        uint32_t bits = 0;
        for (int i = 0; i < 4; ++i) bits = bits << 8 | byte();
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }
    }
  }
  // n values in `dtype`'s encoding.
  std::vector<uint8_t> tensor(size_t n, rattn_dtype dtype) {
    const size_t width = dtype == RATTN_F32 ? 4 : 2;
    std::vector<uint8_t> out(n * width);
    for (size_t i = 0; i < n; ++i) {
      const float x = value();
      if (width == 4) {
        std::memcpy(out.data() + 4 * i, &x, 4);
      } else {
        const uint16_t h = dtype == RATTN_F16 ? f32_to_f16(x) : f32_to_bf16(x);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct SequenceDeleter {
  void operator()(rattn_sequence* s) const { rattn_sequence_free(s); }
};
using SequencePtr = std::unique_ptr<rattn_sequence, SequenceDeleter>;

// What a refused call must leave as it was.
struct Digest {
  std::vector<int64_t> tokens;
  rattn_memory_info memory{};
  bool operator==(const Digest& o) const {
    // Field by field: the struct's padding is not part of its value.
    const rattn_memory_info &a = memory, &b = o.memory;
    return tokens == o.tokens && a.static_set_bytes == b.static_set_bytes && a.cpu_kv_bytes == b.cpu_kv_bytes &&
           a.index_bytes == b.index_bytes && a.query_ring_bytes == b.query_ring_bytes &&
           a.scratch_bytes == b.scratch_bytes && a.total_bytes == b.total_bytes && a.cpu_tokens == b.cpu_tokens &&
           a.static_set_on_gpu == b.static_set_on_gpu && a.pending_tokens == b.pending_tokens;
  }
};

Digest digest_of(const rattn_sequence* seq, int layers) {
  Digest d;
  for (int l = 0; l < layers; ++l) d.tokens.push_back(rattn_sequence_n_tokens(seq, l));
  rattn_sequence_memory(seq, &d.memory);
  return d;
}

std::string status_finding(rattn_status st, const rattn_context* ctx, const char* call) {
  if (st == RATTN_INTERNAL) return std::string(call) + ": internal error: " + rattn_context_last_error(ctx);
  if (st != RATTN_OK && std::string(rattn_context_last_error(ctx)).empty())
    return std::string(call) + ": status " + rattn_status_string(st) + " without a message";
  return {};
}

}  // namespace

std::string check_c_api(const uint8_t* data, size_t size) {
  // RATTN_FUZZ_TRACE=1 prints each call and its status (to replay a finding).
  static const bool trace = std::getenv("RATTN_FUZZ_TRACE") != nullptr;
  Reader in(data, size);
  const int shape_id = in.byte() % kNumShapes;
  const Shape& s = kShapes[shape_id];
  rattn_context* ctx = context_for(shape_id);
  if (!ctx) return "context " + std::to_string(shape_id) + " could not be created";
  rattn_sequence* raw = nullptr;
  if (rattn_sequence_create(ctx, &raw) != RATTN_OK) return "rattn_sequence_create failed";
  SequencePtr seq(raw);
  // tmpfs where there is one: the atomic save's fsync would dominate a run.
  static const std::string dir = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  const std::string path = dir + "/rattn_fuzz_c_api_" + std::to_string(::getpid()) + ".seq";
  const size_t qrow = size_t(s.hq) * size_t(s.d), kvrow = size_t(s.hkv) * size_t(s.d);

  for (int op = 0; op < 32 && !in.done(); ++op) {
    const uint8_t code = in.byte();
    const int layer = int(in.byte() % uint8_t(s.layers + 1)) - (code & 0x80 ? 1 : 0);  // -1 and layers: bad
    const rattn_dtype dtype = rattn_dtype(in.byte() % 3);
    const Digest before = digest_of(seq.get(), s.layers);
    // A copy that sees none of the calls below: after a refused call, both
    // decode one probe token per prefilled layer and must agree bit for bit.
    rattn_sequence* copy_raw = nullptr;
    const bool have_copy = rattn_sequence_clone(seq.get(), &copy_raw) == RATTN_OK;
    SequencePtr copy(copy_raw);
    rattn_status st = RATTN_OK;
    const char* call = "";
    switch (code % 6) {
      case 0:
      case 1: {
        const int64_t n = 1 + in.byte() % 48;
        const auto q = in.tensor(size_t(n) * qrow, dtype), k = in.tensor(size_t(n) * kvrow, dtype),
                   v = in.tensor(size_t(n) * kvrow, dtype);
        call = code % 6 == 0 ? "prefill" : "prefill_chunk";
        st = code % 6 == 0 ? rattn_sequence_prefill(seq.get(), layer, n, q.data(), k.data(), v.data(), dtype)
                           : rattn_sequence_prefill_chunk(seq.get(), layer, n, q.data(), k.data(), v.data(), dtype);
        break;
      }
      case 2:
        call = "prefill_end";
        st = rattn_sequence_prefill_end(seq.get(), layer);
        break;
      case 3:
      case 4: {
        const auto q = in.tensor(qrow, dtype), k = in.tensor(kvrow, dtype), v = in.tensor(kvrow, dtype);
        std::vector<float> out(qrow, 0.0f), lse(size_t(s.hq), 0.0f);
        call = "decode";
        if (code % 6 == 3) {
          st = rattn_sequence_decode(seq.get(), layer, q.data(), k.data(), v.data(), dtype, out.data(), lse.data());
        } else {
          call = "decode_batch";
          rattn_sequence* seqs[] = {seq.get()};
          const void* qs[] = {q.data()};
          const void* ks[] = {k.data()};
          const void* vs[] = {v.data()};
          float* outs[] = {out.data()};
          float* lses[] = {lse.data()};
          st = rattn_sequence_decode_batch(seqs, 1, layer, qs, ks, vs, dtype, outs, lses);
        }
        if (st == RATTN_OK) {
          for (float x : out)
            if (!std::isfinite(x)) return std::string(call) + ": accepted inputs gave a non-finite output";
          for (float x : lse)
            if (!std::isfinite(x)) return std::string(call) + ": accepted inputs gave a non-finite lse";
        }
        break;
      }
      default: {
        call = "save/load";
        st = rattn_sequence_save(seq.get(), path.c_str());
        if (st == RATTN_OK) {
          rattn_sequence* loaded = nullptr;
          const rattn_status ls = rattn_sequence_load(ctx, path.c_str(), &loaded);
          if (ls != RATTN_OK) return std::string("a saved sequence did not load: ") + rattn_context_last_error(ctx);
          SequencePtr l(loaded);
          if (!(digest_of(loaded, s.layers).tokens == before.tokens)) return "a loaded sequence lost tokens";
          seq = std::move(l);
        }
        std::remove(path.c_str());
        break;
      }
    }
    if (trace)
      std::fprintf(stderr, "op %d: %s layer %d dtype %d -> %s %s\n", op, call, layer, int(dtype),
                   rattn_status_string(st), st == RATTN_OK ? "" : rattn_context_last_error(ctx));
    if (std::string f = status_finding(st, ctx, call); !f.empty()) return f;
    if (st == RATTN_OK || std::string(call) == "save/load") continue;
    // Refused: nothing changed.
    if (!(digest_of(seq.get(), s.layers) == before))
      return std::string(call) + " was refused (" + rattn_context_last_error(ctx) + ") but changed the sequence";
    if (!have_copy) continue;
    const std::vector<float> probe_q(qrow, 0.25f), probe_kv(kvrow, -0.5f);
    for (int l = 0; l < s.layers; ++l) {
      if (rattn_sequence_n_tokens(seq.get(), l) <= 0) continue;
      std::vector<float> a(qrow), b(qrow);
      const rattn_status sa = rattn_sequence_decode(seq.get(), l, probe_q.data(), probe_kv.data(), probe_kv.data(),
                                                    RATTN_F32, a.data(), nullptr);
      const rattn_status sb = rattn_sequence_decode(copy.get(), l, probe_q.data(), probe_kv.data(), probe_kv.data(),
                                                    RATTN_F32, b.data(), nullptr);
      if (sa != sb) return std::string("after a refused ") + call + ", a probe decode's status differs from the copy's";
      if (sa == RATTN_OK && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0)
        return std::string("after a refused ") + call + ", a probe decode differs from the untouched copy's";
    }
  }
  return {};
}

std::vector<Seed> c_api_seeds() {
  std::vector<Seed> seeds;
  for (int shape = 0; shape < kNumShapes; ++shape)
    for (int variant = 0; variant < 3; ++variant) {
      Seed sd;
      sd.name = "shape" + std::to_string(shape) + "_" + std::to_string(variant);
      std::vector<uint8_t>& b = sd.bytes;
      b.push_back(uint8_t(shape));
      auto ordinary = [&](size_t n) {
        for (size_t i = 0; i < n; ++i) {
          b.push_back(uint8_t(i % 170));
          b.push_back(uint8_t(i * 37));
        }
      };
      const Shape& s = kShapes[shape];
      const size_t qrow = size_t(s.hq) * size_t(s.d), kvrow = size_t(s.hkv) * size_t(s.d);
      const int64_t n = 24;
      for (int layer = 0; layer < s.layers; ++layer) {
        b.insert(b.end(), {0, uint8_t(layer), uint8_t(variant), uint8_t(n - 1)});  // prefill, n tokens
        ordinary(size_t(n) * (qrow + 2 * kvrow));
      }
      for (int step = 0; step < 3; ++step) {
        b.insert(b.end(), {3, 0, uint8_t(variant)});  // decode layer 0
        ordinary(qrow);
        if (step == 1 && variant == 1) {
          b.push_back(176);  // a NaN in k
          ordinary(kvrow - 1);
        } else {
          ordinary(kvrow);
        }
        ordinary(kvrow);
      }
      b.insert(b.end(), {5, 0, 0});  // save / load
      seeds.push_back(std::move(sd));
    }
  return seeds;
}

}  // namespace rattn::fuzz
