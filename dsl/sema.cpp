// Semantic checks: every value against its allowed range and every relation
// between values (heads, windows, context, plan domains), then lowering.
#include "dsl/sema.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "dsl/kernel_knobs.h"

namespace rattn::internal {
namespace {

// Integer plan parameters (the rest, build_sample, repair_fraction,
// refresh_sample, key_metric_ridge and kernel knobs, are reals). The index knobs' ranges are
// those build_projected_graph accepts; 0/1 knobs are switches.
struct IntParam {
  const char* key;
  int64_t min;
  int64_t max;
};
constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
constexpr IntParam kIntParams[] = {
    {plan_keys::sinks, 0, kIntMax},         {plan_keys::window, 1, kIntMax},
    {plan_keys::top_k, 1, kIntMax},         {plan_keys::graph_degree, 2, 1024},
    {plan_keys::query_neighbors, 1, kIntMax}, {plan_keys::search_queue, 1, kIntMax},
    {plan_keys::build_queue, 1, 1 << 20},      {plan_keys::pivot_capacity, 1, kIntMax},
    {plan_keys::pivots_per_query, 1, 1024},    {plan_keys::two_hop_fill, 0, 1},
    {plan_keys::extra_slots, 0, 4096},         {plan_keys::entry_points, 1, 1024},
    {plan_keys::key_metric, 0, 2},             {plan_keys::key_metric_passes, 0, 7},
    {plan_keys::causal, 0, 1},                 {plan_keys::insert_queue, 1, 1 << 20},
    {plan_keys::insert_pivots, 1, 1 << 20},    {plan_keys::insert_reverse, 0, 1 << 20},
    {plan_keys::insert_key_queue, 0, 1 << 20}, {plan_keys::traversal_codes, 0, 1},
    {plan_keys::code_dims, 0, 1 << 20},       {plan_keys::code_coarse_dims, 0, 1 << 20},
    {plan_keys::search_patience, 0, 1 << 20}, {plan_keys::tail_samples, 0, 1 << 24},
    {plan_keys::search_seeds, 0, 1 << 16},
    {plan_keys::search_expand_first, 0, 1 << 16}, {plan_keys::search_full_expand, 0, 1 << 20},
    {plan_keys::shift_queries, 0, 1 << 24},   {plan_keys::shift_span, 8, 1 << 24},
    {plan_keys::shared_graph, 0, 1},
    {plan_keys::knn_cluster_keys, 0, 1 << 24}, {plan_keys::knn_probes, 0, 1 << 16},
    {plan_keys::repair_max_queries, 0, kIntMax},
};

class Checker {
 public:
  Checker(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  Program run(const ProgramSyntax& s) {
    Program p;
    p.path = file_;
    if (!s.model) error(Loc{1, 1}, "expected a 'model' block; the file has none");
    lower_model(*s.model, p.model);
    if (s.plan) lower_plan(*s.plan, p.model, p.plan);
    if (s.target) lower_target(*s.target, p.target);
    return p;
  }

 private:
  [[noreturn]] void error(Loc loc, const std::string& msg) const { fail_at(file_, text_, loc, msg); }

  int64_t whole(const Number& n, const std::string& what, int64_t lo, int64_t hi) const {
    if (!n.is_integer && n.value != std::floor(n.value))
      error(n.loc, what + " must be a whole number, got " + n.spelling);
    if (n.value < double(lo) || n.value > double(hi))
      error(n.loc, what + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) +
                       ", got " + n.spelling);
    return n.is_integer ? n.int_value : int64_t(n.value);
  }

  const Number& required(const std::optional<Number>& n, const ModelSyntax& m, const char* key) const {
    if (!n)
      error(m.loc, std::string("the model block is missing '") + key +
                       "' (required: layers, q_heads, kv_heads, head_dim, context)");
    return *n;
  }

  // ---- model ----
  void lower_model(const ModelSyntax& m, ModelLayout& out) {
    if (m.name.value.empty()) error(m.name.loc, "the model's name must not be empty");
    out.name = m.name.value;
    if (m.source) out.source = m.source->value;

    const Number& layers = required(m.layers, m, "layers");
    const Number& q_heads = required(m.q_heads, m, "q_heads");
    const Number& kv_heads = required(m.kv_heads, m, "kv_heads");
    const Number& head_dim = required(m.head_dim, m, "head_dim");
    const Number& context = required(m.context, m, "context");

    out.num_layers = int(whole(layers, "'layers'", 1, kMaxLayers));
    out.num_q_heads = int(whole(q_heads, "'q_heads'", 1, kMaxHeads));
    out.num_kv_heads = int(whole(kv_heads, "'kv_heads'", 1, kMaxHeads));
    if (out.num_q_heads % out.num_kv_heads != 0)
      error(kv_heads.loc, "q_heads (" + std::to_string(out.num_q_heads) + ") must be a multiple of kv_heads (" +
                              std::to_string(out.num_kv_heads) + ")");
    const int64_t d = whole(head_dim, "'head_dim'", 1, 1 << 20);
    if (std::find(std::begin(kSupportedHeadDims), std::end(kSupportedHeadDims), d) == std::end(kSupportedHeadDims))
      error(head_dim.loc, "unsupported head_dim " + std::to_string(d) + " (expected 64, 96, 128 or 256)");
    out.head_dim = int(d);
    out.max_context = whole(context, "'context'", 1, kMaxContext);

    if (m.kv_dtype && !parse_dtype(m.kv_dtype->value, &out.kv_dtype))
      error(m.kv_dtype->loc, "unknown kv_dtype '" + excerpt(m.kv_dtype->value) + "' (expected f16, bf16 or f32)");
    if (m.rope_style) {
      if (m.rope_style->value == "neox") out.rope_style = RopeStyle::neox;
      else if (m.rope_style->value == "gptj") out.rope_style = RopeStyle::gptj;
      else
        error(m.rope_style->loc, "unknown rope_style '" + excerpt(m.rope_style->value) +
                                     "' (expected neox: pairs (i, i + d/2), or gptj: pairs (2i, 2i + 1))");
    }

    // RoPE: one base, or a base per layer kind.
    if (m.rope_base) {
      out.rope_base_global = positive(*m.rope_base, "'rope_base'");
    } else if (m.rope_global || m.rope_local) {
      if (!m.rope_global) error(m.rope_local->loc, "the rope_base block sets 'local' but not 'global'");
      out.rope_base_global = positive(*m.rope_global, "'rope_base.global'");
      if (m.rope_local) out.rope_base_local = positive(*m.rope_local, "'rope_base.local'");
    }

    // Layers: all global unless a pattern says otherwise.
    if (!m.pattern) {
      out.layers.assign(size_t(out.num_layers), LayerSpec{true, 0, out.rope_base_global});
    } else {
      expand_pattern(*m.pattern, out);
    }
    const bool any_local = std::any_of(out.layers.begin(), out.layers.end(), [](const LayerSpec& l) { return !l.global; });
    if (m.rope_local && !any_local)
      error(m.rope_local->loc, "'rope_base.local' is set but the pattern has no local layers");
  }

  double positive(const Number& n, const std::string& what) const {
    if (!(n.value > 0)) error(n.loc, what + " must be positive, got " + n.spelling);
    return n.value;
  }

  // Layers an item expands to, saturating at kMaxLayers + 1 (enough to say "too many").
  static int64_t item_length(const PatternItem& it) {
    int64_t one = 1;
    if (it.kind == PatternItem::Kind::group) {
      one = 0;
      for (const auto& c : it.items) one = std::min<int64_t>(one + item_length(c), kMaxLayers + 1);
    }
    if (one > 0 && it.count > (kMaxLayers + 1) / one) return kMaxLayers + 1;
    return std::min<int64_t>(one * it.count, kMaxLayers + 1);
  }

  void check_items(const std::vector<PatternItem>& items, const ModelLayout& m) const {
    for (const auto& it : items) {
      if (it.kind == PatternItem::Kind::local) {
        const int64_t w = whole(it.window, "the window of 'local'", 1, kMaxContext);
        if (w >= m.max_context)
          error(it.window.loc, "sliding window " + std::to_string(w) + " must be less than the context (" +
                                   std::to_string(m.max_context) + ")");
      } else if (it.kind == PatternItem::Kind::group) {
        check_items(it.items, m);
      }
    }
  }

  void emit(const std::vector<PatternItem>& items, const ModelLayout& m, std::vector<LayerSpec>& out) const {
    for (const auto& it : items) {
      for (int64_t r = 0; r < it.count; ++r) {
        switch (it.kind) {
          case PatternItem::Kind::global: out.push_back(LayerSpec{true, 0, m.rope_base_global}); break;
          case PatternItem::Kind::local:
            out.push_back(LayerSpec{false, int64_t(it.window.value), m.rope_base_local.value_or(m.rope_base_global)});
            break;
          case PatternItem::Kind::group: emit(it.items, m, out); break;
        }
      }
    }
  }

  void expand_pattern(const PatternSyntax& p, ModelLayout& m) const {
    check_items(p.items, m);
    int64_t len = 0;
    for (const auto& it : p.items) len = std::min<int64_t>(len + item_length(it), kMaxLayers + 1);
    std::vector<PatternItem> items = p.items;
    if (p.repeat) {
      if (m.num_layers % len != 0)
        error(p.loc, "the repeated pattern has " + std::to_string(len) + " layers, which does not divide 'layers' (" +
                         std::to_string(m.num_layers) + "); write the tail explicitly, e.g. [...] x N, local(W) x M");
      PatternItem group;
      group.kind = PatternItem::Kind::group;
      group.items = p.items;
      group.count = m.num_layers / len;
      items = {group};
    } else if (len != m.num_layers) {
      error(p.loc, "the layer pattern expands to " + (len > kMaxLayers ? "more than " + std::to_string(kMaxLayers) : std::to_string(len)) +
                       " layers but 'layers' is " + std::to_string(m.num_layers));
    }
    m.layers.clear();
    emit(items, m, m.layers);
  }

  // ---- plan ----
  static const IntParam* int_param(const std::string& key) {
    for (const auto& p : kIntParams)
      if (key == p.key) return &p;
    return nullptr;
  }

  void check_value(const Number& n, const std::string& key) const {
    const std::string what = "'" + key + "'";
    if (const IntParam* ip = int_param(key)) {
      whole(n, what, ip->min, ip->max);
    } else if (key == plan_keys::build_sample) {
      if (!(n.value > 0 && n.value <= 1)) error(n.loc, "'build_sample' must be in (0, 1], got " + n.spelling);
    } else if (key == plan_keys::repair_fraction || key == plan_keys::refresh_sample) {
      if (!(n.value >= 0 && n.value <= 1)) error(n.loc, what + " must be in [0, 1], got " + n.spelling);
    } else if (key == plan_keys::key_metric_ridge) {
      if (!(n.value > 0 && n.value <= 1e15))
        error(n.loc, "'key_metric_ridge' must be positive (and at most 1e15), got " + n.spelling);
    } else if (const KernelKnob* k = kernel_knob(key)) {
      if (!kernel_knob_allows(*k, n.value))
        error(n.loc, what + " must be " + kernel_knob_legal(*k) + ", got " + n.spelling);
    } else if (std::fabs(n.value) > 1e15) {
      error(n.loc, what + " must be at most 1e15 in magnitude, got " + n.spelling);
    }
  }

  // The knob of a `kernel.` key; the parser has refused unknown ones.
  static const KernelKnob* kernel_knob(const std::string& key) {
    return key.rfind("kernel.", 0) == 0 ? find_kernel_knob(std::string_view(key).substr(7)) : nullptr;
  }

  ParamDomain lower_domain(const DomainSyntax& s, const std::string& key) const {
    ParamDomain d;
    d.loc = SourceLoc{file_, s.loc.line, s.loc.col};
    const bool is_int = int_param(key) != nullptr;
    switch (s.kind) {
      case DomainSyntax::Kind::fixed:
        check_value(s.values[0], key);
        d.kind = ParamDomain::Kind::fixed;
        d.values = {s.values[0].value};
        if (s.preferred) error(s.preferred->loc, "'default' applies only to a range or a set, and '" + key + "' is fixed");
        return d;
      case DomainSyntax::Kind::set: {
        d.kind = ParamDomain::Kind::set;
        for (const Number& v : s.values) {
          check_value(v, key);
          d.values.push_back(v.value);
        }
        // Sorted with their positions, a repeated value's copies sit side by
        // side; the message points at the earliest second occurrence.
        std::vector<std::pair<double, size_t>> order(s.values.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = {s.values[i].value, i};
        std::sort(order.begin(), order.end());
        size_t repeat = order.size();
        for (size_t i = 1; i < order.size(); ++i)
          if (order[i].first == order[i - 1].first) repeat = std::min(repeat, order[i].second);
        if (repeat < order.size())
          error(s.values[repeat].loc, "the value " + s.values[repeat].spelling + " appears twice in the set of '" + key + "'");
        std::sort(d.values.begin(), d.values.end());
        break;
      }
      case DomainSyntax::Kind::range: {
        d.kind = ParamDomain::Kind::range;
        check_value(s.lo, key);
        check_value(s.hi, key);
        if (s.lo.value > s.hi.value)
          error(s.loc, "empty range " + s.lo.spelling + ".." + s.hi.spelling + " for '" + key +
                           "' (the lower end must not exceed the upper end)");
        d.lo = s.lo.value;
        d.hi = s.hi.value;
        d.geometric = s.geometric;
        if (!s.step) {
          if (!is_int && key.rfind("kernel.", 0) != 0)
            error(s.loc, "the range of '" + key + "' needs a step, e.g. " + s.lo.spelling + ".." + s.hi.spelling + " step 0.25");
          d.step = 1;
        } else {
          const Number& st = *s.step;
          if (s.geometric) {
            if (!(st.value > 1)) error(st.loc, "a geometric step of '" + key + "' must be greater than 1, got " + st.spelling);
            if (!(d.lo > 0)) error(s.lo.loc, "a geometric range of '" + key + "' must start above 0, got " + s.lo.spelling);
          } else if (!(st.value > 0)) {
            error(st.loc, "the step of '" + key + "' must be positive, got " + st.spelling);
          }
          if (is_int && st.value != std::floor(st.value))
            error(st.loc, "the step of '" + key + "' must be a whole number, got " + st.spelling);
          d.step = st.value;
        }
        const double n = d.geometric ? std::floor(std::log(d.hi / d.lo) / std::log(d.step) + 1e-9) + 1
                                     : std::floor((d.hi - d.lo) / d.step + 1e-9) + 1;
        if (!(n <= double(kMaxCandidates)))
          error(s.loc, "the range of '" + key + "' has " + (n < 1e15 ? format_number(n) : std::string("too many")) +
                           " candidates; at most " + std::to_string(kMaxCandidates) +
                           " are allowed (use a larger step)");
        // Both ends are legal; so must be every candidate between them.
        if (const KernelKnob* k = kernel_knob(key))
          for (double c : d.candidates())
            if (!kernel_knob_allows(*k, c))
              error(s.loc, "the range of '" + key + "' includes " + format_number(c) + ", which is not a legal value (" +
                               kernel_knob_legal(*k) + ")" + (k->pow2 ? "; e.g. write " + s.lo.spelling + ".." +
                               s.hi.spelling + " step *2" : ""));
        break;
      }
    }
    if (s.preferred) {
      check_value(*s.preferred, key);
      const double v = s.preferred->value;
      const auto cands = d.candidates();
      const bool found = std::any_of(cands.begin(), cands.end(), [&](double c) {
        return std::fabs(c - v) <= 1e-9 * std::max(1.0, std::fabs(v));
      });
      if (!found)
        error(s.preferred->loc, "default " + s.preferred->spelling + " is not one of the candidates of '" + key + "'");
      d.preferred = v;
    }
    return d;
  }

  static double dmax(const ParamDomain& d) {
    const auto c = d.candidates();
    return c.empty() ? 0 : *std::max_element(c.begin(), c.end());
  }
  static double dmin(const ParamDomain& d) {
    const auto c = d.candidates();
    return c.empty() ? 0 : *std::min_element(c.begin(), c.end());
  }

  void lower_plan(const PlanSyntax& s, const ModelLayout& m, RetrievalPlan& plan) const {
    std::map<std::string, Loc> locs;
    for (const auto& [key, ds] : s.params) {
      ParamDomain d = lower_domain(ds, key);
      locs[key] = ds.loc;
      if (key.rfind("kernel.", 0) == 0) plan.kernel[key.substr(7)] = d;
      else if (key == plan_keys::sinks) plan.sinks = d;
      else if (key == plan_keys::window) plan.window = d;
      else if (key == plan_keys::top_k) plan.top_k = d;
      else if (key == plan_keys::graph_degree) plan.graph_degree = d;
      else if (key == plan_keys::query_neighbors) plan.query_neighbors = d;
      else if (key == plan_keys::build_sample) plan.build_sample = d;
      else if (key == plan_keys::search_queue) plan.search_queue = d;
      else if (key == plan_keys::build_queue) plan.build_queue = d;
      else if (key == plan_keys::pivot_capacity) plan.pivot_capacity = d;
      else if (key == plan_keys::pivots_per_query) plan.pivots_per_query = d;
      else if (key == plan_keys::two_hop_fill) plan.two_hop_fill = d;
      else if (key == plan_keys::extra_slots) plan.extra_slots = d;
      else if (key == plan_keys::entry_points) plan.entry_points = d;
      else if (key == plan_keys::repair_fraction) plan.repair_fraction = d;
      else if (key == plan_keys::key_metric) plan.key_metric = d;
      else if (key == plan_keys::key_metric_ridge) plan.key_metric_ridge = d;
      else if (key == plan_keys::key_metric_passes) plan.key_metric_passes = d;
      else if (key == plan_keys::causal) plan.causal = d;
      else if (key == plan_keys::insert_queue) plan.insert_queue = d;
      else if (key == plan_keys::insert_pivots) plan.insert_pivots = d;
      else if (key == plan_keys::insert_reverse) plan.insert_reverse = d;
      else if (key == plan_keys::insert_key_queue) plan.insert_key_queue = d;
      else if (key == plan_keys::traversal_codes) plan.traversal_codes = d;
      else if (key == plan_keys::code_dims) plan.code_dims = d;
      else if (key == plan_keys::code_coarse_dims) plan.code_coarse_dims = d;
      else if (key == plan_keys::search_patience) plan.search_patience = d;
      else if (key == plan_keys::search_seeds) plan.search_seeds = d;
      else if (key == plan_keys::search_expand_first) plan.search_expand_first = d;
      else if (key == plan_keys::search_full_expand) plan.search_full_expand = d;
      else if (key == plan_keys::tail_samples) plan.tail_samples = d;
      else if (key == plan_keys::shift_queries) plan.shift_queries = d;
      else if (key == plan_keys::shift_span) plan.shift_span = d;
      else if (key == plan_keys::refresh_sample) plan.refresh_sample = d;
      else if (key == plan_keys::shared_graph) plan.shared_graph = d;
      else if (key == plan_keys::knn_cluster_keys) plan.knn_cluster_keys = d;
      else if (key == plan_keys::knn_probes) plan.knn_probes = d;
      else if (key == plan_keys::repair_max_queries) plan.repair_max_queries = d;
      else error(ds.key_loc, "internal: plan key '" + key + "' has no IR field");
    }
    // Relations. A parameter the file does not set keeps the IR default; its
    // "location" is then the plan keyword.
    auto loc_of = [&](const char* k) { auto it = locs.find(k); return it == locs.end() ? s.loc : it->second; };
    const std::string ctx = std::to_string(m.max_context);
    if (dmax(plan.window) >= double(m.max_context))
      error(loc_of(plan_keys::window), "'window' (" + format_number(dmax(plan.window)) +
                                           (plan.window.is_fixed() ? "" : " at most") +
                                           ") must be less than the model's context (" + ctx + ")");
    if (dmax(plan.sinks) + dmax(plan.window) >= double(m.max_context))
      error(loc_of(plan_keys::sinks), "sinks + window (" + format_number(dmax(plan.sinks)) + " + " + format_number(dmax(plan.window)) +
                                          ") must be less than the model's context (" + ctx + ")");
    if (dmax(plan.code_dims) > double(m.head_dim))
      error(loc_of(plan_keys::code_dims), "'code_dims' (" + format_number(dmax(plan.code_dims)) +
                                              (plan.code_dims.is_fixed() ? "" : " at most") +
                                              ") must not exceed the model's head_dim (" + std::to_string(m.head_dim) + ")");
    if (dmin(plan.code_coarse_dims) > dmax(plan.code_dims))
      error(loc_of(plan_keys::code_coarse_dims), "no choice of code_coarse_dims (at least " +
                                                     format_number(dmin(plan.code_coarse_dims)) + ") and code_dims (at most " +
                                                     format_number(dmax(plan.code_dims)) + ") satisfies code_coarse_dims <= code_dims");
    if (plan.code_coarse_dims.default_value() > plan.code_dims.default_value())
      error(loc_of(plan_keys::code_coarse_dims), "the default code_coarse_dims (" +
                                                     format_number(plan.code_coarse_dims.default_value()) +
                                                     ") exceeds the default code_dims (" +
                                                     format_number(plan.code_dims.default_value()) + ")");
    lower_layer_blocks(s, m, plan);
    if (dmax(plan.top_k) >= double(m.max_context))
      error(loc_of(plan_keys::top_k), "'top_k' (" + format_number(dmax(plan.top_k)) + ") must be less than the model's context (" + ctx + ")");
    check_queue_holds_top_k(plan.top_k, plan.search_queue, loc_of(plan_keys::top_k), "search_queue",
                            "the default search_queue");
  }

  // A search returns at most its queue's candidates: every choice, and the
  // defaults (the untuned plan must itself be valid), need top_k <= queue.
  // `queue_name` / `default_name` say which queue (the plan's, a layer's).
  void check_queue_holds_top_k(const ParamDomain& top_k, const ParamDomain& queue, const Loc& at,
                               const std::string& queue_name, const std::string& default_name) const {
    if (top_k.is_fixed() && queue.is_fixed()) {
      if (top_k.values[0] > queue.values[0])
        error(at, "top_k (" + format_number(top_k.values[0]) + ") must not exceed " + queue_name + " (" +
                      format_number(queue.values[0]) + "): a search returns at most search_queue candidates");
      return;
    }
    if (dmin(top_k) > dmax(queue))
      error(at, "no choice of top_k (at least " + format_number(dmin(top_k)) + ") and " + queue_name + " (at most " +
                    format_number(dmax(queue)) + ") satisfies top_k <= search_queue");
    if (top_k.default_value() > queue.default_value())
      error(at, "the default top_k (" + format_number(top_k.default_value()) + ") exceeds " + default_name + " (" +
                    format_number(queue.default_value()) + "); pick other defaults with 'default v'");
  }

  // `layer N, ... { ... }` blocks: global layers of the model, each in one block.
  void lower_layer_blocks(const PlanSyntax& s, const ModelLayout& m, RetrievalPlan& plan) const {
    std::map<int, Loc> first_block;
    for (const LayerBlockSyntax& b : s.layer_blocks) {
      std::map<std::string, ParamDomain> params;
      for (const auto& [key, ds] : b.params) params[key] = lower_domain(ds, key);
      for (const Number& n : b.layers) {
        const int layer = int(whole(n, "a layer number", 0, int64_t(m.num_layers) - 1));
        if (!m.layers[size_t(layer)].global) {
          std::string globals;
          for (size_t i = 0; i < m.layers.size(); ++i)
            if (m.layers[i].global) globals += (globals.empty() ? "" : ", ") + std::to_string(i);
          error(n.loc, "layer " + n.spelling + " is a local(" + std::to_string(m.layers[size_t(layer)].sliding_window) +
                           ") layer: it has no retrieval, so no per-layer retrieval keys (global layers: " +
                           (globals.empty() ? "none" : globals) + ")");
        }
        if (auto it = first_block.find(layer); it != first_block.end())
          error(n.loc, "layer " + n.spelling + " already has its block at " + std::to_string(it->second.line) + ":" +
                           std::to_string(it->second.col));
        first_block[layer] = n.loc;
        LayerSearchDomains& own = plan.layer_search[layer];
        own.loc = SourceLoc{file_, b.loc.line, b.loc.col};
        own.params = params;
      }
      // A layer's own top_k must fit the context, and its queue (own or
      // plan-wide) must hold its top_k (own or plan-wide).
      const auto own_top_k = b.params.find(plan_keys::top_k);
      const auto own_queue = b.params.find(plan_keys::search_queue);
      if (own_top_k != b.params.end() && dmax(params[plan_keys::top_k]) >= double(m.max_context))
        error(own_top_k->second.loc, "'top_k' (" + format_number(dmax(params[plan_keys::top_k])) +
                                         ") must be less than the model's context (" + std::to_string(m.max_context) + ")");
      if (own_queue != b.params.end())
        check_queue_holds_top_k(own_top_k != b.params.end() ? params[plan_keys::top_k] : plan.top_k,
                                params[plan_keys::search_queue], own_queue->second.loc, "this search_queue",
                                "this layer's default search_queue");
      else if (own_top_k != b.params.end())
        check_queue_holds_top_k(params[plan_keys::top_k], plan.search_queue, own_top_k->second.loc, "search_queue",
                                "the default search_queue");
    }
  }

  // ---- target ----
  void lower_target(const TargetSyntax& s, Target& t) const {
    if (s.gpu) {
      const std::string& g = s.gpu->value;
      if (g != "none") {
        const bool shaped = g.size() > 3 && g.size() <= 7 && g.rfind("sm_", 0) == 0 &&
                            std::all_of(g.begin() + 3, g.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!shaped) error(s.gpu->loc, "expected 'none' or an arch like sm_90 for 'gpu', got '" + excerpt(g) + "'");
        const int arch = std::stoi(g.substr(3));
        if (arch < kMinGpuArch)
          error(s.gpu->loc, "gpu arch " + g + " is too old (rattn needs sm_" + std::to_string(kMinGpuArch) + " or newer)");
      }
      t.gpu_arch = g;
    }
    if (s.cpu) {
      if (s.cpu->value.empty()) error(s.cpu->loc, "'cpu' must not be empty (use host for this machine)");
      t.cpu = s.cpu->value;
    }
  }

  std::string_view text_;
  const std::string& file_;
};

}  // namespace

Program check_and_lower(const ProgramSyntax& syntax, std::string_view text, const std::string& filename) {
  return Checker(text, filename).run(syntax);
}

}  // namespace rattn::internal
