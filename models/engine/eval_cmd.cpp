// rattn eval: accuracy of rattn against full attention on a real model, side
// by side in one run. The same engine runs both: full attention everywhere
// (the baseline), and rattn - the global layers' decode attention through
// rattn's public C API (static set + retrieval + merge), sliding-window
// layers dense.
#include <omp.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"
#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "models/engine/text_util.h"
#include "rattn.h"
#include "runtime/data/calib.h"
#include "runtime/data/synthetic.h"
#include "runtime/index/brute_force.h"
#include "runtime/index/projected_graph.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {

namespace {

namespace json = boost::json;
using engine::GemmaModel;
using engine::GemmaSession;

const char kEvalHelp[] =
    "usage: rattn eval --gguf FILE --text FILE [options]\n"
    "\n"
    "Runs a Gemma-3 GGUF model over the first --tokens tokens of the text and\n"
    "compares, side by side in one run, full attention with rattn on the global\n"
    "layers (through rattn's C API; sliding-window layers stay dense):\n"
    "  - perplexity of the last --score-tokens tokens (teacher-forced decode);\n"
    "  - greedy next-token agreement with full attention at each of those steps;\n"
    "  - attention output error of the global layers per decode step;\n"
    "  - recall@k and share of keys scored, per global layer and query head, of\n"
    "    the attention-aware index on the real decode queries (exact top-k over\n"
    "    the offloaded keys as the oracle);\n"
    "  - the Mahalanobis ratio of decode queries->keys against keys->keys;\n"
    "  - passkey retrieval at --passkey lengths and --depths (both modes).\n"
    "Prints one JSON object (also written to --json FILE).\n"
    "\n"
    "options:\n"
    "  --gguf FILE           model (default: $RATTN_GEMMA_GGUF)\n"
    "  --text FILE           English text (e.g. GNU manuals from /usr/share/info)\n"
    "  --tokens N            context length of the text evaluation (default 32768; 0 skips it)\n"
    "  --score-tokens N      scored tail tokens = decode steps (default 256)\n"
    "  --passkey L1,L2,...   passkey prompt lengths in tokens (default none)\n"
    "  --depths D1,D2,...    needle depths in [0,1] (default 0.1,0.5,0.9)\n"
    "  --sinks N --window N --top-k N --search-queue N   rattn plan overrides\n"
    "  --kv-dtype f16|f32    rattn's K/V storage (default f16)\n"
    "  --recall-k N          k of recall@k (default 100)\n"
    "  --threads N           threads (default 2)\n"
    "  --json FILE           also write the result there (atomically)\n";

struct Options {
  std::string gguf, text, json_out;
  int64_t tokens = 32768, score_tokens = 256;
  std::vector<int64_t> passkey_lengths;
  std::vector<double> depths = {0.1, 0.5, 0.9};
  int sinks = -1, window = -1, top_k = -1, search_queue = -1, recall_k = 100, threads = 2;
  rattn_dtype kv = RATTN_F16;
};

int64_t parse_int(const std::string& s, const std::string& opt, int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < min)
    fail(Status::invalid_argument, "rattn eval: error: " + opt + " expects an integer >= " + std::to_string(min) + ", got '" + s + "'");
  return v;
}

template <class T, class F> std::vector<T> parse_list(const std::string& s, F parse_one) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_one(item));
  return out;
}

Options parse(int argc, char** argv, bool* help) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      *help = true;
      return o;
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(Status::invalid_argument, "rattn eval: error: " + a + " expects a value");
      return argv[++i];
    };
    if (a == "--gguf") o.gguf = value();
    else if (a == "--text") o.text = value();
    else if (a == "--json") o.json_out = value();
    else if (a == "--tokens") o.tokens = parse_int(value(), a, 0);
    else if (a == "--score-tokens") o.score_tokens = parse_int(value(), a, 1);
    else if (a == "--passkey") o.passkey_lengths = parse_list<int64_t>(value(), [&](const std::string& x) { return parse_int(x, a, 64); });
    else if (a == "--depths")
      o.depths = parse_list<double>(value(), [&](const std::string& x) {
        char* end = nullptr;
        const double d = std::strtod(x.c_str(), &end);
        if (x.empty() || *end || d < 0 || d > 1) fail(Status::invalid_argument, "rattn eval: error: --depths expects numbers in [0, 1], got '" + x + "'");
        return d;
      });
    else if (a == "--sinks") o.sinks = int(parse_int(value(), a, 0));
    else if (a == "--window") o.window = int(parse_int(value(), a, 0));
    else if (a == "--top-k") o.top_k = int(parse_int(value(), a, 0));
    else if (a == "--search-queue") o.search_queue = int(parse_int(value(), a, 1));
    else if (a == "--recall-k") o.recall_k = int(parse_int(value(), a, 1));
    else if (a == "--threads") o.threads = int(parse_int(value(), a, 1));
    else if (a == "--kv-dtype") {
      const std::string v = value();
      if (v == "f16") o.kv = RATTN_F16;
      else if (v == "f32") o.kv = RATTN_F32;
      else fail(Status::invalid_argument, "rattn eval: error: --kv-dtype expects f16 or f32, got '" + v + "'");
    } else fail(Status::invalid_argument, "rattn eval: error: unknown option '" + a + "' (see --help)");
  }
  return o;
}

void check_api(rattn_status s, const rattn_context* ctx, const char* what) {
  if (s != RATTN_OK) {
    std::fprintf(stderr, "rattn eval: %s failed: %s: %s\n", what, rattn_status_string(s), rattn_context_last_error(ctx));
    fail(Status::internal, std::string("rattn eval: error: ") + what + " failed: " + rattn_status_string(s) + ": " +
                               rattn_context_last_error(ctx));
  }
}

// Global layers' post-RoPE Q [H, T, d], K and V [HK, T, d] of a prefill.
struct GlobalQkv {
  std::vector<int> layers;
  int H = 0, HK = 0, d = 0;
  int64_t T = 0;
  std::vector<std::vector<float>> q, k, v;
  void init(const engine::GemmaConfig& c, int64_t tokens) {
    layers = c.global_layers();
    H = c.n_head, HK = c.n_kv_head, d = c.head_dim, T = tokens;
    q.assign(layers.size(), std::vector<float>(size_t(H) * size_t(T) * size_t(d)));
    k.assign(layers.size(), std::vector<float>(size_t(HK) * size_t(T) * size_t(d)));
    v.assign(layers.size(), std::vector<float>(size_t(HK) * size_t(T) * size_t(d)));
  }
  size_t slot(int layer) const { return size_t(std::find(layers.begin(), layers.end(), layer) - layers.begin()); }
  engine::GlobalQkvHook hook() {
    return [this](int layer, int64_t pos0, int64_t n, const float* qs, const float* ks, const float* vs) {
      const size_t g = slot(layer);
      for (int64_t i = 0; i < n && pos0 + i < T; ++i) {
        const size_t t = size_t(pos0 + i);
        for (int h = 0; h < H; ++h)
          std::memcpy(&q[g][(size_t(h) * size_t(T) + t) * size_t(d)], qs + (i * H + h) * d, size_t(d) * 4);
        for (int h = 0; h < HK; ++h) {
          std::memcpy(&k[g][(size_t(h) * size_t(T) + t) * size_t(d)], ks + (i * HK + h) * d, size_t(d) * 4);
          std::memcpy(&v[g][(size_t(h) * size_t(T) + t) * size_t(d)], vs + (i * HK + h) * d, size_t(d) * 4);
        }
      }
    };
  }
};

// The global layers' decode attention on rattn's C API; measures the output
// error against dense attention over the engine's own cache and keeps the
// decode queries.
class RattnBackend : public engine::GlobalAttentionBackend {
 public:
  RattnBackend(const GemmaModel& m, const Options& o, const GlobalQkv& qkv, const GemmaSession& session)
      : cfg_(m.config()), session_(session), qkv_(qkv) {
    rattn_context_params p = rattn_context_default_params();
    p.n_layers = int32_t(qkv.layers.size());
    p.n_q_heads = cfg_.n_head;
    p.n_kv_heads = cfg_.n_kv_head;
    p.head_dim = cfg_.head_dim;
    p.sinks = o.sinks;
    p.window = o.window;
    p.top_k = o.top_k;
    p.search_queue = o.search_queue;
    p.kv_storage = o.kv;
    p.n_threads = o.threads;
    check_api(rattn_context_create(&p, &ctx_), nullptr, "rattn_context_create");
    check_api(rattn_context_get_info(ctx_, &info_), ctx_, "rattn_context_get_info");
    check_api(rattn_sequence_create(ctx_, &seq_), ctx_, "rattn_sequence_create");
    // rattn scores with 1/sqrt(d); Gemma's scale comes from its metadata.
    q_scale_ = cfg_.attn_scale * std::sqrt(float(cfg_.head_dim));
    for (size_t g = 0; g < qkv.layers.size(); ++g) {
      std::vector<float> q = qkv.q[g];
      if (q_scale_ != 1.0f)
        for (float& x : q) x *= q_scale_;
      check_api(rattn_sequence_prefill(seq_, int32_t(g), qkv.T, q.data(), qkv.k[g].data(), qkv.v[g].data(), RATTN_F32),
                ctx_, "rattn_sequence_prefill");
    }
    errors_.assign(qkv.layers.size(), {});
    queries_.assign(qkv.layers.size(), {});
  }
  ~RattnBackend() override {
    rattn_sequence_free(seq_);
    rattn_context_free(ctx_);
  }
  void decode(int layer, int64_t pos, const float* q, const float* k, const float* v, float* out) override {
    const size_t g = qkv_.slot(layer);
    const int n = cfg_.n_head * cfg_.head_dim;
    std::vector<float> qs(q, q + n);
    for (float& x : qs) x *= q_scale_;
    check_api(rattn_sequence_decode(seq_, int32_t(g), qs.data(), k, v, RATTN_F32, out, nullptr), ctx_, "rattn_sequence_decode");
    std::vector<float> ref(static_cast<size_t>(n));
    session_.dense_attention_one(layer, pos, q, ref.data());
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
      num += double(out[i] - ref[size_t(i)]) * (out[i] - ref[size_t(i)]);
      den += double(ref[size_t(i)]) * ref[size_t(i)];
    }
    errors_[g].push_back(std::sqrt(num / std::max(den, 1e-30)));
    queries_[g].insert(queries_[g].end(), q, q + n);
  }
  const rattn_context_info& info() const { return info_; }
  const std::vector<std::vector<double>>& errors() const { return errors_; }
  const std::vector<std::vector<float>>& queries() const { return queries_; }  // per layer [steps, H, d]

 private:
  const engine::GemmaConfig& cfg_;
  const GemmaSession& session_;
  const GlobalQkv& qkv_;
  rattn_context* ctx_ = nullptr;
  rattn_sequence* seq_ = nullptr;
  rattn_context_info info_{};
  float q_scale_ = 1.0f;
  std::vector<std::vector<double>> errors_;
  std::vector<std::vector<float>> queries_;
};

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

double nll(const std::vector<float>& logits, int32_t target) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x - mx));
  return std::log(sum) + double(mx) - double(logits[size_t(target)]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / double(v.size());
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// Recall@k and share of keys scored of the attention-aware index, per head,
// on the decode queries, over the keys rattn offloads ([sinks, T - window)).
json::array index_quality(const GlobalQkv& qkv, size_t g, const std::vector<float>& decode_q, const rattn_context_info& info,
                          int recall_k, int threads) {
  json::array heads;
  const int d = qkv.d, H = qkv.H, group = qkv.H / qkv.HK;
  const int64_t lo = info.sinks, hi = qkv.T - info.window;
  const int64_t n = hi - lo;
  const int64_t steps = int64_t(decode_q.size()) / (H * d);
  if (n <= recall_k || steps == 0) return heads;
  for (int h = 0; h < H; ++h) {
    const int kh = h / group;
    const float* keys = &qkv.k[g][(size_t(kh) * size_t(qkv.T) + size_t(lo)) * size_t(d)];
    const RowsView view{keys, DType::f32, n, d};
    const float* train = &qkv.q[g][(size_t(h) * size_t(qkv.T) + size_t(lo)) * size_t(d)];
    GraphBuildParams bp;
    bp.degree = info.graph_degree;
    bp.query_neighbors = info.query_neighbors;
    bp.sample_fraction = info.build_sample;
    bp.threads = threads;
    auto index = build_projected_graph(view, train, n, bp);
    auto scratch = index->make_scratch();
    SearchParams sp;
    sp.k = recall_k;
    sp.queue_length = std::max(info.search_queue, recall_k);
    double recall = 0, scored = 0;
    SearchResult res;
    std::vector<int32_t> exact;
    for (int64_t s = 0; s < steps; ++s) {
      const float* q = &decode_q[size_t((s * H + h) * d)];
      index->search(q, view, sp, *scratch, res);
      exact_top_k(q, view, n, recall_k, &exact);
      std::vector<int32_t> got(res.ids.begin(), res.ids.end());
      std::sort(got.begin(), got.end());
      int hit = 0;
      for (int32_t id : exact) hit += std::binary_search(got.begin(), got.end(), id) ? 1 : 0;
      recall += double(hit) / double(exact.size());
      scored += double(res.keys_scored) / double(n);
    }
    json::object o;
    o["head"] = h;
    o["recall"] = recall / double(steps);
    o["keys_scored_share"] = scored / double(steps);
    o["offloaded_keys"] = n;
    heads.push_back(o);
  }
  return heads;
}

struct PasskeyPrompt {
  std::vector<int32_t> ids;
  std::string key;
};

PasskeyPrompt passkey_prompt(const GemmaModel& m, int64_t length, double depth, uint64_t seed) {
  const auto& tok = m.tokenizer();
  std::mt19937_64 rng(seed);
  const std::string key = std::to_string(10000 + rng() % 90000);
  const auto head = tok.encode(
      "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
      "I will quiz you about the important information there.\n",
      true);
  const auto filler = tok.encode("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n", false);
  const auto needle = tok.encode("The pass key is " + key + ". Remember it. " + key + " is the pass key.\n", false);
  const auto question = tok.encode("What is the pass key? The pass key is", false);
  const int64_t fill = length - int64_t(head.size() + needle.size() + question.size());
  if (fill < int64_t(filler.size())) fail(Status::invalid_argument, "rattn eval: error: passkey length " + std::to_string(length) + " is too short");
  const int64_t reps = fill / int64_t(filler.size());
  const int64_t at = std::llround(depth * double(reps));
  PasskeyPrompt p;
  p.key = key;
  p.ids = head;
  for (int64_t r = 0; r <= reps; ++r) {
    if (r == at) p.ids.insert(p.ids.end(), needle.begin(), needle.end());
    if (r < reps) p.ids.insert(p.ids.end(), filler.begin(), filler.end());
  }
  p.ids.insert(p.ids.end(), question.begin(), question.end());
  return p;
}

std::string greedy(GemmaSession& s, const GemmaModel& m, std::vector<float> logits, int steps,
                   engine::GlobalAttentionBackend* backend) {
  std::string out;
  for (int i = 0; i < steps; ++i) {
    const int32_t t = argmax(logits);
    out += m.tokenizer().piece(t);
    if (i + 1 < steps) logits = s.decode(t, backend);
  }
  return out;
}

}  // namespace

int eval_main(int argc, char** argv) {
  bool help = false;
  Options o = parse(argc, argv, &help);
  if (help) {
    std::fputs(kEvalHelp, stdout);
    return 0;
  }
  o.gguf = engine::resolve_gguf_path(o.gguf, "eval");
  if (o.tokens > 0 && o.text.empty()) fail(Status::invalid_argument, "rattn eval: error: --text FILE is required (or --tokens 0)");
  if (o.tokens > 0 && o.tokens <= o.score_tokens)
    fail(Status::invalid_argument, "rattn eval: error: --tokens must exceed --score-tokens");
  engine::set_engine_threads(o.threads);
  const double t_start = engine::now_seconds();
  auto model = GemmaModel::load(o.gguf);
  const auto& c = model->config();
  json::object result;
  result["command"] = "eval";
  {
    json::object mi;
    mi["cpu"] = cpu_model();
    mi["hardware_threads"] = omp_get_num_procs();
    mi["note"] = "shared machine (several agents); timings are noisy";
    result["machine"] = mi;
    json::object params;
    params["gguf"] = o.gguf;
    params["text"] = o.text;
    params["tokens"] = o.tokens;
    params["score_tokens"] = o.score_tokens;
    params["threads"] = o.threads;
    params["kv_dtype"] = o.kv == RATTN_F16 ? "f16" : "f32";
    params["global_layers"] = json::value_from(c.global_layers());
    result["params"] = params;
  }
  auto log = [&](const std::string& s) { std::fprintf(stderr, "rattn eval: [%.0f s] %s\n", engine::now_seconds() - t_start, s.c_str()); };

  if (o.tokens > 0) {
    const std::string text = engine::read_text_file(o.text);
    const std::vector<int32_t> ids = engine::tokenize_prefix(*model, text, o.tokens, "rattn eval: error: '" + o.text + "'");
    const int64_t P = o.tokens - o.score_tokens, S = o.score_tokens;
    GemmaSession session(*model, o.tokens + 1);
    GlobalQkv qkv;
    qkv.init(c, P);
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + P);
    const std::vector<int32_t> tail(ids.begin() + P, ids.end());
    double t0 = engine::now_seconds();
    double last = t0;
    const std::vector<float> h_last = session.prefill(prefix, {P - 1}, 512, qkv.hook(), [&](int64_t done) {
      if (engine::now_seconds() - last > 30) {
        log("prefill " + std::to_string(done) + " / " + std::to_string(P));
        last = engine::now_seconds();
      }
    });
    const double prefill_s = engine::now_seconds() - t0;
    // Full attention: the scored tail in one batched pass (exactly what
    // token-by-token decoding computes).
    std::vector<int64_t> rows(size_t(S - 1));
    for (int64_t i = 0; i + 1 < S; ++i) rows[size_t(i)] = i;
    const std::vector<float> h_tail = session.prefill(std::vector<int32_t>(tail.begin(), tail.end() - 1), rows, 512);
    std::vector<float> h_all(size_t(S) * size_t(c.d_model));
    std::memcpy(h_all.data(), h_last.data(), h_last.size() * 4);
    std::memcpy(h_all.data() + c.d_model, h_tail.data(), h_tail.size() * 4);
    std::vector<float> logits_full(size_t(S) * size_t(c.vocab));
    model->output_head(h_all.data(), S, logits_full.data());
    session.truncate(P);
    log("full attention scored");

    t0 = engine::now_seconds();
    RattnBackend backend(*model, o, qkv, session);
    const double rattn_prefill_s = engine::now_seconds() - t0;
    log("rattn prefill (index build) done");
    double nll_full = 0, nll_rattn = 0;
    int agree = 0;
    std::vector<float> lr(h_last.size());
    std::vector<float> logits_r(static_cast<size_t>(c.vocab));
    model->output_head(h_last.data(), 1, logits_r.data());
    t0 = engine::now_seconds();
    for (int64_t i = 0; i < S; ++i) {
      const std::vector<float> lf(logits_full.begin() + i * c.vocab, logits_full.begin() + (i + 1) * c.vocab);
      nll_full += nll(lf, tail[size_t(i)]);
      nll_rattn += nll(logits_r, tail[size_t(i)]);
      agree += argmax(lf) == argmax(logits_r) ? 1 : 0;
      if (i + 1 < S) logits_r = session.decode(tail[size_t(i)], &backend);
    }
    const double decode_s = engine::now_seconds() - t0;
    log("rattn decode done");
    json::object tr;
    tr["context_tokens"] = P;
    tr["scored_tokens"] = S;
    tr["perplexity_full"] = std::exp(nll_full / double(S));
    tr["perplexity_rattn"] = std::exp(nll_rattn / double(S));
    tr["perplexity_ratio"] = std::exp((nll_rattn - nll_full) / double(S));
    tr["next_token_agreement"] = double(agree) / double(S);
    tr["prefill_s"] = prefill_s;
    tr["rattn_prefill_s"] = rattn_prefill_s;
    tr["rattn_decode_s_per_token"] = decode_s / double(S);
    json::object plan;
    plan["sinks"] = backend.info().sinks;
    plan["window"] = backend.info().window;
    plan["top_k"] = backend.info().top_k;
    plan["search_queue"] = backend.info().search_queue;
    plan["graph_degree"] = backend.info().graph_degree;
    plan["query_neighbors"] = backend.info().query_neighbors;
    plan["build_sample"] = backend.info().build_sample;
    plan["cpu_kernels"] = backend.info().cpu_kernels;
    tr["rattn_plan"] = plan;
    json::array layers;
    for (size_t g = 0; g < qkv.layers.size(); ++g) {
      json::object L;
      L["layer"] = qkv.layers[g];
      const auto& e = backend.errors()[g];
      L["attention_rel_error_mean"] = mean(e);
      L["attention_rel_error_max"] = e.empty() ? 0.0 : *std::max_element(e.begin(), e.end());
      const auto& dq = backend.queries()[g];
      const int64_t nq = int64_t(dq.size()) / c.head_dim;
      L["mahalanobis_ratio"] = mahalanobis_ratio(qkv.k[g].data(), P, dq.data(), nq, c.head_dim);
      log("index quality of layer " + std::to_string(qkv.layers[g]));
      L["heads"] = index_quality(qkv, g, dq, backend.info(), o.recall_k, o.threads);
      layers.push_back(L);
    }
    tr["global_layers"] = layers;
    // Each section is also logged as soon as it is complete.
    std::fprintf(stderr, "rattn eval: text %s\n", json::serialize(tr).c_str());
    result["text"] = tr;
  }

  if (!o.passkey_lengths.empty()) {
    json::array trials;
    for (int64_t len : o.passkey_lengths) {
      for (double depth : o.depths) {
        // The key depends on the trial only, so separate runs reproduce it.
        const uint64_t seed = uint64_t(len) * 1000003ull + uint64_t(std::llround(depth * 1000.0));
        const PasskeyPrompt p = passkey_prompt(*model, len, depth, seed);
        const int64_t T = int64_t(p.ids.size());
        GemmaSession session(*model, T + 16);
        GlobalQkv qkv;
        qkv.init(c, T);
        const std::vector<float> h = session.prefill(p.ids, {T - 1}, 512, qkv.hook());
        std::vector<float> logits(static_cast<size_t>(c.vocab));
        model->output_head(h.data(), 1, logits.data());
        const int steps = 8;
        const std::string full = greedy(session, *model, logits, steps, nullptr);
        session.truncate(T);
        RattnBackend backend(*model, o, qkv, session);
        const std::string ratt = greedy(session, *model, logits, steps, &backend);
        json::object t;
        t["length"] = T;
        t["depth"] = depth;
        t["passkey"] = p.key;
        t["full_answer"] = full;
        t["rattn_answer"] = ratt;
        t["full_pass"] = full.find(p.key) != std::string::npos;
        t["rattn_pass"] = ratt.find(p.key) != std::string::npos;
        log("passkey " + std::to_string(T) + " depth " + std::to_string(depth) + ": full '" + full + "' rattn '" + ratt + "'");
        std::fprintf(stderr, "rattn eval: passkey %s\n", json::serialize(t).c_str());
        trials.push_back(t);
      }
    }
    result["passkey"] = trials;
  }
  result["total_s"] = engine::now_seconds() - t_start;
  const std::string out = json::serialize(result);
  std::printf("%s\n", out.c_str());
  if (!o.json_out.empty()) write_file_atomic(o.json_out, out + "\n");
  return 0;
}

}  // namespace rattn::cli
