// The Halide pipelines, each a define_X (the algorithm) and a schedule_X (its
// schedule), specialised from a HalideKernelConfig; their compilation and
// description. The only translation unit of rattn that includes Halide.h.
#include <Halide.h>

#include <cctype>
#include <iostream>
#include <map>
#include <limits>
#include <mutex>
#include <sstream>

#include "codegen/halide/pipelines.h"
#include "core/error.h"

#ifndef RATTN_HALIDE_VERSION
#define RATTN_HALIDE_VERSION "unknown"
#endif
#ifndef RATTN_PIPELINE_SOURCE_HASH
#define RATTN_PIPELINE_SOURCE_HASH "unknown"
#endif

namespace rattn {
namespace internal {
namespace {

using namespace Halide;

// fp16 and bf16 are loaded as uint16 and widened by hand: Halide 14 lowers
// its float16 cast to a long integer sequence (no F16C vcvtph2ps).
Type storage_type(DType t) { return t == DType::f32 ? Float(32) : UInt(16); }

// fp32 value of a stored element divided by raw_scale(t). For fp16 that is
// three integer ops per vector: sign-extend, shift the exponent and mantissa
// into fp32 position, clear the three sign copies left inside the exponent.
// The result is the half's value times 2^-112 (exact for normal and subnormal
// halves; K/V must be finite); the 2^112 is folded into q and the
// probabilities, outside the inner loops.
Expr widen_raw(DType t, const Expr& e) {
  switch (t) {
    case DType::f32: return e;
    case DType::bf16: return reinterpret(Float(32), cast<uint32_t>(e) << 16);
    case DType::f16: {
      Expr bits = reinterpret(UInt(32), cast<int32_t>(reinterpret(Int(16), e)) << 13);
      return reinterpret(Float(32), bits & Expr(uint32_t(0x8fffffffu)));
    }
  }
  return e;
}

float raw_scale(DType t) { return t == DType::f16 ? 5.192296858534828e33f : 1.0f; }  // 2^112

// Rows of d contiguous elements, row stride d, first row 0.
void constrain_rows(ImageParam& p, int d) {
  p.dim(0).set_bounds(0, d).set_stride(1);
  p.dim(1).set_min(0).set_stride(d);
}

// Sum of lanes(0..w-1, rest...) as a balanced tree (shorter dependency chain).
Expr tree_sum(const std::vector<Expr>& terms, size_t lo, size_t hi) {
  if (hi - lo == 1) return terms[lo];
  const size_t mid = (lo + hi) / 2;
  return tree_sum(terms, lo, mid) + tree_sum(terms, mid, hi);
}

// Each pipeline is a define_X(config), the algorithm: its parameters, Funcs
// and output-buffer contract, no scheduling; and a schedule_X(pipeline,
// schedule) that only schedules those Funcs. The vector width W is also part
// of the algorithm: the dot products keep W lanes of partial sums. The Vars
// and Funcs are named, so the description reads with the names used here.

// gathered_dot: scores(i, g) = <q(., g), k(., ids[i])>.
struct GatheredDot {
  int groups = 0;
  ImageParam q, k, ids;
  Var l{"l"}, i{"i"}, g{"g"};
  Expr n;  // number of ids
  RDom r;  // vectors of W lanes along d
  Func qs{"q_scaled"}, lanes{"lanes"}, scores{"scores"};

  Pipeline pipeline() const { return Pipeline(scores); }
  std::vector<Argument> arguments() const { return {q, k, ids}; }
};

GatheredDot define_gathered_dot(const HalideKernelConfig& c) {
  const int D = c.head_dim, G = c.groups, W = c.schedule.vector_width;
  GatheredDot p;
  p.groups = G;
  p.q = ImageParam(Float(32), 2, "q");
  p.k = ImageParam(storage_type(c.kv_dtype), 2, "k");
  p.ids = ImageParam(Int(32), 1, "ids");
  constrain_rows(p.k, D);
  p.q.dim(0).set_bounds(0, D).set_stride(1);
  p.q.dim(1).set_bounds(0, G).set_stride(D);
  p.ids.dim(0).set_min(0).set_stride(1);

  Var l = p.l, i = p.i, g = p.g;
  p.n = p.ids.dim(0).extent();
  // Clamped twice: padded tokens of the last unrolled group stay in bounds,
  // and a bad id cannot read outside the key rows.
  Expr row = clamp(p.ids(clamp(i, 0, p.n - 1)), 0, p.k.dim(1).extent() - 1);
  p.r = RDom(0, D / W, "r");
  // W lanes of partial sums, reduced by a balanced tree below.
  p.lanes(l, i, g) = 0.0f;
  p.qs(l, g) = p.q(l, g) * raw_scale(c.kv_dtype);  // undoes widen_raw's scaling
  p.lanes(l, i, g) += p.qs(p.r * W + l, g) * widen_raw(c.kv_dtype, p.k(p.r * W + l, row));
  std::vector<Expr> terms;
  for (int x = 0; x < W; ++x) terms.push_back(p.lanes(x, i, g));
  p.scores(i, g) = tree_sum(terms, 0, terms.size());
  p.scores.output_buffer().dim(0).set_min(0);
  p.scores.output_buffer().dim(1).set_bounds(0, G);
  return p;
}

// U tokens x G heads per iteration; every key vector loaded once and used by
// the G heads; W-lane accumulators in registers.
void schedule_gathered_dot(GatheredDot& p, const HalideSchedule& s) {
  const int W = s.vector_width, U = s.unroll;
  Var l = p.l, i = p.i, g = p.g, io("io"), ii("ii");
  p.scores.bound(g, 0, p.groups);
  // ShiftInwards keeps the lanes tile a constant size (stack, registers); it
  // needs n >= U, fewer tokens go one at a time.
  p.scores.specialize(p.n >= U).split(i, io, ii, U, TailStrategy::ShiftInwards).reorder(ii, g, io).unroll(ii).unroll(g);
  p.scores.split(i, io, ii, 1).reorder(ii, g, io).unroll(g);
  p.lanes.compute_at(p.scores, io).vectorize(l).unroll(i).unroll(g);
  p.lanes.update().reorder(l, g, i, p.r).vectorize(l).unroll(g).unroll(i);
  p.qs.compute_root().vectorize(l, W);
}

// partial_attention (gathered rows) and dense_attention (rows 0..n-1):
// blockwise softmax(q k^T / sqrt(d)) v, blocks merged by their log-sum-exp.
struct Attention {
  int head_dim = 0, groups = 0;
  bool gathered = false;
  ImageParam q, k, v, ids;
  Param<int> block{"block"};
  Var l{"l"}, i{"i"}, g{"g"}, b{"b"}, j{"j"}, y{"y"}, t{"t"};
  Expr blocks;   // ceil(n / block)
  RDom r, ri, rb;  // vectors along d; tokens of a block; blocks
  // Scores: `lanes` keeps W partial sums per (token, head), reduced by a
  // balanced tree; or, when `pairs` (unroll x groups) is a power of two,
  // `tile` keeps them for the unroll tokens of a tile as one flat array and
  // `halves` sum neighbouring lanes level by level, so that W vectors fold
  // into one by whole-vector shuffles (no per-score horizontal sums).
  int pairs = 0;
  Func qs{"q_scaled"}, lanes{"lanes"}, tile{"tile"}, score{"score"}, bmax{"block_max"}, prob{"prob"},
      bsum{"block_sum"}, acc{"acc"}, bout{"block_out"}, stats{"block_stats"}, prob_scaled{"prob_scaled"},
      gmax{"max"}, weight{"weight"}, total{"total"}, num{"num"}, out{"out"}, lse{"lse"};
  std::vector<Func> halves;

  Pipeline pipeline() const { return Pipeline({out, lse}); }
  std::vector<Argument> arguments() const {
    return gathered ? std::vector<Argument>{q, k, v, ids, block} : std::vector<Argument>{q, k, v, block};
  }
};

Attention define_attention(const HalideKernelConfig& c, bool gathered) {
  const int D = c.head_dim, G = c.groups, W = c.schedule.vector_width;
  const Type st = storage_type(c.kv_dtype);
  Attention p;
  p.head_dim = D;
  p.groups = G;
  p.gathered = gathered;
  p.q = ImageParam(Float(32), 2, "q");
  p.k = ImageParam(st, 2, "k");
  p.v = ImageParam(st, 2, "v");
  p.ids = ImageParam(Int(32), 1, "ids");
  constrain_rows(p.k, D);
  constrain_rows(p.v, D);
  p.q.dim(0).set_bounds(0, D).set_stride(1);
  p.q.dim(1).set_bounds(0, G).set_stride(D);
  p.ids.dim(0).set_min(0).set_stride(1);

  const float scale = 1.0f / std::sqrt(float(D));
  const Expr lowest = Expr(-std::numeric_limits<float>::max());  // finite stand-in for -inf (fast math)
  const Expr block = p.block;
  Expr n = gathered ? p.ids.dim(0).extent() : p.k.dim(1).extent();
  p.blocks = (n + block - 1) / block;
  auto token_row = [&](const Expr& tok, ImageParam& kv) {
    Expr t = clamp(tok, 0, n - 1);
    return gathered ? clamp(p.ids(t), 0, kv.dim(1).extent() - 1) : t;
  };

  Var l = p.l, i = p.i, g = p.g, b = p.b, j = p.j, y = p.y, t = p.t;
  // 1. Scores of the tokens of block b.
  p.r = RDom(0, D / W, "r");
  p.qs(j, g) = p.q(j, g) * raw_scale(c.kv_dtype);  // folded scale of widen_raw
  // Tokens past n (the last block's tail) are clamped duplicates, masked
  // below; masking here would let bounds inference shrink the tile to a
  // variable size.
  const int U = std::max(1, c.schedule.unroll), P = U * G;
  if (W >= 2 && (P & (P - 1)) == 0) {
    // tile(y, t, b): y = (g * U + u) * W + lane for token t * U + u of block b.
    p.pairs = P;
    const Expr lane = y % W, pair = y / W, head = pair / U, tok = b * block + t * U + pair % U;
    p.tile(y, t, b) = 0.0f;
    p.tile(y, t, b) += p.qs(p.r * W + lane, head) * widen_raw(c.kv_dtype, p.k(p.r * W + lane, token_row(tok, p.k)));
    Func prev = p.tile;
    for (int w = W; w > 1; w /= 2) {
      Func h("halves" + std::to_string(p.halves.size()));
      h(y, t, b) = prev(2 * y, t, b) + prev(2 * y + 1, t, b);  // element y of level L: 2^L lanes of one pair
      p.halves.push_back(h);
      prev = h;
    }
    p.score(i, g, b) = prev(g * U + i % U, i / U, b) * scale;
  } else {
    p.lanes(l, i, g, b) = 0.0f;
    p.lanes(l, i, g, b) += p.qs(p.r * W + l, g) * widen_raw(c.kv_dtype, p.k(p.r * W + l, token_row(b * block + i, p.k)));
    std::vector<Expr> terms;
    for (int x = 0; x < W; ++x) terms.push_back(p.lanes(x, i, g, b));
    p.score(i, g, b) = tree_sum(terms, 0, terms.size()) * scale;
  }
  auto valid = [&](const Expr& i_in_block) { return b * block + i_in_block < n; };
  // 2. Per block: max, exp, sum of exp, exp-weighted sum of value rows.
  p.ri = RDom(0, block, "ri");
  const RDom& ri = p.ri;
  p.bmax(g, b) = lowest;
  p.bmax(g, b) = max(p.bmax(g, b), select(valid(ri), p.score(ri, g, b), lowest));
  p.prob(i, g, b) = select(valid(i), exp(p.score(i, g, b) - p.bmax(g, b)), 0.0f);
  p.bsum(g, b) = 0.0f;
  p.bsum(g, b) += p.prob(ri, g, b);
  p.acc(j, g, b) = 0.0f;
  p.prob_scaled(i, g, b) = p.prob(i, g, b) * raw_scale(c.kv_dtype);  // folded scale of widen_raw
  p.acc(j, g, b) += p.prob_scaled(ri, g, b) * widen_raw(c.kv_dtype, p.v(j, token_row(b * block + ri, p.v)));
  // A block's output with its max and sum, so that one loop over the blocks
  // computes every per-block stage (they stay in cache, and blocks can run
  // in parallel).
  p.bout(j, g, b) = Tuple(p.acc(j, g, b), p.bmax(g, b), p.bsum(g, b));
  p.stats(g, b) = Tuple(p.bout(0, g, b)[1], p.bout(0, g, b)[2]);
  // 3. Merge of the blocks by their log-sum-exp (every block holds >= 1 token).
  p.rb = RDom(0, p.blocks, "rb");
  const RDom& rb = p.rb;
  p.gmax(g) = lowest;
  p.gmax(g) = max(p.gmax(g), p.stats(g, rb)[0]);
  p.weight(g, b) = exp(p.stats(g, b)[0] - p.gmax(g));
  p.total(g) = 0.0f;
  p.total(g) += p.weight(g, rb) * p.stats(g, rb)[1];
  p.num(j, g) = 0.0f;
  p.num(j, g) += p.weight(g, rb) * p.bout(j, g, rb)[0];
  p.out(j, g) = p.num(j, g) / p.total(g);
  p.lse(g) = p.gmax(g) + log(p.total(g));
  p.out.output_buffer().dim(0).set_bounds(0, D).set_stride(1);
  p.out.output_buffer().dim(1).set_bounds(0, G).set_stride(D);
  p.lse.output_buffer().dim(0).set_bounds(0, G);
  return p;
}

// One loop over the blocks computes each block's scores, softmax and
// weighted values (its tile of keys and values read once, the intermediates
// in cache); blocks are independent: with `parallel`, that loop runs on the
// thread pool when there are >= 2 blocks.
void schedule_attention(Attention& p, const HalideSchedule& s) {
  const int D = p.head_dim, W = s.vector_width, U = s.unroll, T = s.d_tile;
  Var l = p.l, i = p.i, g = p.g, b = p.b, j = p.j, y = p.y;
  p.out.bound(j, 0, D).bound(g, 0, p.groups);
  p.lse.bound(g, 0, p.groups);
  Var io("io"), ii("ii"), jo("jo"), ji("ji"), yo("yo"), yi("yi");
  // Weighted values: T vectors of o x G heads stay in registers while the
  // block's tokens stream by.
  const int jt = std::min(D, W * T);
  p.bout.compute_root().split(j, jo, ji, jt).reorder(ji, g, jo, b).vectorize(ji, W).unroll(ji).unroll(g);
  if (s.parallel) p.bout.specialize(p.blocks >= 2).parallel(b);
  p.acc.compute_at(p.bout, jo).vectorize(j, W).unroll(j).unroll(g);
  p.acc.update().reorder(j, g, p.ri).vectorize(j, W).unroll(j).unroll(g);
  // Scores: U tokens x G heads per iteration, key vector shared by the heads.
  // RoundUp: the last group's extra tokens are clamped duplicates, and the
  // tile keeps a constant size (stack, registers).
  p.score.compute_at(p.bout, b).split(i, io, ii, U, TailStrategy::RoundUp).reorder(ii, g, io);
  if (p.pairs) {
    p.score.vectorize(ii).unroll(g);
    p.tile.compute_at(p.score, io).split(y, yo, yi, W).vectorize(yi).unroll(yo);
    p.tile.update().split(y, yo, yi, W).reorder(yi, yo, p.r).vectorize(yi).unroll(yo);
    int extent = p.pairs * W;
    for (Func& h : p.halves) {
      extent /= 2;
      h.compute_at(p.score, io).bound_extent(y, extent);
      if (extent > W) h.split(y, yo, yi, W).vectorize(yi).unroll(yo);
      else h.vectorize(y);
    }
  } else {
    p.score.unroll(ii).unroll(g);
    p.lanes.compute_at(p.score, io).vectorize(l).unroll(i).unroll(g);
    p.lanes.update().reorder(l, g, i, p.r).vectorize(l).unroll(g).unroll(i);
  }
  p.bmax.compute_at(p.bout, b);
  p.bmax.update().reorder(g, p.ri).unroll(g);
  p.prob.compute_at(p.bout, b).vectorize(i, W, TailStrategy::GuardWithIf);
  p.prob_scaled.compute_at(p.bout, b).vectorize(i, W, TailStrategy::GuardWithIf);
  p.bsum.compute_at(p.bout, b);
  p.bsum.update().reorder(g, p.ri).unroll(g);
  p.qs.compute_root().vectorize(j, W);
  p.stats.compute_root();
  p.gmax.compute_root();
  p.weight.compute_root();
  p.total.compute_root();
  p.num.compute_root().vectorize(j, W);
  p.num.update().reorder(j, g, p.rb).vectorize(j, W);
  p.out.vectorize(j, W);
}

// merge: n-way merge of (o, lse) parts by their log-sum-exp.
struct Merge {
  ImageParam op, lp;
  Var j{"j"}, h{"h"}, p{"p"};
  RDom rp;  // parts
  Func gmax{"max"}, weight{"weight"}, total{"total"}, num{"num"}, out{"out"}, lse{"lse"};

  Pipeline pipeline() const { return Pipeline({out, lse}); }
  std::vector<Argument> arguments() const { return {op, lp}; }
};

Merge define_merge(const HalideKernelConfig& c) {
  const int D = c.head_dim;
  Merge m;
  m.op = ImageParam(Float(32), 3, "o_parts");
  m.lp = ImageParam(Float(32), 2, "lse_parts");
  m.op.dim(0).set_bounds(0, D).set_stride(1);
  m.op.dim(1).set_min(0).set_stride(D);
  m.op.dim(2).set_min(0);
  m.lp.dim(0).set_min(0).set_stride(1);
  m.lp.dim(1).set_min(0);
  const Expr lowest = Expr(-std::numeric_limits<float>::max());
  Var j = m.j, h = m.h, p = m.p;
  m.rp = RDom(0, m.lp.dim(1).extent(), "rp");
  const RDom& rp = m.rp;
  // Parts with lse below the sentinel (i.e. -inf) are empty: weight 0.
  Expr empty_part = m.lp(h, p) <= kEmptyLse;
  m.gmax(h) = lowest;
  m.gmax(h) = max(m.gmax(h), select(m.lp(h, rp) <= kEmptyLse, lowest, m.lp(h, rp)));
  m.weight(h, p) = select(empty_part, 0.0f, exp(m.lp(h, p) - m.gmax(h)));
  m.total(h) = 0.0f;
  m.total(h) += m.weight(h, rp);
  m.num(j, h) = 0.0f;
  m.num(j, h) += m.weight(h, rp) * m.op(j, h, rp);
  m.out(j, h) = select(m.total(h) > 0.0f, m.num(j, h) / m.total(h), 0.0f);
  m.lse(h) = select(m.total(h) > 0.0f, m.gmax(h) + log(m.total(h)), kEmptyLse);
  m.out.output_buffer().dim(0).set_bounds(0, D).set_stride(1);
  m.out.output_buffer().dim(1).set_min(0).set_stride(D);
  m.lse.output_buffer().dim(0).set_min(0);
  return m;
}

void schedule_merge(Merge& m, const HalideSchedule& s) {
  const int W = s.vector_width;
  m.gmax.compute_root();
  m.weight.compute_root();
  m.total.compute_root();
  m.num.compute_at(m.out, m.h).vectorize(m.j, W);
  m.num.update().reorder(m.j, m.rp).vectorize(m.j, W);
  m.out.vectorize(m.j, W);
}

// A defined and scheduled pipeline with its arguments in calling order.
struct Built {
  Pipeline pipeline;
  std::vector<Argument> args;
};

template <class P>
Built scheduled(P p, const HalideSchedule& s, void (*schedule)(P&, const HalideSchedule&)) {
  schedule(p, s);
  return {p.pipeline(), p.arguments()};
}

Built build(const HalideKernelConfig& c) {
  const HalideSchedule& s = c.schedule;
  switch (c.kind) {
    case HalideKernelKind::gathered_dot: return scheduled(define_gathered_dot(c), s, schedule_gathered_dot);
    case HalideKernelKind::partial_attention: return scheduled(define_attention(c, true), s, schedule_attention);
    case HalideKernelKind::dense_attention: return scheduled(define_attention(c, false), s, schedule_attention);
    case HalideKernelKind::merge: return scheduled(define_merge(c), s, schedule_merge);
  }
  fail(Status::internal, "unknown Halide kernel kind");
}

// Halide 14 documents no promise that compiles on several threads at once are
// safe, and ThreadSanitizer sees them race on libHalide's globals: every call
// into libHalide holds this lock (recursive: the entry points call each other).
std::recursive_mutex& halide_mutex() {
  static std::recursive_mutex m;
  return m;
}

// Names as print_loop_nest shows them: without the "$N" Halide appends to make
// Func names unique in the process, nor the "$x" of a one-dimensional RDom.
std::string without_unique_suffixes(const std::string& text) {
  std::string out;
  for (size_t at = 0; at < text.size(); ++at) {
    if (text[at] != '$') {
      out += text[at];
      continue;
    }
    while (at + 1 < text.size() && std::isalnum(static_cast<unsigned char>(text[at + 1]))) ++at;
  }
  return out;
}

// Halide names the lets of a definition from a process-wide counter; renamed
// t0, t1, ... in order of appearance, a kernel prints the same in any process.
std::string renumber_lets(const std::string& text) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  std::map<std::string, std::string> names;
  for (size_t at = text.find("let "); at != std::string::npos; at = text.find("let ", at + 4)) {
    if (at > 0 && ident(text[at - 1])) continue;
    size_t end = at + 4;
    while (end < text.size() && ident(text[end])) ++end;
    names.emplace(text.substr(at + 4, end - at - 4), "t" + std::to_string(names.size()));
  }
  std::string out;
  for (size_t at = 0; at < text.size();) {
    if (!ident(text[at])) {
      out += text[at++];
      continue;
    }
    size_t end = at;
    while (end < text.size() && ident(text[end])) ++end;
    const std::string word = text.substr(at, end - at);
    const auto it = names.find(word);
    out += it == names.end() ? word : it->second;
    at = end;
  }
  return out;
}

// One definition of a Func as Halide stores it: `name(args) = value`, then
// each reduction variable's range and each specialisation's condition.
void print_definition(std::ostream& os, const std::string& name, const Internal::Definition& d) {
  std::ostringstream line;
  line << "  " << name << "(";
  for (size_t a = 0; a < d.args().size(); ++a) line << (a ? ", " : "") << d.args()[a];
  line << ") = ";
  if (d.values().size() == 1) {
    line << d.values()[0];
  } else {
    line << "{";
    for (size_t v = 0; v < d.values().size(); ++v) line << (v ? ", " : "") << d.values()[v];
    line << "}";
  }
  line << "\n";
  for (const auto& rv : d.schedule().rvars())
    line << "      where " << rv.var << " in [" << rv.min << ", " << Internal::simplify(rv.min + rv.extent - 1)
         << "]\n";
  for (const auto& sp : d.specializations()) line << "      specialised when " << sp.condition << "\n";
  os << without_unique_suffixes(line.str());
}

// The Func through which Halide reads an ImageParam (`k_im(x, y) = k(x, y)`).
bool is_image_wrapper(const Internal::Function& f) {
  if (f.has_update_definition() || f.values().size() != 1) return false;
  const auto* call = f.values()[0].as<Internal::Call>();
  return call && call->call_type == Internal::Call::Image;
}

// Every Func of `p` but the ImageParam wrappers, producers before consumers
// (Halide's topological order, which does not depend on the schedule): its
// pure definition, then its updates.
void print_definitions(std::ostream& os, const Pipeline& p) {
  std::vector<Internal::Function> outputs;
  for (const Func& f : p.outputs()) outputs.push_back(f.function());
  const std::map<std::string, Internal::Function> env = Internal::build_environment(outputs);
  for (const std::string& name : Internal::topological_order(outputs, env)) {
    const Internal::Function& f = env.at(name);
    if (is_image_wrapper(f)) continue;
    print_definition(os, f.name(), f.definition());
    for (const Internal::Definition& u : f.updates()) print_definition(os, f.name(), u);
  }
}

Halide::Target parse_target(const std::string& target) {
  if (target.empty() || target == "host") return get_host_target();
  if (!Halide::Target::validate_target_string(target))
    fail(Status::invalid_argument, "Halide target '" + target + "' is not a valid target string");
  return Halide::Target(target);
}

}  // namespace

void compile_kernel_object(const HalideKernelConfig& c, const std::string& object_path,
                           const std::string& header_path, const std::string& target,
                           bool with_runtime, const std::string& stmt_path, const std::string& asm_path,
                           const std::string& function_name) {
  std::lock_guard<std::recursive_mutex> lock(halide_mutex());
  try {
    Built b = build(c);
    Halide::Target t = parse_target(target);
    if (!with_runtime) t = t.with_feature(Halide::Target::NoRuntime);
    std::map<OutputFileType, std::string> outputs{{OutputFileType::object, object_path}};
    if (!header_path.empty()) outputs[OutputFileType::c_header] = header_path;
    if (!stmt_path.empty()) outputs[OutputFileType::stmt] = stmt_path;
    if (!asm_path.empty()) outputs[OutputFileType::assembly] = asm_path;
    b.pipeline.compile_to(outputs, b.args, function_name.empty() ? halide_kernel_name(c) : function_name, t);
  } catch (const Halide::Error& e) {
    fail(Status::internal, "Halide failed to compile " + halide_kernel_name(c) + ": " + e.what());
  }
}

void compile_runtime_object(const std::string& object_path, const std::string& target) {
  std::lock_guard<std::recursive_mutex> lock(halide_mutex());
  try {
    compile_standalone_runtime(object_path, parse_target(target));
  } catch (const Halide::Error& e) {
    fail(Status::internal, std::string("Halide failed to compile its runtime: ") + e.what());
  }
}

std::string host_target_string() {
  std::lock_guard<std::recursive_mutex> lock(halide_mutex());
  return get_host_target().to_string();
}

int host_vector_width() {
  std::lock_guard<std::recursive_mutex> lock(halide_mutex());
  return get_host_target().natural_vector_size<float>();
}

int target_vector_width(const std::string& target) {
  std::lock_guard<std::recursive_mutex> lock(halide_mutex());
  return parse_target(target).natural_vector_size<float>();
}

}  // namespace internal

std::string halide_version() { return RATTN_HALIDE_VERSION; }

std::string halide_fingerprint() {
  // Asked for by every kernel lookup; the host does not change.
  static const std::string fingerprint = [] {
    std::ostringstream os;
    os << "Halide " << RATTN_HALIDE_VERSION << " pipelines " << RATTN_PIPELINE_SOURCE_HASH << " target "
       << internal::host_target_string();
    return os.str();
  }();
  return fingerprint;
}

std::string describe_halide_kernel(const HalideKernelConfig& c) {
  std::lock_guard<std::recursive_mutex> lock(internal::halide_mutex());
  try {
    internal::Built b = internal::build(c);
    std::ostringstream os;
    os << "pipeline " << halide_kernel_name(c) << "\n"
       << "  kernel " << halide_kernel_kind_name(c.kind) << ", head_dim " << c.head_dim;
    if (c.kind != HalideKernelKind::merge) os << ", groups " << c.groups << ", kv " << dtype_name(c.kv_dtype);
    os << "\n  schedule: vector " << c.schedule.vector_width << ", split " << c.schedule.split
       << ", unroll " << c.schedule.unroll << ", d_tile " << c.schedule.d_tile
       << ", parallel " << (c.schedule.parallel ? 1 : 0) << "\n"
       << "  arguments:";
    for (const auto& a : b.args) os << " " << a.name;
    os << "\n definitions (X_im(...) reads argument X):\n";
    std::ostringstream definitions;
    internal::print_definitions(definitions, b.pipeline);
    os << internal::renumber_lets(definitions.str());
    os << " loop nest:\n";
    // Halide prints the loop nest to std::cerr.
    std::ostringstream nest;
    std::streambuf* old = std::cerr.rdbuf(nest.rdbuf());
    try {
      b.pipeline.print_loop_nest();
    } catch (...) {
      std::cerr.rdbuf(old);
      throw;
    }
    std::cerr.rdbuf(old);
    std::istringstream lines(nest.str());
    for (std::string line; std::getline(lines, line);) os << "  " << line << "\n";
    return os.str();
  } catch (const Halide::Error& e) {
    fail(Status::internal, "Halide failed to lower " + halide_kernel_name(c) + ": " + e.what());
  }
}

}  // namespace rattn
