#pragma once
// Syntax tree of one *.ra file: what the parser read, with source locations,
// before any semantic check. Internal to the front end (parser -> sema).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dsl/lexer.h"

namespace rattn::internal {

struct Number {
  double value = 0;
  int64_t int_value = 0;  // meaningful when is_integer
  bool is_integer = false;
  std::string spelling;  // as written, for messages
  Loc loc;
};

struct Text {
  std::string value;
  Loc loc;
};

// A plan parameter as written: `v`, `lo..hi [step [*]s]`, or `{a, b, ...}`,
// each optionally followed by `default v`.
struct DomainSyntax {
  enum class Kind { fixed, range, set };
  Kind kind = Kind::fixed;
  std::vector<Number> values;  // fixed: 1; set: members as written
  Number lo, hi;
  std::optional<Number> step;
  bool geometric = false;  // `step *s`
  std::optional<Number> preferred;
  Loc loc;       // first token of the value
  Loc key_loc;   // the key
};

// One element of a layer pattern: `global`, `local(W)` or `[ ... ]`, repeated `x N` times.
struct PatternItem {
  enum class Kind { global, local, group };
  Kind kind = Kind::global;
  Number window;                   // local
  std::vector<PatternItem> items;  // group
  int64_t count = 1;
  Loc loc;
  Loc count_loc;
};

struct PatternSyntax {
  bool repeat = false;  // `repeat [ ... ]`: the group fills `layers`
  std::vector<PatternItem> items;
  Loc loc;
};

struct ModelSyntax {
  Text name;
  Loc loc;  // the `model` keyword
  std::optional<Text> source;
  std::optional<Number> layers, q_heads, kv_heads, head_dim, context;
  std::optional<Text> kv_dtype;
  std::optional<Text> rope_style;                  // neox | gptj
  std::optional<Number> rope_base;                 // `rope_base = v;`
  std::optional<Number> rope_global, rope_local;  // `rope_base { global = v; local = v; }`
  std::optional<PatternSyntax> pattern;
};

// `layer 5, 11 { search_queue = 200; ... }` inside the plan block.
struct LayerBlockSyntax {
  Loc loc;                     // the `layer` keyword
  std::vector<Number> layers;  // as written
  std::map<std::string, DomainSyntax> params;
};

struct PlanSyntax {
  Loc loc;
  std::map<std::string, DomainSyntax> params;  // "sinks", ..., "kernel.cuda.splits"
  std::vector<LayerBlockSyntax> layer_blocks;
};

struct TargetSyntax {
  Loc loc;
  std::optional<Text> gpu;
  std::optional<Text> cpu;
};

struct ProgramSyntax {
  std::optional<ModelSyntax> model;
  std::optional<PlanSyntax> plan;
  std::optional<TargetSyntax> target;
  Loc end;  // end of file
};

// Parses tokens into the tree; syntax errors, unknown and duplicate keys and
// duplicate blocks are reported here.
ProgramSyntax parse_syntax(const std::vector<Token>& tokens, std::string_view text,
                           const std::string& filename);

// Edit distance, for "did you mean" suggestions.
int edit_distance(std::string_view a, std::string_view b);
// The closest of `known` to `word`, or "" when none is close.
std::string closest(std::string_view word, const std::vector<std::string>& known);

}  // namespace rattn::internal
