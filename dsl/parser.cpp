// Recursive-descent parser: tokens -> ProgramSyntax. Every error names what was
// expected at that point; values are range-checked later, in sema.cpp.
#include <algorithm>
#include <iterator>
#include <map>

#include "dsl/ast.h"
#include "dsl/ir.h"
#include "dsl/kernel_knobs.h"
#include "dsl/sema.h"

namespace rattn::internal {

// Optimal string alignment distance: insertions, deletions, substitutions and
// swaps of two neighbouring letters each cost 1 ("modle" -> "model" is 1).
int edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = int(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = int(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::string closest(std::string_view word, const std::vector<std::string>& known) {
  if (word.size() > 64) return {};  // no key is that long; keep the table small
  std::string best;
  int best_d = 1 << 30;
  for (const auto& k : known) {
    const int d = edit_distance(word, k);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  // Close means: about a third of the longer word, at most 3 edits, and not
  // a replacement of the whole word.
  const int limit = std::min(3, std::max(1, int(std::max(word.size(), best.size()) / 3)));
  return best_d <= limit && best_d < int(word.size()) ? best : std::string();
}

namespace {

constexpr int kMaxPatternDepth = 16;

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

const std::vector<std::string>& model_keys() {
  static const std::vector<std::string> k = {"source",   "layers",   "q_heads", "kv_heads",
                                             "head_dim", "kv_dtype", "rope_base", "rope_style",
                                             "pattern",  "context"};
  return k;
}
const std::vector<std::string>& plan_keys_list() {
  static const std::vector<std::string> k = {
      "sinks",          "window",           "top_k",           "graph_degree",     "query_neighbors",
      "build_sample",   "search_queue",     "build_queue",     "pivot_capacity",   "pivots_per_query",
      "two_hop_fill",   "extra_slots",      "entry_points",    "repair_fraction",  "key_metric",
      "key_metric_ridge", "key_metric_passes", "causal",       "insert_queue",     "insert_pivots",
      "insert_reverse", "insert_key_queue", "traversal_codes", "code_dims", "code_coarse_dims", "search_patience", "search_seeds",
      "search_expand_first", "search_full_expand",
      "tail_samples",   "shift_queries",    "shift_span",      "refresh_sample",   "shared_graph",     "knn_cluster_keys",
      "knn_probes",     "repair_max_queries", "kernel.<knob>"};
  return k;
}
const std::vector<std::string>& target_keys() {
  static const std::vector<std::string> k = {"gpu", "cpu"};
  return k;
}

class Parser {
 public:
  Parser(const std::vector<Token>& toks, std::string_view text, const std::string& file)
      : toks_(toks), text_(text), file_(file) {}

  ProgramSyntax program() {
    ProgramSyntax p;
    std::map<std::string, Loc> seen_blocks;
    while (cur().kind != Tok::eof) {
      const Token& t = cur();
      if (t.kind != Tok::ident || (t.text != "model" && t.text != "plan" && t.text != "target")) {
        std::string msg = "expected 'model', 'plan' or 'target' at the top level, got " + describe(t);
        if (t.kind == Tok::ident) {
          const std::string s = closest(t.text, {"model", "plan", "target"});
          if (!s.empty()) msg += "; did you mean '" + s + "'?";
        }
        error(t.loc, msg);
      }
      if (auto it = seen_blocks.find(t.text); it != seen_blocks.end())
        error(t.loc, "duplicate '" + t.text + "' block (the first is at " + where(it->second) + ")");
      seen_blocks[t.text] = t.loc;
      if (t.text == "model") p.model = model_block();
      else if (t.text == "plan") p.plan = plan_block();
      else p.target = target_block();
    }
    p.end = cur().loc;
    return p;
  }

 private:
  const Token& cur() const { return toks_[idx_]; }
  const Token& next_tok() const { return toks_[std::min(idx_ + 1, toks_.size() - 1)]; }
  const Token& take() {
    const Token& t = toks_[idx_];
    if (idx_ + 1 < toks_.size()) ++idx_;
    return t;
  }
  bool at_ident(std::string_view name) const { return cur().kind == Tok::ident && cur().text == name; }

  [[noreturn]] void error(Loc loc, const std::string& msg) const { fail_at(file_, text_, loc, msg); }
  static std::string where(Loc l) { return std::to_string(l.line) + ":" + std::to_string(l.col); }

  const Token& expect(Tok kind, const std::string& context) {
    if (cur().kind != kind)
      error(cur().loc, std::string("expected ") + tok_name(kind) + " " + context + ", got " + describe(cur()));
    return take();
  }

  // `key` already seen in this block? Then it is a duplicate.
  void check_duplicate(std::map<std::string, Loc>& seen, const Token& key, const char* block) {
    if (auto it = seen.find(key.text); it != seen.end())
      error(key.loc, "duplicate key " + quoted(key.text) + " in the " + block + " block (first set at " +
                         where(it->second) + ")");
    seen[key.text] = key.loc;
  }

  [[noreturn]] void unknown_key(const Token& key, const char* block,
                                const std::vector<std::string>& known) {
    std::string msg = "unknown key " + quoted(key.text) + " in the " + block + " block";
    const std::string s = closest(key.text, known);
    if (!s.empty()) msg += "; did you mean '" + s + "'?";
    else msg += " (expected one of: " + join(known) + ")";
    error(key.loc, msg);
  }

  // A key at the start of an entry, or the closing brace.
  bool entry_start(const char* block) {
    if (cur().kind == Tok::rbrace) {
      take();
      return false;
    }
    if (cur().kind != Tok::ident)
      error(cur().loc, std::string("expected a key or '}' to close the ") + block + " block, got " +
                           describe(cur()));
    return true;
  }

  Number number(const std::string& what) {
    Number n;
    n.loc = cur().loc;
    bool negative = false;
    if (cur().kind == Tok::minus) {
      negative = true;
      take();
    }
    const Token& t = cur();
    if (t.kind != Tok::integer && t.kind != Tok::real)
      error(t.loc, "expected a number for " + what + ", got " + describe(t));
    take();
    n.is_integer = t.kind == Tok::integer;
    n.int_value = negative ? -t.int_value : t.int_value;
    n.value = negative ? -t.real_value : t.real_value;
    n.spelling = excerpt((negative ? "-" : "") + t.text);
    return n;
  }

  Text text_value(const std::string& what, bool allow_ident) {
    const Token& t = cur();
    if (t.kind == Tok::string || (allow_ident && t.kind == Tok::ident)) {
      take();
      return Text{t.text, t.loc};
    }
    error(t.loc, std::string("expected ") + (allow_ident ? "a name or a string" : "a string") +
                     " for " + what + ", got " + describe(t));
  }

  void end_entry(const std::string& key) {
    expect(Tok::semicolon, "after the value of '" + key + "'");
  }

  ModelSyntax model_block() {
    ModelSyntax m;
    m.loc = take().loc;
    if (cur().kind != Tok::string)
      error(cur().loc, "expected the model's name as a string after 'model', e.g. model \"Llama-3-8B\" {, got " +
                           describe(cur()));
    m.name = Text{cur().text, cur().loc};
    take();
    expect(Tok::lbrace, "to open the model block");
    std::map<std::string, Loc> seen;
    while (entry_start("model")) {
      const Token& key = take();
      const auto& known = model_keys();
      if (std::find(known.begin(), known.end(), key.text) == known.end()) unknown_key(key, "model", known);
      check_duplicate(seen, key, "model");
      const std::string k = key.text;
      if (k == "rope_base" && cur().kind == Tok::lbrace) {
        rope_block(m);
        continue;
      }
      expect(Tok::equals, "after '" + k + "'");
      const std::string what = "'" + k + "'";
      if (k == "source") m.source = text_value(what, false);
      else if (k == "kv_dtype") m.kv_dtype = text_value(what, true);
      else if (k == "rope_style") m.rope_style = text_value(what, true);
      else if (k == "pattern") m.pattern = pattern();
      else if (k == "rope_base") m.rope_base = number(what);
      else {
        Number n = number(what);
        if (k == "layers") m.layers = n;
        else if (k == "q_heads") m.q_heads = n;
        else if (k == "kv_heads") m.kv_heads = n;
        else if (k == "head_dim") m.head_dim = n;
        else m.context = n;
      }
      end_entry(k);
    }
    return m;
  }

  // rope_base { global = v; local = v; }
  void rope_block(ModelSyntax& m) {
    take();  // '{'
    std::map<std::string, Loc> seen;
    while (entry_start("rope_base")) {
      const Token& key = take();
      if (key.text != "global" && key.text != "local") unknown_key(key, "rope_base", {"global", "local"});
      check_duplicate(seen, key, "rope_base");
      expect(Tok::equals, "after '" + key.text + "'");
      Number n = number("'rope_base." + key.text + "'");
      (key.text == "global" ? m.rope_global : m.rope_local) = n;
      end_entry("rope_base." + key.text);
    }
  }

  PatternSyntax pattern() {
    PatternSyntax p;
    p.loc = cur().loc;
    if (at_ident("repeat")) {
      take();
      if (cur().kind != Tok::lbracket)
        error(cur().loc, "expected '[' after 'repeat', e.g. repeat [local(512) x 5, global], got " +
                             describe(cur()));
      p.repeat = true;
      PatternItem group = pattern_item(0);
      if (group.count != 1)
        error(group.count_loc, "'repeat [...]' fills all layers; remove the 'x' count or drop 'repeat'");
      p.items = std::move(group.items);
      return p;
    }
    p.items.push_back(pattern_item(0));
    while (cur().kind == Tok::comma) {
      take();
      check_pattern_items(p.items.size());
      p.items.push_back(pattern_item(0));
    }
    if (cur().kind != Tok::semicolon)
      error(cur().loc, "expected ',' or ';' after a layer pattern item, got " + describe(cur()));
    return p;
  }

  // Each item is at least one layer, so a list longer than the most layers a
  // model may have is wrong whatever 'layers' says: stop before reading on.
  void check_pattern_items(size_t items_so_far) const {
    if (items_so_far >= size_t(kMaxLayers))
      error(cur().loc, "the layer pattern lists more than " + std::to_string(kMaxLayers) +
                           " items; a model has at most " + std::to_string(kMaxLayers) +
                           " layers (use 'x N' to repeat an item)");
  }

  PatternItem pattern_item(int depth) {
    PatternItem it;
    it.loc = cur().loc;
    if (depth >= kMaxPatternDepth && cur().kind == Tok::lbracket)
      error(it.loc, "layer pattern is nested too deeply (at most 16 levels of '[')");
    if (at_ident("global")) {
      take();
      it.kind = PatternItem::Kind::global;
    } else if (at_ident("local")) {
      take();
      it.kind = PatternItem::Kind::local;
      expect(Tok::lparen, "after 'local' (write local(WINDOW), e.g. local(512))");
      it.window = number("the window of 'local'");
      expect(Tok::rparen, "after the window of 'local'");
    } else if (cur().kind == Tok::lbracket) {
      take();
      it.kind = PatternItem::Kind::group;
      it.items.push_back(pattern_item(depth + 1));
      while (cur().kind == Tok::comma) {
        take();
        check_pattern_items(it.items.size());
        it.items.push_back(pattern_item(depth + 1));
      }
      if (cur().kind != Tok::rbracket)
        error(cur().loc, "expected ',' or ']' in the layer pattern, got " + describe(cur()));
      take();
    } else {
      error(cur().loc, "expected a layer kind ('global', 'local(W)' or '[...]') in the pattern, got " +
                           describe(cur()));
    }
    // Optional repeat count: `x 5` (or `x5`, which lexes as one name).
    it.count_loc = cur().loc;
    if (at_ident("x")) {
      take();
      it.count_loc = cur().loc;
      if (cur().kind != Tok::integer)
        error(cur().loc, "expected a whole repeat count after 'x', got " + describe(cur()));
      it.count = take().int_value;
    } else if (cur().kind == Tok::ident && cur().text.size() > 1 && cur().text[0] == 'x' &&
               std::all_of(cur().text.begin() + 1, cur().text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const Token& t = take();
      // "x" + digits: reuse the lexer's overflow check by re-tokenizing the digits.
      const std::string digits = t.text.substr(1);
      if (digits.size() > 18)
        error(Loc{t.loc.line, t.loc.col + 1}, "repeat count '" + digits + "' is too large");
      it.count = std::stoll(digits);
      it.count_loc = Loc{t.loc.line, t.loc.col + 1};
    }
    if (it.count < 1) error(it.count_loc, "repeat count must be at least 1, got " + std::to_string(it.count));
    return it;
  }

  PlanSyntax plan_block() {
    PlanSyntax p;
    p.loc = take().loc;
    expect(Tok::lbrace, "to open the plan block");
    std::map<std::string, Loc> seen;
    while (entry_start("plan")) {
      if (at_ident("layer") && next_tok().kind != Tok::equals) {
        p.layer_blocks.push_back(layer_block());
        continue;
      }
      Token key = take();
      // Dotted key: kernel.cuda.splits
      while (cur().kind == Tok::dot) {
        take();
        if (cur().kind != Tok::ident)
          error(cur().loc, "expected a name after '.' in the key " + quoted(key.text + ".") + ", got " + describe(cur()));
        key.text += "." + take().text;
      }
      const bool is_kernel = key.text.rfind("kernel.", 0) == 0;
      if (key.text == "kernel")
        error(cur().loc, "expected '.' and a knob name after 'kernel', e.g. kernel.cuda.splits, got " +
                             describe(cur()));
      if (!is_kernel) {
        const auto& known = plan_keys_list();
        if (std::find(known.begin(), known.end() - 1, key.text) == known.end() - 1)
          unknown_key(key, "plan", known);
      } else if (!find_kernel_knob(std::string_view(key.text).substr(7))) {
        std::vector<std::string> knobs;
        for (const auto& k : kernel_knobs()) knobs.push_back(std::string("kernel.") + k.key);
        unknown_key(key, "plan", knobs);
      }
      p.params[key.text] = keyed_domain(key, seen, "plan");
    }
    return p;
  }

  // The rest of a `key = domain [default v];` entry whose key was read.
  DomainSyntax keyed_domain(const Token& key, std::map<std::string, Loc>& seen, const char* block) {
    check_duplicate(seen, key, block);
    expect(Tok::equals, "after '" + key.text + "'");
    DomainSyntax d = domain(key.text);
    d.key_loc = key.loc;
    end_entry(key.text);
    return d;
  }

  // `layer N, M, ... { key = domain; ... }`: per-layer keys (plan_keys::layer_keys) for those layers.
  LayerBlockSyntax layer_block() {
    LayerBlockSyntax b;
    b.loc = take().loc;
    b.layers.push_back(number("a layer number after 'layer'"));
    while (cur().kind == Tok::comma) {
      take();
      // More numbers than layers must repeat one or be out of range.
      if (b.layers.size() >= size_t(kMaxLayers))
        error(cur().loc, "the layer block lists more than " + std::to_string(kMaxLayers) +
                             " layers; a model has at most " + std::to_string(kMaxLayers));
      b.layers.push_back(number("a layer number after ','"));
    }
    expect(Tok::lbrace, "to open the layer block");
    std::map<std::string, Loc> seen;
    std::vector<std::string> known(std::begin(rattn::plan_keys::layer_keys), std::end(rattn::plan_keys::layer_keys));
    while (entry_start("layer")) {
      const Token& key = take();
      if (std::find(known.begin(), known.end(), key.text) == known.end()) {
        const auto& plan_known = plan_keys_list();
        if (std::find(plan_known.begin(), plan_known.end(), key.text) != plan_known.end() ||
            key.text == "kernel")
          error(key.loc, quoted(key.text) + " applies to the whole model and cannot be set per layer (per-layer keys: " +
                             join(known) + ")");
        unknown_key(key, "layer", known);
      }
      b.params[key.text] = keyed_domain(key, seen, "layer");
    }
    return b;
  }

  DomainSyntax domain(const std::string& key) {
    DomainSyntax d;
    d.loc = cur().loc;
    const std::string what = "'" + key + "'";
    if (cur().kind == Tok::lbrace) {
      take();
      d.kind = DomainSyntax::Kind::set;
      d.values.push_back(number("a member of the set of " + what));
      while (cur().kind == Tok::comma) {
        take();
        // Capped like a range's candidates, before the members are read.
        if (d.values.size() >= size_t(kMaxCandidates))
          error(cur().loc, "the set of " + what + " has more than " + std::to_string(kMaxCandidates) +
                               " members; at most " + std::to_string(kMaxCandidates) + " are allowed");
        d.values.push_back(number("a member of the set of " + what));
      }
      if (cur().kind != Tok::rbrace)
        error(cur().loc, "expected ',' or '}' in the set of " + what + ", got " + describe(cur()));
      take();
    } else if (cur().kind == Tok::integer || cur().kind == Tok::real || cur().kind == Tok::minus) {
      Number first = number(what);
      if (cur().kind == Tok::dotdot) {
        take();
        d.kind = DomainSyntax::Kind::range;
        d.lo = first;
        d.hi = number("the upper end of the range of " + what);
        if (at_ident("step")) {
          take();
          if (cur().kind == Tok::star) {
            take();
            d.geometric = true;
          }
          d.step = number("the step of " + what);
        }
      } else {
        d.kind = DomainSyntax::Kind::fixed;
        d.values.push_back(first);
      }
    } else {
      error(cur().loc, "expected a number, a range 'lo..hi [step s]' or a set '{a, b, ...}' for " + what +
                           ", got " + describe(cur()));
    }
    if (at_ident("default")) {
      take();
      d.preferred = number("the default of " + what);
    }
    return d;
  }

  TargetSyntax target_block() {
    TargetSyntax t;
    t.loc = take().loc;
    expect(Tok::lbrace, "to open the target block");
    std::map<std::string, Loc> seen;
    while (entry_start("target")) {
      const Token& key = take();
      if (key.text != "gpu" && key.text != "cpu") unknown_key(key, "target", target_keys());
      check_duplicate(seen, key, "target");
      expect(Tok::equals, "after '" + key.text + "'");
      Text v = text_value("'" + key.text + "'", true);
      (key.text == "gpu" ? t.gpu : t.cpu) = v;
      end_entry(key.text);
    }
    return t;
  }

  const std::vector<Token>& toks_;
  std::string_view text_;
  const std::string& file_;
  size_t idx_ = 0;
};

}  // namespace

ProgramSyntax parse_syntax(const std::vector<Token>& tokens, std::string_view text,
                           const std::string& filename) {
  return Parser(tokens, text, filename).program();
}

}  // namespace rattn::internal
