#include "autotune/tune_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "autotune/search_tuner.h"
#include "core/progress.h"

namespace rattn {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Where a candidate's errors for `layer` are (its window and that layer's tail_samples).
size_t error_slot(const TuningRun& t, const PlanCandidate& c, int layer) {
  return t.error_slot(c.window, c.tail_at(layer));
}

// A candidate's top_k or tail_samples cell: the plan-wide value, then the
// layers' own ("200; layer 11: 1000").
std::string per_layer_cell(const PlanCandidate& c, bool tail) {
  const int64_t wide = tail ? c.tail_samples : int64_t(c.top_k);
  std::string text = std::to_string(wide);
  for (const auto& [layer, own] : c.layer_retrieval)
    if (const int64_t v = tail ? own.second : int64_t(own.first); v != wide)
      text += "; layer " + std::to_string(layer) + ": " + std::to_string(v);
  return text;
}

// " (0.0412 / 0.0398)": a setting's 95th-percentile errors, where measured.
std::string p95_text(const SearchPoint& p, size_t wi) {
  if (wi >= p.error_p95_tune.size() || wi >= p.error_p95_valid.size()) return "";
  return " (" + fmt("%.4f", p.error_p95_tune[wi]) + " / " + fmt("%.4f", p.error_p95_valid[wi]) + ")";
}

const PlanCandidate* chosen(const TuningRun& t) { return t.chosen >= 0 ? &t.candidates[size_t(t.chosen)] : nullptr; }

std::string search_text(const DecodeSearch& s) {
  std::ostringstream os;
  os << "queue " << s.queue << ", patience " << s.patience << ", seeds " << s.seeds << ", expand " << s.expand_first
     << ":" << s.full_expand;
  return os.str();
}

boost::json::object candidate_json(const TuningRun& t, const PlanCandidate& c) {
  boost::json::object o{{"sinks", c.sinks},       {"window", c.window},     {"top_k", c.top_k},
                        {"tail_samples", c.tail_samples}, {"feasible", c.feasible},
                        {"token_ms", c.token_ms}, {"gpu_static_gib", c.gpu_static_gib}};
  if (size_t(c.kernel_schedule) < t.kernel_schedules.size())
    o["cpu_kernel_schedule"] = t.kernel_schedules[size_t(c.kernel_schedule)].text();
  if (!c.why_not.empty()) o["why_not"] = c.why_not;
  boost::json::array layers;
  for (const auto& [layer, p] : c.layer_point) {
    const LayerTime& lt = c.layer_time.at(layer);
    const size_t wi = error_slot(t, c, layer);
    layers.push_back(boost::json::object{
        {"layer", layer},
        {"top_k", c.top_k_at(layer)},
        {"tail_samples", c.tail_at(layer)},
        {"search",
         {{"search_queue", p->search.queue},
          {"search_patience", p->search.patience},
          {"search_seeds", p->search.seeds},
          {"search_expand_first", p->search.expand_first},
          {"search_full_expand", p->search.full_expand}}},
        {"recall_tune", p->recall_tune},
        {"recall_se_tune", p->recall_se_tune},
        {"index_keys", p->index_keys},
        {"recall_valid", p->recall_valid},
        {"scored_tune", p->scored_tune},
        {"scored_valid", p->scored_valid},
        {"output_error_tune", wi < p->error_tune.size() ? p->error_tune[wi] : -1.0},
        {"output_error_valid", wi < p->error_valid.size() ? p->error_valid[wi] : -1.0},
        {"output_error_p95_tune", wi < p->error_p95_tune.size() ? p->error_p95_tune[wi] : -1.0},
        {"output_error_p95_valid", wi < p->error_p95_valid.size() ? p->error_p95_valid[wi] : -1.0},
        {"us_per_search", p->us_per_search},
        {"cpu_us", lt.cpu_us},
        {"gpu_us", lt.gpu_us},
        {"gpu_measured", lt.gpu_measured}});
    if (const auto m = c.modelled_cpu_us.find(layer); m != c.modelled_cpu_us.end()) {
      layers.back().as_object()["cpu_us_engine_measured"] = true;
      layers.back().as_object()["cpu_us_modelled"] = m->second;
    }
  }
  o["layers"] = std::move(layers);
  // Each sample's own measurement of its layer's setting (the setting, or
  // its variant at a queue no longer): the figures every set must meet.
  boost::json::array samples;
  for (size_t si = 0; si < c.sample_point.size() && si < t.samples.size(); ++si) {
    const SearchPoint* q = c.sample_point[si];
    if (!q) continue;
    const LayerSample& s = t.samples[si];
    const size_t wi = error_slot(t, c, s.layer);
    samples.push_back(boost::json::object{
        {"layer", s.layer},
        {"kv_head", s.kv_head},
        {"calib", s.calib},
        {"search_queue", q->search.queue},
        {"recall_tune", q->recall_tune},
        {"recall_valid", q->recall_valid},
        {"output_error_tune", wi < q->error_tune.size() ? q->error_tune[wi] : -1.0},
        {"output_error_valid", wi < q->error_valid.size() ? q->error_valid[wi] : -1.0},
        {"output_error_p95_tune", wi < q->error_p95_tune.size() ? q->error_p95_tune[wi] : -1.0},
        {"output_error_p95_valid", wi < q->error_p95_valid.size() ? q->error_p95_valid[wi] : -1.0}});
  }
  o["samples"] = std::move(samples);
  return o;
}

boost::json::object recipe_json(const RecipeResult& r, bool is_chosen) {
  const BuildRecipe& b = r.recipe;
  boost::json::object o{{"graph_degree", b.graph_degree},
                        {"query_neighbors", b.query_neighbors},
                        {"build_sample", b.build_sample},
                        {"key_metric", b.key_metric},
                        {"traversal_codes", b.traversal_codes},
                        {"code_dims", b.code_dims},
                        {"shift_queries", b.shift_queries},
                        {"shared_graph", b.shared_graph},
                        {"round", r.round},
                        {"index_memory_ratio", r.memory_ratio},
                        {"build_s", r.build_s},
                        {"chosen", is_chosen}};
  if (!r.screens.empty()) {
    o["recall_met"] = r.met();
    o["keys_scored"] = r.mean_keys_scored();
    o["scored_fraction"] = r.mean_scored();
    o["insert_us"] = r.mean_insert_us();
    o["modelled_cpu_us"] = std::isfinite(r.score_us) ? boost::json::value(r.score_us) : boost::json::value(nullptr);
    boost::json::array screens;
    for (const RecipeScreen& sc : r.screens)
      screens.push_back({{"layer", sc.layer}, {"kv_head", sc.kv_head}, {"calib", sc.calib}, {"top_k", sc.top_k},
                         {"index_keys", sc.index_keys}, {"met", sc.met}, {"search", search_text(sc.search)},
                         {"recall", sc.recall}, {"scored_fraction", sc.scored}, {"us_per_key", sc.us_per_key},
                         {"insert_us", sc.insert_us}, {"build_s", sc.build_s}});
    o["screens"] = std::move(screens);
  }
  if (r.round == 3) {
    o["feasible"] = r.feasible;
    o["token_ms"] = r.token_ms;
  }
  if (!r.why_dropped.empty()) o["why_dropped"] = r.why_dropped;
  return o;
}

// A recipe by the knobs whose domains the plan leaves open.
std::string recipe_label(const RetrievalPlan& plan, const BuildRecipe& r) {
  std::string out;
  auto add = [&](const ParamDomain& d, const char* key, double v) {
    if (d.is_fixed()) return;
    out += (out.empty() ? "" : ", ") + std::string(key) + " " + fmt("%g", v);
  };
  add(plan.graph_degree, "graph_degree", r.graph_degree);
  add(plan.query_neighbors, "query_neighbors", r.query_neighbors);
  add(plan.build_sample, "build_sample", r.build_sample);
  add(plan.key_metric, "key_metric", r.key_metric);
  add(plan.traversal_codes, "traversal_codes", r.traversal_codes ? 1 : 0);
  add(plan.code_dims, "code_dims", r.code_dims);
  add(plan.shift_queries, "shift_queries", r.shift_queries);
  add(plan.shared_graph, "shared_graph", r.shared_graph ? 1 : 0);
  return out.empty() ? "the plan's" : out;
}

// The build-recipe search: a table of the recipes and why the choice won.
std::string recipe_section(const RetrievalPlan& plan, const TuningRun& t, const PlanTuneOptions& opt) {
  std::ostringstream os;
  os << "## The build recipe\n\n";
  size_t excluded = 0, round1 = 0, round2 = 0, finals = 0;
  for (const RecipeResult& r : t.recipes) (r.round == 0 ? excluded : r.round == 1 ? round1 : r.round == 2 ? round2 : finals)++;
  os << t.recipes.size() << " recipes (the product of the plan's build domains), by successive halving: "
     << excluded << " excluded by index memory" << (opt.max_index_memory > 0 ? " (--max-index-memory " + fmt("%g", opt.max_index_memory) + ")" : "")
     << ", " << round1 << " dropped after the screen on the first sampled layer, " << round2
     << " after the screens on every sampled layer, " << finals << " measured fully. Keys scored and insertion: "
        "the screens' means (the default top_k on the smallest window's index); index memory: index bytes over "
        "offloaded KV bytes (the memory plan's estimate).\n\n"
     << "Recipes are named by the knobs the plan leaves open.\n\n"
     << "| recipe | round | keys scored | insert us | index memory | build s | ms per token | note |\n"
     << "|---|---|---|---|---|---|---|---|\n";
  std::vector<size_t> order(t.recipes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return t.recipes[a].round > t.recipes[b].round; });
  for (size_t i : order) {
    const RecipeResult& r = t.recipes[i];
    os << "| " << recipe_label(plan, r.recipe) << " | " << r.round << " | "
       << (r.screens.empty() ? std::string("-") : fmt("%.0f", r.mean_keys_scored()) + " (" + fmt("%.2f", 100 * r.mean_scored()) + "%)")
       << " | " << (r.screens.empty() ? std::string("-") : fmt("%.1f", r.mean_insert_us())) << " | "
       << fmt("%.3f", r.memory_ratio) << " | " << fmt("%.1f", r.build_s) << " | "
       << (r.round == 3 && r.feasible ? fmt("%.3f", r.token_ms) : std::string("-")) << " | "
       << (int(i) == t.chosen_recipe && t.chosen >= 0 ? std::string("**chosen**") : r.why_dropped) << " |\n";
  }
  os << "\n";
  if (t.chosen_recipe < 0 || t.chosen < 0) {
    os << "No fully measured recipe had a plan that met the constraints; the figures above are the best-ranked "
          "finalist's.\n\n";
    return os.str();
  }
  const RecipeResult& c = t.recipes[size_t(t.chosen_recipe)];
  os << "**Why:** " << recipe_label(plan, c.recipe) << " gives " << fmt("%.3f", c.token_ms) << " ms per token";
  for (const RecipeResult& r : t.recipes) {
    if (&r == &c || r.round != 3) continue;
    if (!r.feasible) {
      os << "; " << recipe_label(plan, r.recipe) << " had no plan that met the constraints";
    } else if (r.token_ms <= c.token_ms * (1 + kTimeTolerance) && r.token_ms >= c.token_ms / (1 + kTimeTolerance)) {
      os << "; " << recipe_label(plan, r.recipe) << " is as fast (" << fmt("%.3f", r.token_ms) << " ms, within "
         << fmt("%.0f", 100 * kTimeTolerance) << "%) but needs more index memory (" << fmt("%.3f", r.memory_ratio)
         << " against " << fmt("%.3f", c.memory_ratio) << ")";
    } else {
      os << "; " << recipe_label(plan, r.recipe) << " " << fmt("%.3f", r.token_ms) << " ms (" << fmt("%+.1f%%", 100 * (r.token_ms / c.token_ms - 1)) << ")";
    }
  }
  os << ". The recipes dropped earlier scored more modelled CPU time per layer (search, attention over the top-k and "
        "insertion) than the survivors, or missed the recall target at every queue.\n\n";
  return os.str();
}

// A scatter plot: per sampled layer, every measured setting that met the
// recall target, at each window: layer step time against output error.
std::string frontier_svg(const TuningRun& t, size_t si, const PlanTuneOptions& opt) {
  const LayerSample& s = t.samples[si];
  // The sample's own measurement of a candidate's setting for its layer.
  auto own = [&](const PlanCandidate& cand) {
    return si < cand.sample_point.size() && cand.sample_point[si] ? cand.sample_point[si] : cand.layer_point.at(s.layer);
  };
  struct Dot {
    double x, y;
    int kind;  // 0 other, 1 chosen, 2 baseline
    int top_k;
  };
  std::vector<Dot> dots;
  const PlanCandidate* c = chosen(t);
  for (const PlanCandidate& cand : t.candidates) {
    if (!cand.layer_time.count(s.layer)) continue;
    const SearchPoint* p = own(cand);
    const size_t wi = error_slot(t, cand, s.layer);
    dots.push_back({cand.layer_time.at(s.layer).step_us(), p->error_tune[wi], &cand == c ? 1 : 0, cand.top_k_at(s.layer)});
  }
  if (t.baseline.layer_time.count(s.layer)) {
    const SearchPoint* p = own(t.baseline);
    dots.push_back({t.baseline.layer_time.at(s.layer).step_us(), p->error_tune[error_slot(t, t.baseline, s.layer)], 2,
                    t.baseline.top_k});
  }
  if (dots.empty()) return "";
  const double bound = t.error_bounds.count(s.layer) ? t.error_bounds.at(s.layer) : opt.max_output_error;
  double x0 = 1e300, x1 = 0, y1 = bound;
  for (const Dot& d : dots) x0 = std::min(x0, d.x), x1 = std::max(x1, d.x), y1 = std::max(y1, d.y);
  x0 *= 0.9, x1 *= 1.1, y1 *= 1.1;
  const double W = 480, H = 240, L = 60, B = 40;
  auto px = [&](double x) { return L + (x - x0) / std::max(x1 - x0, 1e-9) * (W - L - 10); };
  auto py = [&](double y) { return H - B - y / y1 * (H - B - 10); };
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" font-size=\"11\">\n"
     << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << H - B << "\" x2=\"" << W - 10 << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"10\" x2=\"" << L << "\" y2=\"" << H - B << "\" stroke=\"black\"/>\n"
     << "<line x1=\"" << L << "\" y1=\"" << py(bound) << "\" x2=\"" << W - 10 << "\" y2=\"" << py(bound)
     << "\" stroke=\"gray\" stroke-dasharray=\"4\"/>\n"
     << "<text x=\"" << L + 4 << "\" y=\"" << py(bound) - 4 << "\" fill=\"gray\">max output error "
     << fmt("%.4f", bound) << "</text>\n"
     << "<text x=\"" << (L + W) / 2 << "\" y=\"" << H - 8 << "\" text-anchor=\"middle\">layer step time (us), all heads, "
     << opt.threads << " threads</text>\n"
     << "<text x=\"12\" y=\"" << (H - B) / 2 << "\" transform=\"rotate(-90 12 " << (H - B) / 2
     << ")\" text-anchor=\"middle\">output error (rel. L2)</text>\n"
     << "<text x=\"" << L << "\" y=\"" << H - B + 14 << "\">" << fmt("%.0f", x0) << "</text>\n"
     << "<text x=\"" << W - 10 << "\" y=\"" << H - B + 14 << "\" text-anchor=\"end\">" << fmt("%.0f", x1) << "</text>\n"
     << "<text x=\"" << L - 4 << "\" y=\"14\" text-anchor=\"end\">" << fmt("%.3f", y1) << "</text>\n";
  const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"};
  std::vector<int> ks;
  for (const Dot& d : dots)
    if (std::find(ks.begin(), ks.end(), d.top_k) == ks.end()) ks.push_back(d.top_k);
  for (const Dot& d : dots) {
    const size_t ci = size_t(std::find(ks.begin(), ks.end(), d.top_k) - ks.begin()) % 5;
    if (d.kind == 0)
      os << "<circle cx=\"" << px(d.x) << "\" cy=\"" << py(d.y) << "\" r=\"3\" fill=\"" << colors[ci] << "\"/>\n";
    else
      os << "<circle cx=\"" << px(d.x) << "\" cy=\"" << py(d.y) << "\" r=\"7\" fill=\"none\" stroke=\""
         << (d.kind == 1 ? "red" : "black") << "\" stroke-width=\"2\"/>\n<text x=\"" << px(d.x) + 9 << "\" y=\""
         << py(d.y) + 4 << "\">" << (d.kind == 1 ? "chosen" : "paper's plan") << "</text>\n";
  }
  for (size_t i = 0; i < ks.size(); ++i)
    os << "<text x=\"" << W - 90 << "\" y=\"" << 20 + 14 * i << "\" fill=\"" << colors[i % 5] << "\">top_k "
       << ks[i] << "</text>\n";
  os << "</svg>\n";
  return os.str();
}

// Why this target chose what it did.
std::string explain(const TuningRun& t) {
  const PlanCandidate* c = chosen(t);
  if (!c) return "no candidate met the constraints.";
  std::ostringstream os;
  double cpu = 0, gpu = 0;
  for (const auto& [l, lt] : c->layer_time) cpu = std::max(cpu, lt.cpu_us), gpu = std::max(gpu, lt.gpu_us);
  os << c->label() << ": " << fmt("%.1f", c->token_ms) << " ms per token. ";
  int failed = 0;
  for (const auto& [key, outcome] : t.model_checks) failed += outcome.passed ? 0 : 1;
  if (failed > 0)
    os << failed << " earlier choice" << (failed == 1 ? "" : "s") << " met every layer's bounds but failed the model "
       << "check (section \"The model in the loop\"). ";
  if (!t.gpu) {
    os << "Without a GPU the static set runs on the CPU beside the retrieval, so every window row costs CPU "
          "time; a larger window pays only where it lets a cheaper top-k or search meet the error bound.";
    return os.str();
  }
  os << "On the " << t.gpu->name << " the static set takes " << fmt("%.0f", gpu) << " us per layer against the CPU's "
     << fmt("%.0f", cpu) << " us, so it " << (gpu < cpu ? "hides behind the CPU's work" : "sets the pace") << ". ";
  // What stopped a larger window.
  for (const PlanCandidate& o : t.candidates)
    if (o.top_k == c->top_k && o.tail_samples == c->tail_samples && o.layer_retrieval == c->layer_retrieval &&
        o.window > c->window) {
      if (!o.feasible && o.why_not.find("GPU") != std::string::npos)
        os << "Window " << o.window << " does not fit: " << o.why_not << " (" << t.gpu->memory_gib
           << " GiB card, weights about " << fmt("%.1f", t.weights_gib) << " GiB). ";
      else if (o.feasible)
        os << "Window " << o.window << " would take " << fmt("%.1f", o.token_ms) << " ms per token"
           << (o.token_ms > c->token_ms * (1 + kTimeTolerance) ? ": the GPU's static set would set the pace. "
                                                                : ". ");
      break;
    }
  return os.str();
}

// The model's CPU time of each engine-checked candidate's sampled layers
// against the runtime's decode step.
std::string engine_check_section(const TuningRun& t) {
  std::ostringstream os;
  os << "## The CPU time model against the runtime's decode step\n\n"
     << "The runtime's own step (Sequence::decode, one KV head's group prefilled with the sampled layer's "
        "data, the caches flushed before each step, the median of 48 steps after 8; the first candidates "
        "taking turns at each step) for "
     << t.engine_checked << " candidates; a measured layer's time replaces the model's in the choice.\n\n"
     << "| window | top_k | tail_samples | layer | modelled us | measured us | measured / modelled |\n"
        "|---|---|---|---|---|---|---|\n";
  std::vector<double> ratios;
  for (const PlanCandidate& c : t.candidates)
    for (const auto& [layer, modelled] : c.modelled_cpu_us) {
      const double measured = c.layer_time.at(layer).cpu_us;
      ratios.push_back(measured / modelled);
      os << "| " << c.window << " | " << c.top_k_at(layer) << " | " << c.tail_at(layer) << " | " << layer << " | "
         << fmt("%.0f", modelled) << " | " << fmt("%.0f", measured) << " | " << fmt("%.2f", measured / modelled)
         << " |\n";
    }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    os << "\nMeasured / modelled: median " << fmt("%.2f", ratios[ratios.size() / 2]) << ", range "
       << fmt("%.2f", ratios.front()) << " - " << fmt("%.2f", ratios.back()) << ".";
  }
  if (t.model_chosen >= 0 && t.model_chosen != t.chosen && size_t(t.model_chosen) < t.candidates.size()) {
    const PlanCandidate& m = t.candidates[size_t(t.model_chosen)];
    os << " On modelled times alone the choice was " << m.label()
       << "; measured, it takes " << fmt("%.1f", m.token_ms)
       << " ms per token.";
  }
  os << "\n";
  return os.str();
}

std::string model_check_section(const TuningRun& t, const PlanTuneOptions& opt) {
  std::ostringstream os;
  os << "## The model in the loop\n\n"
     << "Each choice's whole plan decoded check texts through the real model, teacher-forced, against full "
        "attention from the same prefill (greedy next-token agreement pooled over the texts, perplexity on "
        "each, and, given a reference plan, the KL divergence of the next-token distribution pooled over the "
        "texts against a multiple of the reference's); a candidate that failed was excluded and the pass chose "
        "again, at most "
     << opt.model_check << " candidates.\n\n| candidate | ms per token | outcome | texts |\n|---|---|---|---|\n";
  for (const TuningRun::ModelCheckEntry& e : t.model_check_log) {
    const auto it = t.model_checks.find(e.key);
    if (it == t.model_checks.end()) continue;
    os << "| " << e.label << " | " << fmt("%.1f", e.token_ms) << " | " << (it->second.passed ? "passed" : "failed")
       << (e.reused ? " (database)" : "") << " | " << it->second.summary() << " |\n";
  }
  if (!t.model_check_met)
    os << "\nThe chosen plan has **not** passed the model check" << (t.chosen >= 0 ? " (no more checks allowed)" : "")
       << ".\n";
  return os.str();
}

}  // namespace

std::string plan_tuning_summary(const TuningRun& t) {
  std::ostringstream os;
  const PlanCandidate* c = chosen(t);
  if (!c) return "rattn tune: no plan met the constraints on " + t.target;
  os << "rattn tune: " << t.target << ": " << c->label() << " -> "
     << fmt("%.1f", c->token_ms) << " ms per token at " << t.context << " tokens";
  if (t.baseline.feasible)
    os << "; the paper's plan " << fmt("%.1f", t.baseline.token_ms) << " ms (" << fmt("%.2f", t.baseline.token_ms / c->token_ms)
       << "x" << (t.baseline_within_error ? "" : ", above the output-error bound") << ")";
  if (t.engine_checked > 0) os << "; the runtime's step measured for " << t.engine_checked << " candidates";
  if (!t.model_check_log.empty())
    os << "; model check " << (t.model_check_met ? "passed" : "NOT passed") << " (" << t.model_check_log.size()
       << " checked)";
  os << "; held-out recall >= " << fmt("%.3f", t.validation_recall_min) << ", output error <= "
     << fmt("%.4f", t.validation_error_max) << (t.validation_met ? "" : " (constraint NOT met on held-out queries)");
  return os.str();
}

boost::json::object plan_tuning_json(const Program& program, const PlanTuneOptions& opt, const TuningRun& t) {
  boost::json::object o;
  o["model"] = program.model.name;
  o["context"] = t.context;
  o["target"] = {{"gpu", t.target},
                 {"gpu_spec", t.gpu ? boost::json::value{{"name", t.gpu->name},
                                                         {"arch", t.gpu->arch},
                                                         {"memory_gib", t.gpu->memory_gib},
                                                         {"bandwidth_gbs", t.gpu->bandwidth_gbs},
                                                         {"sms", t.gpu->sms},
                                                         {"link", t.gpu->link},
                                                         {"link_gbs", t.gpu->link_gbs},
                                                         {"source", t.gpu->source}}
                                    : boost::json::value(nullptr)},
                 {"threads", opt.threads},
                 {"kv_storage", dtype_name(opt.kv_storage)},
                 {"sequences", opt.sequences},
                 {"gpu_budget_gib", t.gpu_budget_gib},
                 {"weights_gib_estimate", t.weights_gib}};
  o["fingerprint"] = {{"text", t.fingerprint.text()}, {"hash", t.fingerprint.hash()}};
  boost::json::object bounds;
  for (const auto& [layer, b] : t.error_bounds) bounds[std::to_string(layer)] = b;
  o["constraints"] = {{"min_recall", opt.min_recall}, {"recall_k", opt.recall_k}, {"confidence", opt.confidence},
                      {"max_output_error", opt.max_output_error},
                      {"output_error_bound_per_layer", std::move(bounds)},
                      {"test_queries", opt.test_queries}, {"holdout", opt.holdout}, {"holdout_block", opt.holdout_block}};
  o["summary"] = plan_tuning_summary(t);
  if (const PlanCandidate* c = chosen(t)) o["chosen"] = candidate_json(t, *c);
  o["validation"] = {{"recall_min", t.validation_recall_min}, {"output_error_max", t.validation_error_max},
                     {"met", t.validation_met}};
  o["baseline"] = candidate_json(t, t.baseline);
  o["baseline"].as_object()["met"] = t.baseline_met;
  o["baseline"].as_object()["within_output_error_bound"] = t.baseline_within_error;
  if (const PlanCandidate* c = chosen(t); c && t.baseline.feasible) o["speedup_vs_baseline"] = t.baseline.token_ms / c->token_ms;
  boost::json::array cands;
  for (const PlanCandidate& c : t.candidates) {
    // A feasible candidate's full record, so that any of them can be checked
    // against the engine (rattn eval --variant), not only the chosen one.
    boost::json::object x = c.feasible ? candidate_json(t, c) : boost::json::object{{"window", c.window},
                                                                                    {"top_k", c.top_k},
                                                                                    {"tail_samples", c.tail_samples},
                                                                                    {"feasible", c.feasible},
                                                                                    {"token_ms", c.token_ms}};
    x["why_not"] = c.why_not;
    if (c.per_layer()) {
      boost::json::object own;  // sampled layer -> its own top_k and tail_samples
      for (const auto& [layer, r] : c.layer_retrieval)
        own[std::to_string(layer)] = boost::json::object{{"top_k", r.first}, {"tail_samples", r.second}};
      x["layer_retrieval"] = std::move(own);
    }
    cands.push_back(std::move(x));
  }
  o["candidates"] = std::move(cands);
  boost::json::array samples;
  for (const LayerSample& s : t.samples) {
    boost::json::object window_keys;
    for (const auto& [w, keys] : s.window_keys) window_keys[std::to_string(w)] = keys;
    samples.push_back({{"layer", s.layer}, {"kv_head", s.kv_head}, {"calib", s.calib}, {"keys", s.keys},
                       {"index_keys_per_window", std::move(window_keys)}, {"build_s", s.build_s},
                       {"insert_us", s.insert_us}, {"settings_measured", s.points.size()}});
  }
  o["samples"] = std::move(samples);
  boost::json::object gathered, dense, tail;
  for (const auto& [n, us] : t.kernel_times().gathered_us) gathered[std::to_string(n)] = us;
  for (const auto& [n, us] : t.kernel_times().dense_us) dense[std::to_string(n)] = us;
  for (const auto& [n, us] : t.kernel_times().tail_us) tail[std::to_string(n)] = us;
  o["cpu_kernels_us"] = {{"gathered_attention", gathered},
                         {"dense_attention_group", dense},
                         {"tail_estimate_group", tail},
                         {"merge", t.kernel_times().merge_us},
                         {"timed", "one thread, cold: each call on rows the previous calls did not touch"}};
  if (t.gpu) {
    if (size_t(t.chosen_gpu_variant) < t.gpu_variants.size())
      o["gpu_kernel"] = t.gpu_variants[size_t(t.chosen_gpu_variant)].text();
    boost::json::array cmp = gpu_model_check_json(*t.gpu, program.model, t.gpu_variants, t.gpu_measured_us);
    if (!cmp.empty()) o["gpu_model_check"] = std::move(cmp);
  }
  if (!t.recipes.empty()) {
    boost::json::array recipes;
    for (size_t i = 0; i < t.recipes.size(); ++i)
      recipes.push_back(recipe_json(t.recipes[i], int(i) == t.chosen_recipe && t.chosen >= 0));
    o["build_recipes"] = std::move(recipes);
    if (t.chosen_recipe >= 0) o["build_recipe_measured"] = t.recipes[size_t(t.chosen_recipe)].recipe.text();
    o["max_index_memory"] = opt.max_index_memory;
  }
  if (!t.model_check_log.empty()) {
    boost::json::array checked;
    for (const TuningRun::ModelCheckEntry& e : t.model_check_log) {
      const auto it = t.model_checks.find(e.key);
      if (it == t.model_checks.end()) continue;
      boost::json::array texts;
      for (const ModelCheckText& x : it->second.texts)
        texts.push_back({{"text", x.text}, {"positions", x.positions}, {"agreement", x.agreement()},
                         {"perplexity_ratio", x.perplexity_ratio}, {"kl_mean", x.kl_mean},
                         {"stopped_early", x.stopped_early}});
      checked.push_back({{"candidate", e.label}, {"token_ms", e.token_ms}, {"passed", it->second.passed},
                         {"kl_mean", it->second.kl_mean}, {"kl_bound", it->second.kl_bound},
                         {"from_database", e.reused}, {"texts", std::move(texts)}});
    }
    o["model_check"] = {{"met", t.model_check_met}, {"max_candidates", opt.model_check},
                        {"scope", opt.model_check_scope}, {"checked", std::move(checked)}};
  }
  o["database"] = {{"reused", t.db_reused}, {"measured", t.db_measured}, {"foreign", t.db_foreign}};
  o["seconds"] = t.seconds;
  return o;
}

std::string plan_tuning_report(const Program& program, const PlanTuneOptions& opt, const TuningRun& t,
                               const std::vector<TuningRun>& others) {
  const ModelLayout& m = program.model;
  std::ostringstream os;
  os << "# rattn tune: " << m.name << " at " << t.context << " tokens\n\n"
     << "**" << plan_tuning_summary(t) << "**\n\n"
     << "- Target: CPU " << t.fingerprint.cpu_model << " (" << t.fingerprint.isa << "), " << opt.threads
     << " threads; GPU " << t.target << (t.gpu_measured_us.empty() && t.gpu ? " (predicted by the GPU model)" : "")
     << "; K/V stored as " << dtype_name(opt.kv_storage) << " (the model's " << dtype_name(m.kv_dtype) << ")"
     << "\n- Data: ";
  if (opt.synthetic) os << "the synthetic generator";
  for (size_t i = 0; i < opt.calib_dirs.size(); ++i) os << (i ? ", " : "") << opt.calib_dirs[i];
  if (opt.calib_dirs.size() > 1) os << " (" << opt.calib_dirs.size() << " calibration sets, each measured; a layer's setting serves every one)";
  os << "; samples:";
  for (size_t i = 0; i < t.samples.size(); ++i) os << (i ? ", " : " ") << t.samples[i].label();
  os << "; the other global layers take the nearest sampled layer's figures, and every KV head the sampled one's.\n"
     << "- Constraints, per sampled layer: recall@"
     << (opt.recall_k > 0 ? "min(top_k, " + std::to_string(opt.recall_k) + ")" : std::string("top_k")) << " >= "
     << opt.min_recall << " and mean output error (relative L2 "
     << "against full attention) no more than "
     << (opt.max_output_error > 0 ? fmt("%g", opt.max_output_error) : std::string("the paper's plan's own on that layer"))
     << ", chosen on the tuning queries (the recall less " << fmt("%.2f", confidence_z(opt.confidence))
     << " standard errors, one-sided confidence " << opt.confidence << "), reported on the held-out ones.\n"
     << "- The paper reports " << kPaperTokenSeconds * 1000 << " ms per token for the whole Llama-3-8B model at 128K "
     << "(10-core CPU + RTX 4090); this report's times cover attention only (retrieval, static set, insertion, merge).\n\n";

  os << "## The choice\n\n";
  if (const PlanCandidate* c = chosen(t)) {
    os << "| layer | top_k, tail_samples | search | recall@" << opt.recall_depth(c->top_k)
       << " tune (± s.e.) / held-out | output error tune / held-out (95th percentile) | CPU us | GPU us |\n"
       << "|---|---|---|---|---|---|---|\n";
    for (const auto& [layer, p] : c->layer_point) {
      const LayerTime& lt = c->layer_time.at(layer);
      const size_t wi = error_slot(t, *c, layer);
      os << "| " << layer << " | " << c->top_k_at(layer) << ", " << c->tail_at(layer) << " | " << search_text(p->search) << " | " << fmt("%.4f", p->recall_tune) << " ± "
         << fmt("%.4f", p->recall_se_tune) << " / " << fmt("%.4f", p->recall_valid) << " | " << fmt("%.4f", p->error_tune[wi]) << " / "
         << fmt("%.4f", p->error_valid[wi]) << p95_text(*p, wi) << " | " << fmt("%.0f", lt.cpu_us) << " | " << fmt("%.0f", lt.gpu_us)
         << (lt.gpu_measured ? " (measured)" : "") << " |\n";
    }
    if (t.samples.size() > c->layer_point.size()) {
      os << "\nPer sample, its own measurement of its layer's setting (there, or its variant at a queue no longer):\n\n"
         << "| sample | queue | recall@" << opt.recall_depth(c->top_k) << " tune / held-out | output error tune / held-out (95th percentile) |\n"
         << "|---|---|---|---|\n";
      for (size_t si = 0; si < t.samples.size() && si < c->sample_point.size(); ++si) {
        const SearchPoint* q = c->sample_point[si];
        if (!q) continue;
        const size_t wi = error_slot(t, *c, t.samples[si].layer);
        os << "| " << t.samples[si].label() << " | " << q->search.queue << " | " << fmt("%.4f", q->recall_tune) << " / "
           << fmt("%.4f", q->recall_valid) << " | " << fmt("%.4f", q->error_tune[wi]) << " / "
           << fmt("%.4f", q->error_valid[wi]) << p95_text(*q, wi) << " |\n";
      }
    }
    bool cpu_idle = true;
    for (const auto& [layer, lt] : c->layer_time) cpu_idle = cpu_idle && lt.cpu_us == 0;
    if (t.kernel_schedules.size() > 1 && cpu_idle) {
      os << "\nCPU kernels: none run in this choice (the static set holds the whole context on the GPU): "
         << t.kernel_schedules[size_t(c->kernel_schedule)].text() << ", the plan's default, kept.\n";
    } else if (t.kernel_schedules.size() > 1) {
      os << "\nCPU kernels: " << t.kernel_schedules[size_t(c->kernel_schedule)].text() << ", the fastest for this "
         << "choice of the " << t.kernel_schedules.size() << " Halide schedules timed (partial attention over the top-"
         << c->top_k << ", one query head:";
      for (const KernelSchedule& ks : t.kernel_schedules)
        os << " " << ks.text() << " " << fmt("%.2f", ks.times.gathered_us.at(c->top_k)) << " us;";
      os << " the first is the plan's default).\n";
    }
    if (!t.validation_met)
      os << "\nThe held-out queries disagree with the tuning queries: a constraint is not met on them. More test "
            "queries (--queries) make the choice steadier.\n";
  }
  os << "\nThe paper's plan (128 + 512, top-100, "
     << (t.recipes.empty() ? "the plan's default build" : "the measured build recipe's index")
     << " and the plan's default search, the queue raised until the "
        "held-out recall@100 meets " << opt.min_recall << "): " << fmt("%.1f", t.baseline.token_ms) << " ms per token"
     << (t.baseline_met ? "" : " (its queue domain ended before the held-out recall met the target)")
     << (t.baseline_within_error ? "" : "; its held-out output error is above the bound, so it is no alternative at "
                                        "this accuracy")
     << ".\n\n";
  for (const auto& [layer, p] : t.baseline.layer_point)
    os << "- layer " << layer << ": " << search_text(p->search) << ", held-out recall " << fmt("%.4f", p->recall_valid)
       << ", output error " << fmt("%.4f", p->error_valid[error_slot(t, t.baseline, layer)]) << "\n";

  if (!t.recipes.empty()) os << "\n" << recipe_section(program.plan, t, opt);
  os << "\n## Every candidate\n\n| window | top_k | tail_samples | ms per token | note |\n|---|---|---|---|---|\n";
  for (const PlanCandidate& c : t.candidates)
    os << "| " << c.window << " | " << per_layer_cell(c, false) << " | " << per_layer_cell(c, true) << " | " << (c.feasible ? fmt("%.1f", c.token_ms) : "-") << " | "
       << (&c == chosen(t) ? "**chosen**" : c.why_not) << (c.modelled_cpu_us.empty() ? "" : " (engine-checked)") << " |\n";
  if (t.engine_checked > 0) os << "\n" << engine_check_section(t);
  if (!t.model_check_log.empty()) os << "\n" << model_check_section(t, opt);

  os << "\n## The frontier per sampled layer\n\nEach dot: a candidate's setting for the layer (top_k by colour) at its "
        "window; the red ring is the choice, the black one the paper's plan.\n\n";
  for (size_t si = 0; si < t.samples.size(); ++si)
    os << "### " << (t.samples.size() > t.error_bounds.size() ? t.samples[si].label() : "Layer " + std::to_string(t.samples[si].layer))
       << "\n\n" << frontier_svg(t, si, opt) << "\n";

  if (!others.empty()) {
    os << "## Other targets, same measurements\n\n| target | window | top_k | ms per token | why |\n|---|---|---|---|---|\n";
    for (const TuningRun& o : others) {
      const PlanCandidate* c = chosen(o);
      os << "| " << o.target << " | " << (c ? std::to_string(c->window) : "-") << " | "
         << (c ? std::to_string(c->top_k) : "-") << " | " << (c ? fmt("%.1f", c->token_ms) : "-") << " | " << explain(o)
         << " |\n";
    }
    os << "\n";
  }
  os << "## Why this choice\n\n" << explain(t) << "\n\n";
  if (!t.gpu_measured_us.empty()) {
    os << "## The GPU model against the GPU\n\nEach kernel variant measured (the model sees the split count and the "
          "warps, not the other knobs).\n\n"
       << gpu_model_check_table(*t.gpu, m, t.gpu_variants, t.gpu_measured_us, t.chosen_gpu_variant);
    os << "\n";
  }
  os << "## Method\n\n"
     << "- CPU time per layer: every query head's search (measured, one thread), attention over its top-k and its "
        "merge (Halide kernels, timed here), one insertion per index (amortised: one token leaves the window per step), and "
        "without a GPU the static set (dense attention per KV head); divided by the threads.\n"
     << "- GPU time per layer: the static set's kernel, the slowest of one block walking rows / splits rows, the "
        "grid's work over the SMs (rattn's kernel's rates on Hopper) and its bytes at "
     << kStaticSetBandwidthShare * 100
     << "% of the datasheet bandwidth, plus the split combine, one launch and three transfers (docs/autotune.md); "
        "measured instead where the target GPU is present, for each setting of the plan's kernel.cuda.* domains "
        "and the runtime's own choice, the fastest taken"
     << (t.gpu && size_t(t.chosen_gpu_variant) < t.gpu_variants.size()
             ? " (chosen: " + t.gpu_variants[size_t(t.chosen_gpu_variant)].text() + ")"
             : std::string())
     << ".\n"
     << "- A decode step of a layer costs the larger of the two (they run side by side); a token costs the sum over "
        "the layers.\n"
     << "- Database: " << t.db_reused << " records reused, " << t.db_measured << " measured, " << t.db_foreign
     << " of another machine ignored. Fingerprint: " << t.fingerprint.text() << ".\n"
     << "- Run time " << Progress::format_seconds(t.seconds) << ".\n";
  return os.str();
}

boost::json::array gpu_model_check_json(const GpuSpec& gpu, const ModelLayout& model,
                                        const std::vector<GpuKernelVariant>& variants,
                                        const std::map<int64_t, std::vector<double>>& measured) {
  boost::json::array out;
  for (const auto& [rows, times] : measured)
    for (size_t v = 0; v < times.size() && v < variants.size(); ++v) {
      const GpuStepPrediction p = predict_static_set(gpu, variants[v].work(model, rows));
      boost::json::object e{{"rows", rows}, {"kernel", variants[v].text()}, {"splits", p.splits},
                            {"predicted_us", p.total_us()}};
      if (std::isfinite(times[v])) e["measured_us"] = times[v], e["error"] = p.total_us() / times[v] - 1;
      out.push_back(std::move(e));
    }
  return out;
}

std::string gpu_model_check_table(const GpuSpec& gpu, const ModelLayout& model,
                                  const std::vector<GpuKernelVariant>& variants,
                                  const std::map<int64_t, std::vector<double>>& measured, int chosen) {
  std::ostringstream os;
  os << "| static-set rows | kernel | splits | measured us | predicted us | error |\n|---|---|---|---|---|---|\n";
  for (const auto& [rows, times] : measured)
    for (size_t v = 0; v < times.size() && v < variants.size(); ++v) {
      const GpuStepPrediction p = predict_static_set(gpu, variants[v].work(model, rows));
      const bool built = std::isfinite(times[v]);
      os << "| " << rows << " | " << variants[v].text() << (int(v) == chosen ? " (chosen)" : "") << " | " << p.splits
         << " | " << (built ? fmt("%.1f", times[v]) : std::string("not built")) << " | " << fmt("%.1f", p.total_us())
         << " | " << (built ? fmt("%+.0f%%", 100 * (p.total_us() / times[v] - 1)) : std::string("-")) << " |\n";
    }
  return os.str();
}

}  // namespace rattn
