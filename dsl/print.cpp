// IR -> DSL text: format_domain for reports, format_program for DSL that parses back to the same IR.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dsl/dsl.h"

namespace rattn {
namespace {

// Shortest text that reads back as the same double.
std::string exact(double v) {
  if (std::fabs(v) < 9e15 && v == std::floor(v)) return std::to_string(int64_t(v));
  char buf[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string quoted_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out + "\"";
}

// For people (format_domain): short numbers, no step of 1. To parse back
// (format_program): every digit, and every range's step (a real range needs one).
std::string domain_text(const ParamDomain& d, bool to_parse) {
  auto text = to_parse ? exact : format_number;
  std::string out;
  switch (d.kind) {
    case ParamDomain::Kind::fixed: out = d.values.empty() ? "?" : text(d.values[0]); break;
    case ParamDomain::Kind::set:
      out = "{";
      for (size_t i = 0; i < d.values.size(); ++i) out += (i ? ", " : "") + text(d.values[i]);
      out += "}";
      break;
    case ParamDomain::Kind::range:
      out = text(d.lo) + ".." + text(d.hi);
      if (to_parse || d.geometric || d.step != 1) out += std::string(" step ") + (d.geometric ? "*" : "") + text(d.step);
      break;
  }
  if (d.preferred) out += " default " + text(*d.preferred);
  return out;
}

bool same_domain(const ParamDomain& a, const ParamDomain& b) {
  return a.kind == b.kind && a.values == b.values && a.lo == b.lo && a.hi == b.hi && a.step == b.step &&
         a.geometric == b.geometric && a.preferred == b.preferred;
}

std::string layer_kind(const LayerSpec& l) {
  return l.global ? "global" : "local(" + std::to_string(l.sliding_window) + ")";
}

}  // namespace

std::string format_number(double v) {
  if (std::fabs(v) < 9e15 && v == std::floor(v)) return std::to_string(int64_t(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string format_domain(const ParamDomain& d) { return domain_text(d, false); }

std::string format_program(const Program& program) {
  const ModelLayout& m = program.model;
  std::string out = "model " + quoted_string(m.name) + " {\n";
  if (!m.source.empty()) out += "  source = " + quoted_string(m.source) + ";\n";
  out += "  layers = " + std::to_string(m.num_layers) + ";\n";
  out += "  q_heads = " + std::to_string(m.num_q_heads) + ";\n";
  out += "  kv_heads = " + std::to_string(m.num_kv_heads) + ";\n";
  out += "  head_dim = " + std::to_string(m.head_dim) + ";\n";
  out += "  kv_dtype = " + std::string(dtype_name(m.kv_dtype)) + ";\n";
  if (m.rope_base_local)
    out += "  rope_base { global = " + exact(m.rope_base_global) + "; local = " + exact(*m.rope_base_local) + "; }\n";
  else
    out += "  rope_base = " + exact(m.rope_base_global) + ";\n";
  out += "  rope_style = " + std::string(rope_style_name(m.rope_style)) + ";\n";
  // Runs of equal layers: `local(512) x 5, global, ...`.
  std::string pattern;
  for (size_t i = 0; i < m.layers.size();) {
    size_t j = i;
    while (j + 1 < m.layers.size() && layer_kind(m.layers[j + 1]) == layer_kind(m.layers[i])) ++j;
    pattern += (pattern.empty() ? "" : ", ") + layer_kind(m.layers[i]);
    if (j > i) pattern += " x " + std::to_string(j - i + 1);
    i = j + 1;
  }
  if (!pattern.empty()) out += "  pattern = " + pattern + ";\n";
  out += "  context = " + std::to_string(m.max_context) + ";\n}\n";

  // Only what differs from the IR's defaults: the same program, and no plan
  // block when there is nothing to say (the checks of a plan's relations run
  // on a plan block only, so a program that had none keeps having none).
  const RetrievalPlan& p = program.plan;
  const RetrievalPlan defaults;
  const std::vector<PlanParam> params = plan_params(p), default_params = plan_params(defaults);
  std::string plan;
  for (size_t i = 0; i < params.size(); ++i)
    if (!same_domain(*params[i].domain, *default_params[i].domain))
      plan += "  " + std::string(params[i].key) + " = " + domain_text(*params[i].domain, true) + ";\n";
  for (const auto& [knob, d] : p.kernel) plan += "  kernel." + knob + " = " + domain_text(d, true) + ";\n";
  for (const auto& [layer, own] : p.layer_search) {
    plan += "  layer " + std::to_string(layer) + " {";
    for (const auto& [key, d] : own.params) plan += " " + key + " = " + domain_text(d, true) + ";";
    plan += " }\n";
  }
  if (!plan.empty()) out += "plan {\n" + plan + "}\n";
  out += "target {\n  gpu = " + quoted_string(program.target.gpu_arch) + ";\n  cpu = " + quoted_string(program.target.cpu) +
         ";\n}\n";
  return out;
}

}  // namespace rattn
