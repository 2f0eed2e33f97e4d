#include "dsl/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include "core/error.h"
#include "dsl/dsl.h"

namespace rattn {
namespace {

uint64_t mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(Status::invalid_argument, "memory estimate overflows 64 bits");
  return r;
}
uint64_t add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(Status::invalid_argument, "memory estimate overflows 64 bits");
  return r;
}


// "0-4,6-10,12-16"; after 4 runs "0,2,4,6,..." (the row also shows the count).
std::string layer_ranges(const std::vector<int>& ls) {
  std::string out;
  int runs = 0;
  for (size_t i = 0; i < ls.size();) {
    size_t j = i;
    while (j + 1 < ls.size() && ls[j + 1] == ls[j] + 1) ++j;
    if (!out.empty()) out += ",";
    if (++runs > 4) return out + "...";
    out += std::to_string(ls[i]);
    if (j > i) out += "-" + std::to_string(ls[j]);
    i = j + 1;
  }
  return out;
}

// The concrete value of every plan parameter, in plan_params order.
std::vector<std::pair<const char*, double>> concrete_values(const ConcretePlan& c) {
  return {{plan_keys::sinks, double(c.sinks)},
          {plan_keys::window, double(c.window)},
          {plan_keys::top_k, double(c.top_k)},
          {plan_keys::graph_degree, c.graph_degree},
          {plan_keys::query_neighbors, c.query_neighbors},
          {plan_keys::build_sample, c.build_sample},
          {plan_keys::search_queue, c.search_queue},
          {plan_keys::tail_samples, double(c.tail_samples)},
          {plan_keys::build_queue, c.build_queue},
          {plan_keys::pivot_capacity, c.pivot_capacity},
          {plan_keys::pivots_per_query, c.pivots_per_query},
          {plan_keys::two_hop_fill, c.two_hop_fill ? 1 : 0},
          {plan_keys::extra_slots, c.extra_slots},
          {plan_keys::entry_points, c.entry_points},
          {plan_keys::repair_fraction, c.repair_fraction},
          {plan_keys::key_metric, c.key_metric},
          {plan_keys::key_metric_ridge, c.key_metric_ridge},
          {plan_keys::key_metric_passes, c.key_metric_passes},
          {plan_keys::causal, c.causal ? 1 : 0},
          {plan_keys::insert_queue, c.insert_queue},
          {plan_keys::insert_pivots, c.insert_pivots},
          {plan_keys::insert_reverse, c.insert_reverse},
          {plan_keys::insert_key_queue, c.insert_key_queue},
          {plan_keys::traversal_codes, c.traversal_codes ? 1 : 0},
          {plan_keys::code_dims, c.code_dims},
          {plan_keys::code_coarse_dims, c.code_coarse_dims},
          {plan_keys::search_patience, c.search_patience},
          {plan_keys::search_seeds, c.search_seeds},
          {plan_keys::search_expand_first, c.search_expand_first},
          {plan_keys::search_full_expand, c.search_full_expand},
          {plan_keys::shift_queries, c.shift_queries},
          {plan_keys::shift_span, c.shift_span},
          {plan_keys::refresh_sample, c.refresh_sample},
          {plan_keys::shared_graph, c.shared_graph ? 1 : 0},
          {plan_keys::knn_cluster_keys, c.knn_cluster_keys},
          {plan_keys::knn_probes, c.knn_probes},
          {plan_keys::repair_max_queries, c.repair_max_queries}};
}

// Whole numbers print as integers ("283461213", not "2.83461213E8").
boost::json::value json_number(double v) {
  if (std::fabs(v) < 9007199254740992.0 && v == std::floor(v)) return boost::json::value(int64_t(v));
  return boost::json::value(v);
}

}  // namespace

uint64_t index_bytes_per_node(const ConcretePlan& plan) {
  const uint64_t slots = uint64_t(std::max(plan.graph_degree, 0)) + uint64_t(std::max(plan.extra_slots, 0));
  return 4 * (slots + 1) + 8;
}

bool uses_projected_codes(const ConcretePlan& plan, int head_dim) {
  return plan.traversal_codes && plan.code_dims > 0 && (plan.code_dims < head_dim || plan.code_coarse_dims > 0);
}

uint64_t code_bytes_per_key(const ConcretePlan& plan, int head_dim, int group) {
  if (!plan.traversal_codes) return 0;
  const auto whole_lines = [](uint64_t b) { return (b + 63) / 64 * 64; };
  if (!uses_projected_codes(plan, head_dim)) return whole_lines(uint64_t(std::max(head_dim, 0)));
  const int coarse = std::clamp(plan.code_coarse_dims, 0, plan.code_dims), fine = plan.code_dims - coarse;
  const uint64_t row = coarse == 0 ? uint64_t(fine) : uint64_t((fine + 15) / 16 * 16 + 16 * ((coarse + 31) / 32));
  return uint64_t(std::max(group, 1)) * whole_lines(row);
}

MemoryPlan plan_memory(const Program& program, int64_t context) {
  const ModelLayout& m = program.model;
  if (context < 1)
    fail(Status::invalid_argument, "the context must be at least 1 token, got " + std::to_string(context));
  if (context > m.max_context)
    fail(Status::invalid_argument, "context " + std::to_string(context) + " exceeds the model's context (" +
                                       std::to_string(m.max_context) + ")");
  MemoryPlan mem;
  mem.context = context;
  mem.gpu = program.target.has_gpu();
  mem.plan = default_concrete_plan(program.plan);
  mem.kv_bytes_per_token_layer = 2 * uint64_t(m.num_kv_heads) * uint64_t(m.head_dim) * dtype_size(m.kv_dtype);
  mem.index_bytes_per_node = index_bytes_per_node(mem.plan);
  mem.code_bytes_per_key = code_bytes_per_key(mem.plan, m.head_dim, m.num_q_heads / std::max(m.num_kv_heads, 1));
  const uint64_t n = uint64_t(context);
  for (int l = 0; l < int(m.layers.size()); ++l) {
    const LayerSpec& spec = m.layers[size_t(l)];
    LayerMemory lm;
    lm.layer = l;
    lm.global = spec.global;
    lm.sliding_window = spec.sliding_window;
    if (spec.global) {
      lm.static_tokens = std::min<int64_t>(context, mem.plan.sinks + mem.plan.window);
      lm.offloaded_tokens = context - lm.static_tokens;
      lm.kv_bytes_full = mul(n, mem.kv_bytes_per_token_layer);
      // The graphs are per query head, or per KV head with shared_graph;
      // code_bytes_per_key is per KV head (the runtime shares one set of
      // raw-key codes among a group's indexes; projected codes are per
      // query head, counted in it).
      lm.num_indexes = mem.plan.shared_graph ? m.num_kv_heads : m.num_q_heads;
      lm.index_bytes = mul(mul(uint64_t(lm.num_indexes), uint64_t(lm.offloaded_tokens)), mem.index_bytes_per_node) +
                       mul(mul(uint64_t(m.num_kv_heads), uint64_t(lm.offloaded_tokens)), mem.code_bytes_per_key);
    } else {
      lm.static_tokens = std::min<int64_t>(context, spec.sliding_window);
      lm.kv_bytes_full = mul(uint64_t(lm.static_tokens), mem.kv_bytes_per_token_layer);
    }
    lm.kv_bytes_static = mul(uint64_t(lm.static_tokens), mem.kv_bytes_per_token_layer);
    lm.kv_bytes_offloaded = mul(uint64_t(lm.offloaded_tokens), mem.kv_bytes_per_token_layer);
    mem.kv_bytes_full = add(mem.kv_bytes_full, lm.kv_bytes_full);
    mem.kv_bytes_static = add(mem.kv_bytes_static, lm.kv_bytes_static);
    mem.kv_bytes_offloaded = add(mem.kv_bytes_offloaded, lm.kv_bytes_offloaded);
    mem.index_bytes = add(mem.index_bytes, lm.index_bytes);
    mem.num_indexes += lm.num_indexes;
    mem.layers.push_back(lm);
  }
  mem.kv_bytes_gpu = mem.gpu ? mem.kv_bytes_static : 0;
  mem.kv_bytes_cpu = mem.gpu ? mem.kv_bytes_offloaded : add(mem.kv_bytes_offloaded, mem.kv_bytes_static);
  return mem;
}

std::string format_report(const Program& program, const MemoryPlan& mem) {
  const ModelLayout& m = program.model;
  std::string out;
  char line[512];
  auto add_line = [&](std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    out += s + "\n";
  };

  add_line(m.name + "  (" + program.path + ")");
  if (!m.source.empty()) add_line("  source   " + m.source);
  const int globals = m.num_global_layers();
  std::snprintf(line, sizeof line,
                "  layout   %d layer%s (%d global, %d sliding-window), %d query head%s / %d KV head%s (group %d), "
                "head dim %d, KV %s",
                m.num_layers, m.num_layers == 1 ? "" : "s", globals, m.num_layers - globals, m.num_q_heads,
                m.num_q_heads == 1 ? "" : "s", m.num_kv_heads, m.num_kv_heads == 1 ? "" : "s", m.group_size(),
                m.head_dim, dtype_name(m.kv_dtype));
  add_line(line);
  std::string rope = "  rope     base " + format_number(m.rope_base_global);
  if (m.rope_base_local) rope = "  rope     global " + format_number(m.rope_base_global) + ", local " + format_number(*m.rope_base_local);
  add_line(rope + ", " + rope_style_name(m.rope_style) + " pairs");
  add_line("  context  " + std::to_string(m.max_context) + " tokens max");

  std::string fixed, tunable;
  const auto& c = mem.plan;
  // The retrieval knobs on the plan line, the index build/insert knobs on
  // their own line (they are many).
  std::string index_line;
  bool index_knob = false;  // from build_queue on
  for (const auto& [k, v] : concrete_values(c)) {
    index_knob = index_knob || std::string(k) == plan_keys::build_queue;
    std::string& dst = index_knob ? index_line : fixed;
    dst += (dst.empty() ? "" : ", ") + std::string(k) + " " + format_number(v);
  }
  // An untuned split range: the runtime sizes the splits to each static set.
  if (program.plan.kernel.count("cuda.splits") && !c.kernel.count("cuda.splits"))
    fixed += ", kernel.cuda.splits per set";
  for (const auto& [k, v] : c.kernel) fixed += ", kernel." + k + " " + format_number(v);
  for (const auto& p : plan_params(program.plan))
    if (!p.domain->is_fixed()) tunable += std::string(tunable.empty() ? "" : "; ") + p.key + " " + format_domain(*p.domain);
  for (const auto& [k, d] : program.plan.kernel)
    if (!d.is_fixed()) tunable += std::string(tunable.empty() ? "" : "; ") + "kernel." + k + " " + format_domain(d);
  add_line("  plan     " + fixed + (tunable.empty() ? "" : "  (defaults)"));
  for (const auto& [layer, own] : c.layer_search) {
    std::string values, domains;
    for (const auto& [k, v] : own) values += (values.empty() ? "" : ", ") + k + " " + format_number(v);
    if (auto it = program.plan.layer_search.find(layer); it != program.plan.layer_search.end())
      for (const auto& [k, d] : it->second.params)
        if (!d.is_fixed()) domains += (domains.empty() ? "" : "; ") + k + " " + format_domain(d);
    add_line("  layer " + std::to_string(layer) + (layer < 10 ? "  " : " ") + values +
             (domains.empty() ? "" : "  (defaults; tunable " + domains + ")"));
  }
  add_line("  index    " + index_line);
  if (!tunable.empty()) add_line("  tunable  " + tunable);
  add_line("  target   gpu " + program.target.gpu_arch + ", cpu " + program.target.cpu);
  add_line("");

  std::snprintf(line, sizeof line,
                "memory at context %lld (one token of one layer: K+V = 2 x %d KV head%s x %d x %zu B = %s)",
                static_cast<long long>(mem.context), m.num_kv_heads, m.num_kv_heads == 1 ? "" : "s", m.head_dim,
                dtype_size(m.kv_dtype),
                format_bytes(mem.kv_bytes_per_token_layer).c_str());
  add_line(line);
  const char* static_where = mem.gpu ? "GPU" : "CPU";
  std::snprintf(line, sizeof line, "  %-22s %-12s %10s %10s %12s %12s %12s %12s %7s", "layers", "kind", "static",
                "offloaded", "static KV", "offload KV", "index", "full KV", "indexes");
  add_line(line);
  std::snprintf(line, sizeof line, "  %-22s %-12s %10s %10s %12s %12s %12s %12s", "(bytes per layer)", "",
                "tokens", "tokens", (std::string("(") + static_where + ")").c_str(), "(CPU)", "(CPU)", "");
  add_line(line);

  // Group layers whose numbers are identical.
  std::vector<std::pair<std::vector<int>, const LayerMemory*>> groups;
  for (const auto& lm : mem.layers) {
    auto same = [&](const LayerMemory* g) {
      return g->global == lm.global && g->sliding_window == lm.sliding_window &&
             g->static_tokens == lm.static_tokens && g->offloaded_tokens == lm.offloaded_tokens &&
             m.layers[size_t(g->layer)].rope_base == m.layers[size_t(lm.layer)].rope_base;
    };
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return same(g.second); });
    if (it == groups.end()) groups.push_back({{lm.layer}, &lm});
    else it->first.push_back(lm.layer);
  }
  for (const auto& [ls, g] : groups) {
    const std::string name = layer_ranges(ls) + " (x" + std::to_string(ls.size()) + ")";
    const std::string kind = g->global ? "global" : "local(" + std::to_string(g->sliding_window) + ")";
    std::snprintf(line, sizeof line, "  %-22s %-12s %10lld %10lld %12s %12s %12s %12s %7d", name.c_str(),
                  kind.c_str(), static_cast<long long>(g->static_tokens), static_cast<long long>(g->offloaded_tokens),
                  format_bytes(g->kv_bytes_static).c_str(), format_bytes(g->kv_bytes_offloaded).c_str(),
                  format_bytes(g->index_bytes).c_str(), format_bytes(g->kv_bytes_full).c_str(), g->num_indexes);
    add_line(line);
  }
  std::snprintf(line, sizeof line, "  %-22s %-12s %10s %10s %12s %12s %12s %12s %7lld", "total", "", "", "",
                format_bytes(mem.kv_bytes_static).c_str(), format_bytes(mem.kv_bytes_offloaded).c_str(),
                format_bytes(mem.index_bytes).c_str(), format_bytes(mem.kv_bytes_full).c_str(),
                static_cast<long long>(mem.num_indexes));
  add_line(line);
  add_line("");

  auto bytes_exact = [](uint64_t b) { return b < 1024 ? format_bytes(b) : format_bytes(b) + " (" + std::to_string(b) + " B)"; };
  const uint64_t cpu_total = mem.kv_bytes_cpu + mem.index_bytes;
  if (mem.gpu) {
    add_line("  GPU  " + bytes_exact(mem.kv_bytes_gpu) + ": the static set (sinks + window on global layers, the window on local ones)");
    add_line("  CPU  " + bytes_exact(cpu_total) + ": offloaded KV " + format_bytes(mem.kv_bytes_cpu) +
             " + index estimate " + format_bytes(mem.index_bytes));
  } else {
    add_line("  GPU  none (gpu = none): the static set stays in CPU memory");
    add_line("  CPU  " + bytes_exact(cpu_total) + ": KV " + format_bytes(mem.kv_bytes_cpu) + " (static " +
             format_bytes(mem.kv_bytes_static) + " + offloaded " + format_bytes(mem.kv_bytes_offloaded) +
             ") + index estimate " + format_bytes(mem.index_bytes));
  }
  std::string share;
  if (mem.kv_bytes_full > 0) {
    std::snprintf(line, sizeof line, "; the static set is %.2f%% of it", 100.0 * double(mem.kv_bytes_static) / double(mem.kv_bytes_full));
    share = line;
  }
  add_line("  full attention would keep " + bytes_exact(mem.kv_bytes_full) + " of KV" + share);
  const char* per = mem.plan.shared_graph ? " KV heads" : " query heads";
  add_line("  indexes  " + std::to_string(mem.num_indexes) + " = " + std::to_string(globals) + " global layers x " +
           std::to_string(mem.plan.shared_graph ? m.num_kv_heads : m.num_q_heads) + per +
           (mem.plan.shared_graph ? " (shared_graph)" : "") + "; index estimate =" + per +
           " x offloaded tokens x (4 x (graph_degree + extra_slots + 1) + 8) B = " +
           std::to_string(mem.index_bytes_per_node) + " B per node" +
           (mem.code_bytes_per_key ? " + KV heads x offloaded tokens x " + std::to_string(mem.code_bytes_per_key) +
                                         (uses_projected_codes(mem.plan, m.head_dim)
                                              ? " B of projected traversal codes (one set per query head)"
                                              : " B of traversal codes (one set per KV head)")
                                   : std::string()));
  return out;
}

boost::json::object report_json(const Program& program, const MemoryPlan& mem) {
  namespace json = boost::json;
  const ModelLayout& m = program.model;
  json::object model;
  model["name"] = m.name;
  model["source"] = m.source;
  model["layers"] = m.num_layers;
  model["global_layers"] = m.num_global_layers();
  model["q_heads"] = m.num_q_heads;
  model["kv_heads"] = m.num_kv_heads;
  model["group_size"] = m.group_size();
  model["head_dim"] = m.head_dim;
  model["kv_dtype"] = dtype_name(m.kv_dtype);
  model["rope_base_global"] = json_number(m.rope_base_global);
  if (m.rope_base_local) model["rope_base_local"] = json_number(*m.rope_base_local);
  else model["rope_base_local"] = nullptr;
  model["rope_style"] = rope_style_name(m.rope_style);
  model["max_context"] = m.max_context;

  json::object plan, domains;
  const auto& c = mem.plan;
  for (const auto& [k, v] : concrete_values(c)) plan[k] = json_number(v);
  json::object kernel;
  for (const auto& [k, v] : c.kernel) kernel[k] = json_number(v);
  plan["kernel"] = kernel;
  for (const auto& p : plan_params(program.plan)) domains[p.key] = format_domain(*p.domain);
  for (const auto& [k, d] : program.plan.kernel) domains["kernel." + k] = format_domain(d);
  if (!c.layer_search.empty()) {  // only when the plan has `layer N { ... }` blocks
    json::object own_values, own_domains;
    for (const auto& [layer, own] : c.layer_search) {
      json::object o;
      for (const auto& [k, v] : own) o[k] = v;
      own_values[std::to_string(layer)] = std::move(o);
    }
    for (const auto& [layer, own] : program.plan.layer_search) {
      json::object o;
      for (const auto& [k, d] : own.params) o[k] = format_domain(d);
      own_domains[std::to_string(layer)] = std::move(o);
    }
    plan["layer_search"] = std::move(own_values);
    domains["layer_search"] = std::move(own_domains);
  }

  json::array layers;
  for (const auto& lm : mem.layers) {
    json::object o;
    o["layer"] = lm.layer;
    o["kind"] = lm.global ? "global" : "local";
    o["sliding_window"] = lm.sliding_window;
    o["rope_base"] = json_number(m.layers[size_t(lm.layer)].rope_base);
    o["static_tokens"] = lm.static_tokens;
    o["offloaded_tokens"] = lm.offloaded_tokens;
    o["kv_bytes_static"] = lm.kv_bytes_static;
    o["kv_bytes_gpu"] = mem.gpu ? lm.kv_bytes_static : 0;
    o["kv_bytes_cpu"] = mem.gpu ? lm.kv_bytes_offloaded : lm.kv_bytes_offloaded + lm.kv_bytes_static;
    o["index_bytes"] = lm.index_bytes;
    o["kv_bytes_full"] = lm.kv_bytes_full;
    o["num_indexes"] = lm.num_indexes;
    layers.push_back(std::move(o));
  }

  json::object out;
  out["file"] = program.path;
  out["model"] = model;
  out["target"] = json::object{{"gpu", program.target.gpu_arch}, {"cpu", program.target.cpu}};
  out["plan"] = plan;
  out["plan_domains"] = domains;
  out["context"] = mem.context;
  out["kv_bytes_per_token_layer"] = mem.kv_bytes_per_token_layer;
  out["index_bytes_per_node"] = mem.index_bytes_per_node;
  out["code_bytes_per_key"] = mem.code_bytes_per_key;
  out["index_formula"] = "index_bytes = sum over global layers of graphs (q_heads, or kv_heads with shared_graph) x offloaded_tokens x index_bytes_per_node (4 x (graph_degree + extra_slots + 1) + 8) + kv_heads x offloaded_tokens x code_bytes_per_key (with traversal_codes: head_dim rounded up to 64, or with code_dims the projected row per query head of a group; else 0)";
  out["kv_bytes_full"] = mem.kv_bytes_full;
  out["kv_bytes_static"] = mem.kv_bytes_static;
  out["kv_bytes_offloaded"] = mem.kv_bytes_offloaded;
  out["kv_bytes_gpu"] = mem.kv_bytes_gpu;
  out["kv_bytes_cpu"] = mem.kv_bytes_cpu;
  out["index_bytes"] = mem.index_bytes;
  out["num_indexes"] = mem.num_indexes;
  out["layers"] = layers;
  return out;
}

}  // namespace rattn
