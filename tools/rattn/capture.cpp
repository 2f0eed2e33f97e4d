// rattn capture: runs a GGUF model's prefill over a text and writes the global
// layers' post-RoPE queries, keys and values in the calibration format.
#include <omp.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/clock.h"
#include "core/error.h"
#include "core/progress.h"
#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "models/engine/text_util.h"
#include "runtime/data/calib.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {

namespace {
const char kCaptureHelp[] =
    "usage: rattn capture --gguf FILE --text FILE --tokens N -o DIR [options]\n"
    "\n"
    "Runs the model's prefill over the first N tokens of the text (BOS first) and\n"
    "writes, for every global (full-attention) layer, the post-RoPE queries\n"
    "[Hq,T,d], keys [Hkv,T,d] and values [Hkv,T,d] to DIR in the calibration\n"
    "format (manifest.json + layer_<id>.{q,k,v}.npy).\n"
    "\n"
    "options:\n"
    "  --gguf FILE      Gemma-3 GGUF model (default: $RATTN_GEMMA_GGUF)\n"
    "  --text FILE      UTF-8 text to run over\n"
    "  --tokens N       tokens to capture (the text must be long enough)\n"
    "  -o, --out DIR    output directory\n"
    "  --dtype f32|f16  storage dtype of the arrays (default f16)\n"
    "  --chunk N        prefill chunk length (default 512)\n"
    "  --threads N      threads (default 2)\n";

int64_t parse_count(const std::string& s, const char* opt) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v <= 0)
    usage_fail(std::string("rattn capture: error: ") + opt + " expects a positive integer, got '" + s + "'");
  return v;
}
}  // namespace

int capture_main(int argc, char** argv) {
  std::string gguf, text_path, out_dir, dtype_name = "f16";
  int64_t tokens = 0, chunk = 512, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kCaptureHelp, stdout);
      return 0;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_fail("rattn capture: error: " + a + " expects a value");
      return argv[++i];
    };
    if (a == "--gguf") gguf = value();
    else if (a == "--text") text_path = value();
    else if (a == "--tokens") tokens = parse_count(value(), "--tokens");
    else if (a == "-o" || a == "--out") out_dir = value();
    else if (a == "--dtype") dtype_name = value();
    else if (a == "--chunk") chunk = parse_count(value(), "--chunk");
    else if (a == "--threads") threads = parse_count(value(), "--threads");
    else usage_fail("rattn capture: error: unknown option '" + a + "' (see --help)");
  }
  gguf = engine::resolve_gguf_path(gguf, "capture");
  if (text_path.empty()) usage_fail("rattn capture: error: --text FILE is required");
  if (tokens <= 0) usage_fail("rattn capture: error: --tokens N is required");
  if (out_dir.empty()) usage_fail("rattn capture: error: -o DIR is required");
  DType dtype;
  if (!parse_dtype(dtype_name, &dtype) || dtype == DType::bf16)
    usage_fail("rattn capture: error: --dtype expects f32 or f16, got '" + dtype_name + "'");
  engine::set_engine_threads(int(threads));

  const double t0 = seconds_now();
  auto model = engine::GemmaModel::load(gguf);
  const auto& c = model->config();
  const std::string text = engine::read_text_file(text_path);
  std::vector<int32_t> ids = engine::tokenize_prefix(*model, text, tokens, "rattn capture: error: '" + text_path + "'");
  if (tokens > c.context)
    std::fprintf(stderr, "rattn capture: warning: %lld tokens exceed the model's context length %lld\n",
                 (long long)tokens, (long long)c.context);
  const double t_load = seconds_now();

  const std::vector<int> globals = c.global_layers();
  const int H = c.n_head, HK = c.n_kv_head, d = c.head_dim;
  const size_t T = size_t(tokens);
  struct Buffers { std::vector<float> q, k, v; };
  std::vector<Buffers> buf(globals.size());
  for (auto& b : buf) {
    b.q.assign(size_t(H) * T * size_t(d), 0.0f);
    b.k.assign(size_t(HK) * T * size_t(d), 0.0f);
    b.v.assign(size_t(HK) * T * size_t(d), 0.0f);
  }
  auto hook = [&](int layer, int64_t pos0, int64_t n, const float* q, const float* k, const float* v) {
    size_t g = 0;
    while (globals[g] != layer) ++g;
    Buffers& b = buf[g];
    for (int64_t i = 0; i < n; ++i) {
      const size_t t = size_t(pos0 + i);
      for (int h = 0; h < H; ++h)
        std::memcpy(&b.q[(size_t(h) * T + t) * size_t(d)], q + (i * H + h) * d, size_t(d) * 4);
      for (int h = 0; h < HK; ++h) {
        std::memcpy(&b.k[(size_t(h) * T + t) * size_t(d)], k + (i * HK + h) * d, size_t(d) * 4);
        std::memcpy(&b.v[(size_t(h) * T + t) * size_t(d)], v + (i * HK + h) * d, size_t(d) * 4);
      }
    }
  };
  engine::GemmaSequence model_seq(*model, tokens);
  Progress bar("rattn capture", double(tokens));
  model_seq.prefill(ids, {}, chunk, hook, [&](int64_t done) {
    bar.advance(double(done) - bar.done(), std::to_string(done) + " / " + std::to_string(tokens) + " tokens");
  });
  bar.finish(std::to_string(tokens) + " tokens");
  const double t_prefill = seconds_now();

  CalibManifest m;
  m.model = model->file().get_string("general.name");
  m.layers = globals;
  m.num_q_heads = H;
  m.num_kv_heads = HK;
  m.head_dim = d;
  m.tokens = tokens;
  m.dtype = dtype;
  m.rope_applied = true;
  for (size_t g = 0; g < globals.size(); ++g) write_calib_layer(out_dir, globals[g], buf[g].q.data(), buf[g].k.data(), buf[g].v.data(), m);
  write_calib_manifest(out_dir, m);
  const double t_end = seconds_now();

  boost::json::object o;
  o["command"] = "capture";
  o["gguf"] = gguf;
  o["text"] = text_path;
  o["tokens"] = tokens;
  o["chunk"] = chunk;
  o["threads"] = threads;
  o["out"] = out_dir;
  o["dtype"] = dtype_name;
  o["global_layers"] = boost::json::value_from(globals);
  o["load_tokenize_s"] = t_load - t0;
  o["prefill_s"] = t_prefill - t_load;
  o["prefill_tokens_per_s"] = double(tokens) / (t_prefill - t_load);
  o["write_s"] = t_end - t_prefill;
  o["omp_max_threads"] = omp_get_max_threads();
  std::printf("%s\n", boost::json::serialize(o).c_str());
  return 0;
}

}  // namespace rattn::cli
