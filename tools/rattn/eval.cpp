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
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>

#include "bench/bench_util.h"
#include "core/atomic_file.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/stats.h"
#include "dsl/dsl.h"
#include "harness/index_harness.h"
#include "models/engine/eval_accuracy.h"
#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "models/engine/rattn_attention.h"
#include "models/engine/text_util.h"
#include "rattn.h"
#include "runtime/data/synthetic.h"
#include "tools/rattn/commands.h"
#include "tools/rattn/eval.h"

namespace rattn::cli {
namespace eval {
namespace {

namespace json = boost::json;
using engine::GemmaModel;
using engine::GemmaSequence;
using engine::GlobalQkv;
using engine::RattnAttention;

engine::RattnAttentionParams attention_params(const Options& o, const Variant& v) {
  engine::RattnAttentionParams p;
  p.plan_path = v.plan.empty() ? o.plan : v.plan;
  p.sinks = v.sinks;
  p.window = v.window;
  p.top_k = v.top_k;
  p.search_queue = v.search_queue;
  p.tail_samples = v.tail_samples;
  p.search_seeds = v.search_seeds;
  p.search_expand_first = v.search_expand_first;
  p.search_full_expand = v.search_full_expand;
  p.graph_degree = v.graph_degree;
  p.query_neighbors = v.query_neighbors;
  p.build_sample = v.build_sample;
  p.layer_search = v.layer_search;
  p.kv_storage = o.kv;
  p.index = v.index;
  p.threads = o.threads;
  return p;
}

int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// The attention-aware index rattn would build for one query head, over the
// keys it offloads at prefill ([sinks, T - window)), trained on the prompt's
// queries like the runtime's; built once per (layer, head, sinks, window, build knobs) and
// searched with each variant's parameters.
class IndexCache {
 public:
  // `plan_path`: the DSL plan the contexts are created from (its index knobs
  // - key metric, causal lists, insert path, ... - shape the graph as in the
  // runtime); empty: the library's plan defaults.
  IndexCache(const GlobalQkv& qkv, int threads, const std::string& plan_path)
      : qkv_(qkv), program_(plan_path.empty() ? Program{} : load_program(plan_path)), threads_(threads),
        plan_(plan_path.empty() ? ConcretePlan{} : default_concrete_plan(program_.plan)) {}
  // The plan as the context runs it: the plan file with the context's
  // overrides (sinks, window and the build knobs rattn_context_info reports).
  ConcretePlan plan(const rattn_context_info& info) const {
    ConcretePlan p = plan_;
    p.sinks = info.sinks;
    p.window = info.window;
    p.top_k = info.top_k;
    p.search_queue = info.search_queue;
    p.graph_degree = info.graph_degree;
    p.query_neighbors = info.query_neighbors;
    p.build_sample = info.build_sample;
    p.search_seeds = info.search_seeds;
    p.search_expand_first = info.search_expand_first;
    p.search_full_expand = info.search_full_expand;
    return p;
  }
  const KeyIndex& get(size_t g, int h, const rattn_context_info& info) {
    const auto key = std::make_tuple(g, h, int64_t(info.sinks), int64_t(info.window), info.graph_degree,
                                     info.query_neighbors, info.build_sample);
    auto it = cache_.find(key);
    if (it != cache_.end()) return *it->second;
    const GraphBuildParams bp = harness::head_build_params(plan(info), program_.model, qkv_.layers[g], threads_);
    const float* train = &qkv_.q[g][size_t(h) * size_t(qkv_.T) * size_t(qkv_.d)];
    auto index = build_projected_graph(keys(g, h, info), train, qkv_.T, bp);
    return *(cache_[key] = std::move(index));
  }
  RowsView keys(size_t g, int h, const rattn_context_info& info) const {
    const int kh = h / (qkv_.H / qkv_.HK);
    const int64_t lo = info.sinks, n = qkv_.T - info.window - info.sinks;
    return RowsView{&qkv_.k[g][(size_t(kh) * size_t(qkv_.T) + size_t(lo)) * size_t(qkv_.d)], DType::f32, n, qkv_.d};
  }

 private:
  const GlobalQkv& qkv_;
  Program program_;  // the plan file's model: each layer's RoPE for shifted training queries
  int threads_;
  ConcretePlan plan_;
  // (layer slot, head, sinks, window, graph_degree, query_neighbors, build_sample)
  std::map<std::tuple<size_t, int, int64_t, int64_t, int32_t, int32_t, float>, std::unique_ptr<KeyIndex>> cache_;
};

// Recall@k and share of keys scored of the attention-aware index, per head,
// on the decode queries, over the keys rattn offloads at prefill. The search
// runs as the runtime's does (k = max(top_k, recall_k), queue >= k, seeded
// with the previous step's results); recall@k counts the best k results
// found among the exact top k.
json::array index_quality(IndexCache& cache, const GlobalQkv& qkv, size_t g, const std::vector<float>& decode_q,
                          const rattn_context_info& info, const rattn_layer_search& search, int64_t top_k,
                          int recall_k) {
  json::array heads;
  const int d = qkv.d, H = qkv.H;
  const int64_t n = qkv.T - info.window - info.sinks;
  const int64_t steps = int64_t(decode_q.size()) / (H * d);
  if (n <= recall_k || steps == 0) return heads;
  std::vector<float> test(size_t(steps) * size_t(d));
  for (int h = 0; h < H; ++h) {
    const RowsView view = cache.keys(g, h, info);
    const KeyIndex& index = cache.get(g, h, info);
    ConcretePlan plan = cache.plan(info);
    plan.top_k = top_k;  // the layer's own
    // The context's resolved searches (patience has no C API override: the plan's).
    const DecodeSearch ds{search.search_queue, plan.decode_search(qkv.layers[g]).patience, search.search_seeds,
                          search.search_expand_first, search.search_full_expand};
    // This head's decode query of each step.
    for (int64_t s = 0; s < steps; ++s)
      std::memcpy(&test[size_t(s * d)], &decode_q[size_t((s * H + h) * d)], size_t(d) * sizeof(float));
    const harness::IdLists exact = harness::exact_top_k_lists(view, test.data(), steps, recall_k);
    const harness::SearchQuality q =
        harness::measure_search(index, view, test.data(), exact, harness::decode_params(plan, ds, recall_k, n), ds.seeds,
                                harness::all_queries(steps), recall_k);
    json::object o;
    o["head"] = h;
    o["recall"] = q.recall;
    o["keys_scored_share"] = q.scored_fraction;
    o["keys_scored_share_min"] = q.scored_min;
    o["keys_scored_share_max"] = q.scored_max;
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

std::string greedy(GemmaSequence& s, const GemmaModel& m, std::vector<float> logits, int steps,
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

}  // namespace eval

int eval_main(int argc, char** argv) {
  using namespace eval;
  bool help = false;
  Options o = parse_options(argc, argv, &help);
  if (help) {
    std::fputs(kEvalHelp, stdout);
    return 0;
  }
  if (!o.topk_grid_dir.empty()) return topk_grid_main(o);
  o.gguf = engine::resolve_gguf_path(o.gguf, "eval");
  if (!o.plan_set) o.plan = RATTN_GEMMA_PLAN;
  if (o.plan == "none") o.plan.clear();
  if (o.tokens > 0 && o.text.empty()) usage_fail("rattn eval: error: --text FILE is required (or --tokens 0)");
  if (o.tokens > 0 && o.tokens <= o.score_tokens)
    usage_fail("rattn eval: error: --tokens must exceed --score-tokens");
  const std::vector<Variant> variants = variants_of(o);
  engine::set_engine_threads(o.threads);
  const double t_start = seconds_now();
  auto model = GemmaModel::load(o.gguf);
  const auto& c = model->config();
  json::object result;
  result["command"] = "eval";
  {
    json::object mi;
    mi["cpu"] = cpu_model();
    mi["hardware_threads"] = omp_get_num_procs();
    std::ifstream loadavg("/proc/loadavg");
    double load1 = 0;
    if (loadavg >> load1) mi["load_average_1m"] = load1;  // timings mean little without it
    result["machine"] = mi;
    json::object params;
    params["gguf"] = o.gguf;
    params["text"] = o.text;
    params["plan"] = o.plan.empty() ? "none" : o.plan;
    params["tokens"] = o.tokens;
    params["score_tokens"] = o.score_tokens;
    params["threads"] = o.threads;
    params["kv_dtype"] = o.kv == RATTN_F16 ? "f16" : "f32";
    params["global_layers"] = json::value_from(c.global_layers());
    result["params"] = params;
  }
  // The text run's progress in tokens: the prefill, full attention's
  // scoring (and its fp16 check), and per variant its index build (counted
  // as a prefill) and decode steps.
  std::optional<Progress> bar;
  auto log = [&](const std::string& s) {
    char line[64];
    std::snprintf(line, sizeof line, "[%.0f s] ", seconds_now() - t_start);
    if (bar) {
      bar->note(line + s);
      return;
    }
    std::fprintf(stderr, "rattn eval: %s%s\n", line, s.c_str());
    std::fflush(stderr);
  };
  // Rewritten after each section so that a long run leaves partial results.
  auto save = [&]() {
    if (!o.json_out.empty()) write_file_atomic(o.json_out, json::serialize(result) + "\n");
  };
  auto plan_json = [&](const RattnAttention& backend, const Variant& v) {
    const rattn_context_info& info = backend.info();
    json::object plan;
    plan["name"] = v.name;
    plan["sinks"] = info.sinks;
    plan["window"] = info.window;
    plan["top_k"] = info.top_k;
    plan["search_queue"] = info.search_queue;
    plan["graph_degree"] = info.graph_degree;
    plan["query_neighbors"] = info.query_neighbors;
    plan["build_sample"] = info.build_sample;
    plan["tail_samples"] = info.tail_samples;
    plan["search_seeds"] = info.search_seeds;
    plan["insert_batch"] = info.insert_batch;
    plan["search_expand_first"] = info.search_expand_first;
    plan["search_full_expand"] = info.search_full_expand;
    plan["index"] = info.index_kind == RATTN_INDEX_EXACT ? "exact" : "graph";
    plan["cpu_kernels"] = info.cpu_kernels;
    json::object per_layer;  // each global layer's decode searches, resolved
    for (int layer : backend.global_layers()) {
      const rattn_layer_search s = backend.layer_search(layer);
      const auto [top_k, tail_samples] = backend.layer_retrieval(layer);
      per_layer[std::to_string(layer)] = json::object{{"top_k", top_k},
                                                      {"tail_samples", tail_samples},
                                                      {"search_queue", s.search_queue},
                                                      {"search_seeds", s.search_seeds},
                                                      {"search_expand_first", s.search_expand_first},
                                                      {"search_full_expand", s.search_full_expand}};
    }
    plan["layer_search"] = per_layer;
    return plan;
  };
  bool exact_check_failed = false;

  if (o.tokens > 0) {
    const std::string text = engine::read_text_file(o.text);
    const std::vector<int32_t> ids = engine::tokenize_prefix(*model, text, o.tokens, "rattn eval: error: '" + o.text + "'");
    const int64_t P = o.tokens - o.score_tokens, S = o.score_tokens;
    // The bar counts prefilled tokens (the prefill, the scoring, each
    // variant's index build as one more prefill); a decode step counts what
    // its time buys at the prefill's rate, measured on the run's first step.
    const double prefill_units = double(P + S) + double(variants.size()) * double(P);
    const double steps = double(o.check_exact && o.kv == RATTN_F16 ? S : 0) + double(variants.size()) * double(S);
    double step_units = 1, steps_done = 0, prefill_s_per_token = 0;
    bar.emplace("rattn eval", prefill_units + steps);
    auto step_done = [&](double step_s, const std::string& now) {
      if (steps_done == 0 && prefill_s_per_token > 0) {
        step_units = std::max(1.0, step_s / prefill_s_per_token);
        bar->set_total(prefill_units + steps * step_units);
      }
      ++steps_done;
      bar->advance(step_units, now);
    };
    GemmaSequence model_seq(*model, o.tokens + 1);
    GlobalQkv qkv;
    qkv.init(c, P);
    const std::vector<int32_t> prefix(ids.begin(), ids.begin() + P);
    const std::vector<int32_t> tail(ids.begin() + P, ids.end());
    double t0 = seconds_now();
    int64_t prefilled = 0;  // tokens of the running prefill already counted
    auto prefill_progress = [&](int64_t done) {
      bar->advance(double(done - prefilled), "prefill " + std::to_string(done) + " / " + std::to_string(P));
      prefilled = done;
    };
    // Layer by layer, as the overlapped prefill below runs (the same result).
    const std::vector<float> h_last = model_seq.prefill(prefix, {P - 1}, 512, qkv.hook(), prefill_progress, [](int) {});
    const double prefill_s = seconds_now() - t0;
    prefill_s_per_token = prefill_s / double(P);
    // Full attention: the scored tail in one batched pass (exactly what
    // token-by-token teacher-forced decoding computes).
    std::vector<int64_t> rows(size_t(S - 1));
    for (int64_t i = 0; i + 1 < S; ++i) rows[size_t(i)] = i;
    const std::vector<float> h_tail = model_seq.prefill(std::vector<int32_t>(tail.begin(), tail.end() - 1), rows, 512);
    bar->advance(double(S), "full attention scored");
    std::vector<float> h_all(size_t(S) * size_t(c.d_model));
    std::memcpy(h_all.data(), h_last.data(), h_last.size() * 4);
    std::memcpy(h_all.data() + c.d_model, h_tail.data(), h_tail.size() * 4);
    std::vector<float> logits_full(size_t(S) * size_t(c.vocab));
    model->output_head(h_all.data(), S, logits_full.data());
    model_seq.truncate(P);
    double nll_full = 0;
    for (int64_t i = 0; i < S; ++i) nll_full += engine::token_nll(&logits_full[size_t(i) * size_t(c.vocab)], c.vocab, tail[size_t(i)]);
    if (!o.dump_full.empty()) {
      std::string dump = "# tokens";
      for (int32_t id : ids) dump += " " + std::to_string(id);
      dump += "\n";
      char line[128];
      for (int64_t i = 0; i < S; ++i) {
        const float* lg = &logits_full[size_t(i) * size_t(c.vocab)];
        const int64_t top = std::max_element(lg, lg + c.vocab) - lg;
        std::snprintf(line, sizeof line, "%lld %d %lld %.9g\n", static_cast<long long>(P + i), tail[size_t(i)],
                      static_cast<long long>(top), engine::token_nll(lg, c.vocab, tail[size_t(i)]));
        dump += line;
      }
      write_file_atomic(o.dump_full, dump);
    }
    json::object tr;
    tr["context_tokens"] = P;
    tr["scored_tokens"] = S;
    tr["perplexity_full"] = std::exp(nll_full / double(S));
    tr["prefill_s"] = prefill_s;
    tr["agreement_mode"] = "teacher-forced: at every step both paths have seen the text's own tokens";
    log("full attention scored: perplexity " + std::to_string(std::exp(nll_full / double(S))) + " over " +
        std::to_string(S) + " tokens after a context of " + std::to_string(P));
    // The exact check's allowance for the K/V storage: full attention over
    // fp16-rounded K/V (global layers, as rattn stores them), teacher-forced
    // over the same steps, against full attention in fp32.
    std::vector<double> storage_rel(size_t(S), 0.0), storage_abs(size_t(S), 0.0);
    if (o.check_exact && o.kv == RATTN_F16) {
      engine::RoundedKvAttention rounded(c, model_seq);
      std::vector<float> lr(static_cast<size_t>(c.vocab));
      model->output_head(h_last.data(), 1, lr.data());
      t0 = seconds_now();
      for (int64_t i = 0; i < S; ++i) {
        const engine::ExactCheckStep st = engine::exact_check_step(&logits_full[size_t(i) * size_t(c.vocab)], lr.data(), lr.data(), c.vocab);
        storage_rel[size_t(i)] = st.storage_rel_error;
        storage_abs[size_t(i)] = st.storage_abs_error;
        if ((i + 1) % 32 == 0 || i + 1 == S) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "[fp16 K/V full attention] step %lld/%lld: logits rel err %.2e, max abs %.2e",
                        (long long)(i + 1), (long long)S, st.storage_rel_error, st.storage_abs_error);
          log(buf);
        }
        const double step_t0 = seconds_now();
        if (i + 1 < S) lr = model_seq.decode(tail[size_t(i)], &rounded);
        step_done(seconds_now() - step_t0, "fp16 K/V full attention, step " + std::to_string(i + 1));
      }
      model_seq.truncate(P);
      tr["fp16_kv_full_attention"] = json::object{
          {"logits_rel_error_max", *std::max_element(storage_rel.begin(), storage_rel.end())},
          {"logits_abs_error_max", *std::max_element(storage_abs.begin(), storage_abs.end())},
          {"decode_s_per_token", (seconds_now() - t0) / double(S)}};
    }
    json::array runs;
    std::map<std::string, std::unique_ptr<IndexCache>> index_caches;  // per plan file
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      const Variant& variant = variants[vi];
      // The first plan, by default: the prompt's prefill again, each global
      // layer's indexes building in the background from the moment the
      // layer is complete (as an engine runs it). Other plans: the build
      // alone, from the saved Q/K/V.
      const bool overlapped = vi == 0 && o.overlap;
      double engine_s = 0;
      t0 = seconds_now();
      std::unique_ptr<RattnAttention> owned;
      if (overlapped) {
        model_seq.truncate(0);
        prefilled = 0;
        owned = std::make_unique<RattnAttention>(c, attention_params(o, variant), qkv, &model_seq, true);
        RattnAttention& b = *owned;
        model_seq.prefill(prefix, {P - 1}, 512, qkv.hook(), prefill_progress, [&](int layer) {
          if (c.is_global(layer)) b.start_layer(layer);
        });
        engine_s = seconds_now() - t0;
        b.finish_prefill();
      } else {
        owned = std::make_unique<RattnAttention>(c, attention_params(o, variant), qkv, &model_seq);
      }
      RattnAttention& backend = *owned;
      const double rattn_prefill_s = seconds_now() - t0;
      if (!overlapped) bar->advance(double(P), "[" + variant.name + "] decode");  // else the prefill counted it
      // The rattn prefill, index build included, over the full-attention prefill.
      const double prefill_ratio = overlapped ? rattn_prefill_s / prefill_s : (prefill_s + rattn_prefill_s) / prefill_s;
      log("[" + variant.name + "] rattn prefill " +
          (overlapped ? "(model and index build overlapped) done in " + std::to_string(rattn_prefill_s) +
                            " s, waited " + std::to_string(rattn_prefill_s - engine_s) + " s after the model"
                      : "(index build) done in " + std::to_string(rattn_prefill_s) + " s") +
          "; " + std::to_string(prefill_ratio) + "x the full-attention prefill");
      double nll_rattn = 0, nll_full_so_far = 0;
      int agree = 0;
      std::vector<double> logit_err, kl, nll_diff;
      std::vector<engine::ExactCheckStep> check_steps;
      std::vector<float> logits_r(static_cast<size_t>(c.vocab));
      model->output_head(h_last.data(), 1, logits_r.data());
      t0 = seconds_now();
      for (int64_t i = 0; i < S; ++i) {
        const float* lf = &logits_full[size_t(i) * size_t(c.vocab)];
        const std::vector<float> lfv(lf, lf + c.vocab);
        const double nf = engine::token_nll(lf, c.vocab, tail[size_t(i)]),
                     nr = engine::token_nll(logits_r.data(), c.vocab, tail[size_t(i)]);
        nll_full_so_far += nf;
        nll_rattn += nr;
        nll_diff.push_back(nr - nf);
        kl.push_back(engine::kl_divergence(lf, logits_r.data(), c.vocab));
        agree += argmax(lfv) == argmax(logits_r) ? 1 : 0;
        if (variant.exact_check) {
          engine::ExactCheckStep st = engine::exact_check_step(lf, logits_r.data(), nullptr, c.vocab);
          st.storage_rel_error = storage_rel[size_t(i)];
          st.storage_abs_error = storage_abs[size_t(i)];
          check_steps.push_back(st);
        }
        double num = 0, den = 0;
        for (int64_t j = 0; j < c.vocab; ++j) {
          num += (double(logits_r[size_t(j)]) - lf[j]) * (double(logits_r[size_t(j)]) - lf[j]);
          den += double(lf[j]) * lf[j];
        }
        logit_err.push_back(std::sqrt(num / std::max(den, 1e-300)));
        if ((i + 1) % 32 == 0 || i + 1 == S) {
          char buf[320];
          std::snprintf(buf, sizeof buf,
                        "[%s] step %lld/%lld: ppl full %.4f rattn %.4f, agreement %.4f, KL mean %.2e, logits rel err %.2e",
                        variant.name.c_str(), (long long)(i + 1), (long long)S, std::exp(nll_full_so_far / double(i + 1)),
                        std::exp(nll_rattn / double(i + 1)), double(agree) / double(i + 1), bench::mean(kl), logit_err.back());
          log(buf);
        }
        // Teacher forcing: the next input is the text's token, not a prediction.
        const double step_t0 = seconds_now();
        if (i + 1 < S) logits_r = model_seq.decode(tail[size_t(i)], &backend);
        step_done(seconds_now() - step_t0, "[" + variant.name + "] step " + std::to_string(i + 1) + " / " +
                                                       std::to_string(S));
      }
      const double decode_s = seconds_now() - t0;
      model_seq.truncate(P);
      json::object run;
      run["rattn_plan"] = plan_json(backend, variant);
      run["perplexity_rattn"] = std::exp(nll_rattn / double(S));
      run["perplexity_ratio"] = std::exp((nll_rattn - nll_full) / double(S));
      run["next_token_agreement"] = double(agree) / double(S);
      // One-sided measures first: KL from full attention's next-token
      // distribution, agreement; the perplexity change only with its
      // bootstrap interval (over 256 tokens a change of a percent is noise).
      run["kl_mean"] = bench::mean(kl);
      run["kl_p99"] = quantile(kl, 0.99);
      run["kl_max"] = *std::max_element(kl.begin(), kl.end());
      {
        const engine::PerplexityDelta pd = engine::perplexity_delta(nll_diff);
        run["perplexity_delta"] = pd.delta;
        run["perplexity_delta_ci95"] = json::array{pd.lo, pd.hi};
        run["perplexity_delta_ci95_excludes_zero"] = pd.excludes_zero();
        run["perplexity_delta_bootstrap"] = "2000 resamples of the scored tokens, seed 1, percentile interval";
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "[%s] KL mean %.3e p99 %.3e, agreement %.2f%%, perplexity %+.2f%% (95%% interval %+.2f%% .. %+.2f%%%s)",
                      variant.name.c_str(), bench::mean(kl), quantile(kl, 0.99), 100.0 * agree / double(S),
                      100 * pd.delta, 100 * pd.lo, 100 * pd.hi, pd.excludes_zero() ? "" : ", includes 0");
        log(buf);
      }
      run["logits_rel_error_mean"] = bench::mean(logit_err);
      run["logits_rel_error_max"] = *std::max_element(logit_err.begin(), logit_err.end());
      run["rattn_prefill_s"] = rattn_prefill_s;
      run["rattn_prefill"] = overlapped ? "the model's prefill with the index build overlapped, until the wait returned"
                                        : "the index build alone, after the prefill";
      run["rattn_prefill_ratio"] = prefill_ratio;
      if (overlapped) run["index_wait_s"] = rattn_prefill_s - engine_s;
      run["decode_s_per_token"] = decode_s / double(S);
      // rattn's own step (S - 1 decode calls per global layer), without the
      // engine's dense layers and the float64 reference the eval computes.
      run["rattn_decode_ms_per_token"] = S > 1 ? 1e3 * backend.decode_seconds() / double(S - 1) : 0.0;
      log("[" + variant.name + "] rattn decode " + std::to_string(run["rattn_decode_ms_per_token"].as_double()) +
          " ms per token (every global layer's step)");
      run["static_set_share"] = std::min(1.0, double(backend.info().sinks + backend.info().window) / double(o.tokens));
      if (variant.exact_check) {
        const engine::ExactCheckReport rep = engine::exact_check(check_steps);
        run["exact_check_pass"] = rep.pass;
        json::object ec;
        ec["kv_dtype"] = o.kv == RATTN_F16 ? "f16" : "f32";
        ec["logits_rel_error_max"] = rep.logits_rel_error_max;
        ec["logits_gate"] = rep.logits_gate;
        ec["fp16_rounding_logits_rel_error_max"] = rep.storage_rel_error_max;
        ec["fp16_rounding_logits_abs_error_max"] = rep.storage_abs_error_max;
        json::array ties;
        for (const auto& t : rep.near_ties)
          ties.push_back(json::object{{"step", t.step},
                                      {"token_index", P + t.step},
                                      {"full_top2_margin", t.margin},
                                      {"bound", t.bound},
                                      {"argmax_flipped", t.flipped}});
        ec["near_ties"] = std::move(ties);
        ec["failing_flips"] = json::value_from(rep.failing_flips);
        if (!rep.pass) ec["reason"] = rep.reason;
        run["exact_check"] = std::move(ec);
        log("[" + variant.name + "] exact check " + (rep.pass ? "passed" : "FAILED: " + rep.reason) + "; gate " +
            std::to_string(rep.logits_gate) + " on logits rel. L2 " + std::to_string(rep.logits_rel_error_max) + ", " +
            std::to_string(rep.near_ties.size()) + " near-tie step(s)");
        for (const auto& t : rep.near_ties)
          log("  near tie at step " + std::to_string(t.step) + ": top-2 margin " + std::to_string(t.margin) +
              " <= bound " + std::to_string(t.bound) + (t.flipped ? " (argmax flipped: allowed)" : ""));
        exact_check_failed = exact_check_failed || !rep.pass;
      }
      json::array layers;
      for (size_t g = 0; g < qkv.layers.size(); ++g) {
        json::object L;
        L["layer"] = qkv.layers[g];
        const auto& e = backend.errors()[g];
        const auto& oe = backend.oracle_errors()[g];
        L["attention_rel_error_mean"] = bench::mean(e);
        L["attention_rel_error_max"] = e.empty() ? 0.0 : *std::max_element(e.begin(), e.end());
        L["exact_topk_rel_error_mean"] = bench::mean(oe);
        L["exact_topk_rel_error_max"] = oe.empty() ? 0.0 : *std::max_element(oe.begin(), oe.end());
        const auto& dq = backend.queries()[g];
        const int64_t nq = int64_t(dq.size()) / c.head_dim;
        L["mahalanobis_ratio"] = mahalanobis_ratio(qkv.k[g].data(), P, dq.data(), nq, c.head_dim);
        if (backend.info().index_kind == RATTN_INDEX_GRAPH && backend.info().top_k > 0) {
          log("[" + variant.name + "] index quality of layer " + std::to_string(qkv.layers[g]));
          const std::string plan_path = attention_params(o, variant).plan_path;
          auto& cache = index_caches[plan_path];
          if (!cache) cache = std::make_unique<IndexCache>(qkv, o.threads, plan_path);
          L["heads"] = index_quality(*cache, qkv, g, dq, backend.info(), backend.layer_search(qkv.layers[g]),
                                    backend.layer_retrieval(qkv.layers[g]).first, o.recall_k);
        }
        layers.push_back(L);
      }
      run["global_layers"] = layers;
      bar->note("text run " + json::serialize(run));
      runs.push_back(run);
      tr["runs"] = runs;
      result["text"] = tr;
      save();
    }
    bar->finish();
    bar.reset();
  }

  if (!o.passkey.empty()) {
    json::array trials;
    const Variant& variant = variants.front();
    for (const PasskeyLength& pl : o.passkey) {
      for (double depth : pl.depths.empty() ? o.depths : pl.depths) {
        // The key depends on the trial only, so separate runs reproduce it.
        const uint64_t seed = uint64_t(pl.length) * 1000003ull + uint64_t(std::llround(depth * 1000.0));
        const PasskeyPrompt p = passkey_prompt(*model, pl.length, depth, seed);
        const int64_t T = int64_t(p.ids.size());
        GemmaSequence model_seq(*model, T + 16);
        GlobalQkv qkv;
        qkv.init(c, T);
        const std::vector<float> h = model_seq.prefill(p.ids, {T - 1}, 512, qkv.hook());
        std::vector<float> logits(static_cast<size_t>(c.vocab));
        model->output_head(h.data(), 1, logits.data());
        const int steps = 8;
        // One prefill, two decodes: full attention, then rattn from the same cache.
        const std::string full = greedy(model_seq, *model, logits, steps, nullptr);
        model_seq.truncate(T);
        RattnAttention backend(c, attention_params(o, variant), qkv, nullptr);
        const std::string ratt = greedy(model_seq, *model, logits, steps, &backend);
        json::object t;
        t["length"] = T;
        t["depth"] = depth;
        t["passkey"] = p.key;
        t["full_answer"] = full;
        t["rattn_answer"] = ratt;
        t["full_pass"] = full.find(p.key) != std::string::npos;
        t["rattn_pass"] = ratt.find(p.key) != std::string::npos;
        t["rattn_plan"] = plan_json(backend, variant);
        log("passkey " + std::to_string(T) + " depth " + std::to_string(depth) + ": full '" + full + "' rattn '" + ratt + "'");
        std::fprintf(stderr, "rattn eval: passkey %s\n", json::serialize(t).c_str());
        trials.push_back(t);
        result["passkey"] = trials;
        save();
      }
    }
  }
  result["total_s"] = seconds_now() - t_start;
  const std::string out = json::serialize(result);
  std::printf("%s\n", out.c_str());
  save();
  if (exact_check_failed) {
    std::fprintf(stderr, "rattn eval: exact check FAILED: with every offloaded token retrieved, rattn must match full attention\n");
    return 1;
  }
  return 0;
}

}  // namespace rattn::cli
