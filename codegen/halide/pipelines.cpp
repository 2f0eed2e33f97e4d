// The Halide pipelines: algorithms first, schedules second, both specialised
// from a HalideKernelConfig. The only translation unit of rattn that includes
// Halide.h.
#include <Halide.h>

#include <iostream>
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

struct Built {
  Pipeline pipeline;
  std::vector<Argument> args;
  std::string stages;  // one line per stage: what it computes and how it is scheduled
};

Built build_gathered_dot(const HalideKernelConfig& c) {
  const int D = c.head_dim, G = c.groups;
  const HalideSchedule& s = c.schedule;
  const int W = s.vector_width, U = s.unroll;
  ImageParam q(Float(32), 2, "q"), k(storage_type(c.kv_dtype), 2, "k"), ids(Int(32), 1, "ids");
  constrain_rows(k, D);
  q.dim(0).set_bounds(0, D).set_stride(1);
  q.dim(1).set_bounds(0, G).set_stride(D);
  ids.dim(0).set_min(0).set_stride(1);

  Var l("l"), i("i"), g("g");
  Expr n = ids.dim(0).extent();
  // Clamped twice: padded tokens of the last unrolled group stay in bounds,
  // and a bad id cannot read outside the key rows.
  Expr row = clamp(ids(clamp(i, 0, n - 1)), 0, k.dim(1).extent() - 1);
  RDom r(0, D / W, "r");
  Func lanes("lanes");
  lanes(l, i, g) = 0.0f;
  Func qs("q_scaled");  // q * raw_scale: undoes widen_raw's scaling
  qs(l, g) = q(l, g) * raw_scale(c.kv_dtype);
  lanes(l, i, g) += qs(r * W + l, g) * widen_raw(c.kv_dtype, k(r * W + l, row));
  std::vector<Expr> terms;
  for (int x = 0; x < W; ++x) terms.push_back(lanes(x, i, g));
  Func scores("scores");
  scores(i, g) = tree_sum(terms, 0, terms.size());

  // Schedule: U tokens x G heads per iteration; every key vector loaded once
  // and used by the G heads; W-lane accumulators in registers.
  Var io("io"), ii("ii");
  scores.output_buffer().dim(0).set_min(0);
  scores.output_buffer().dim(1).set_bounds(0, G);
  scores.bound(g, 0, G);
  // ShiftInwards keeps the lanes tile a constant size (stack, registers); it
  // needs n >= U, fewer tokens go one at a time.
  scores.specialize(n >= U).split(i, io, ii, U, TailStrategy::ShiftInwards).reorder(ii, g, io).unroll(ii).unroll(g);
  scores.split(i, io, ii, 1).reorder(ii, g, io).unroll(g);
  lanes.compute_at(scores, io).vectorize(l).unroll(i).unroll(g);
  lanes.update().reorder(l, g, i, r).vectorize(l).unroll(g).unroll(i);
  qs.compute_root().vectorize(l, W);

  Built b{Pipeline(scores), {q, k, ids}, ""};
  std::ostringstream os;
  os << "  lanes(l, i, g) = sum_r q(r*" << W << "+l, g) * widen(k(r*" << W << "+l, ids[i]))"
     << "   [computed per " << U << " tokens; l vectorised x" << W << ", tokens and heads unrolled]\n"
     << "  scores(i, g) = sum_l lanes(l, i, g)   [output; tokens split by " << U
     << " (GuardWithIf), serial]\n";
  b.stages = os.str();
  return b;
}

Built build_attention(const HalideKernelConfig& c, bool gathered) {
  const int D = c.head_dim, G = c.groups;
  const HalideSchedule& s = c.schedule;
  const int W = s.vector_width, U = s.unroll, T = s.d_tile;
  const Type st = storage_type(c.kv_dtype);
  ImageParam q(Float(32), 2, "q"), k(st, 2, "k"), v(st, 2, "v"), ids(Int(32), 1, "ids");
  Param<int> block("block");
  constrain_rows(k, D);
  constrain_rows(v, D);
  q.dim(0).set_bounds(0, D).set_stride(1);
  q.dim(1).set_bounds(0, G).set_stride(D);
  ids.dim(0).set_min(0).set_stride(1);

  const float scale = 1.0f / std::sqrt(float(D));
  const Expr lowest = Expr(-std::numeric_limits<float>::max());  // finite stand-in for -inf (fast math)
  Expr n = gathered ? ids.dim(0).extent() : k.dim(1).extent();
  Expr blocks = (n + block - 1) / block;
  auto token_row = [&](const Expr& tok, ImageParam& kv) {
    Expr t = clamp(tok, 0, n - 1);
    return gathered ? clamp(ids(t), 0, kv.dim(1).extent() - 1) : t;
  };

  Var l("l"), i("i"), g("g"), b("b"), j("j");
  // 1. Scores of the tokens of block b.
  RDom r(0, D / W, "r");
  Func lanes("lanes");
  lanes(l, i, g, b) = 0.0f;
  Func qs("q_scaled");  // q * raw_scale, folded scale of widen_raw
  qs(j, g) = q(j, g) * raw_scale(c.kv_dtype);
  lanes(l, i, g, b) += qs(r * W + l, g) * widen_raw(c.kv_dtype, k(r * W + l, token_row(b * block + i, k)));
  std::vector<Expr> terms;
  for (int x = 0; x < W; ++x) terms.push_back(lanes(x, i, g, b));
  Func score("score");
  // Tokens past n (the last block's tail) are clamped duplicates, masked
  // below; masking here would let bounds inference shrink the lanes tile to
  // a variable size.
  score(i, g, b) = tree_sum(terms, 0, terms.size()) * scale;
  auto valid = [&](const Expr& i_in_block) { return b * block + i_in_block < n; };
  // 2. Per block: max, exp, sum of exp, exp-weighted sum of value rows.
  RDom ri(0, block, "ri");
  Func bmax("block_max");
  bmax(g, b) = lowest;
  bmax(g, b) = max(bmax(g, b), select(valid(ri), score(ri, g, b), lowest));
  Func prob("prob");
  prob(i, g, b) = select(valid(i), exp(score(i, g, b) - bmax(g, b)), 0.0f);
  Func bsum("block_sum");
  bsum(g, b) = 0.0f;
  bsum(g, b) += prob(ri, g, b);
  Func acc("acc"), bout("block_out");
  acc(j, g, b) = 0.0f;
  Func prob_scaled("prob_scaled");  // prob * raw_scale, folded scale of widen_raw
  prob_scaled(i, g, b) = prob(i, g, b) * raw_scale(c.kv_dtype);
  acc(j, g, b) += prob_scaled(ri, g, b) * widen_raw(c.kv_dtype, v(j, token_row(b * block + ri, v)));
  bout(j, g, b) = acc(j, g, b);
  // 3. Merge of the blocks by their log-sum-exp (every block holds >= 1 token).
  RDom rb(0, blocks, "rb");
  Func gmax("max");
  gmax(g) = lowest;
  gmax(g) = max(gmax(g), bmax(g, rb));
  Func weight("weight");
  weight(g, b) = exp(bmax(g, b) - gmax(g));
  Func total("total");
  total(g) = 0.0f;
  total(g) += weight(g, rb) * bsum(g, rb);
  Func num("num");
  num(j, g) = 0.0f;
  num(j, g) += weight(g, rb) * bout(j, g, rb);
  Func out("out"), lse("lse");
  out(j, g) = num(j, g) / total(g);
  lse(g) = gmax(g) + log(total(g));

  // Schedule. Blocks are independent: with `parallel`, the block loops of the
  // heavy stages run on the thread pool when there are >= 2 blocks.
  out.output_buffer().dim(0).set_bounds(0, D).set_stride(1);
  out.output_buffer().dim(1).set_bounds(0, G).set_stride(D);
  lse.output_buffer().dim(0).set_bounds(0, G);
  out.bound(j, 0, D).bound(g, 0, G);
  lse.bound(g, 0, G);
  Var io("io"), ii("ii"), jo("jo"), ji("ji");
  Expr many = blocks >= 2;
  // Scores: U tokens x G heads per iteration, key vector shared by the heads.
  // RoundUp: the last group's extra tokens are clamped duplicates, and the
  // lanes tile keeps a constant size (stack, registers).
  score.compute_root().split(i, io, ii, U, TailStrategy::RoundUp).reorder(ii, g, io, b).unroll(ii).unroll(g);
  lanes.compute_at(score, io).vectorize(l).unroll(i).unroll(g);
  lanes.update().reorder(l, g, i, r).vectorize(l).unroll(g).unroll(i);
  bmax.compute_root();
  bmax.update().reorder(g, ri, b).unroll(g);
  prob.compute_root().vectorize(i, W, TailStrategy::GuardWithIf);
  qs.compute_root().vectorize(j, W);
  prob_scaled.compute_root().vectorize(i, W, TailStrategy::GuardWithIf);
  bsum.compute_root();
  bsum.update().reorder(g, ri, b).unroll(g);
  // Weighted values: T vectors of o x G heads stay in registers while the
  // block's tokens stream by.
  const int jt = std::min(D, W * T);
  bout.compute_root().split(j, jo, ji, jt).reorder(ji, g, jo, b).vectorize(ji, W).unroll(ji).unroll(g);
  acc.compute_at(bout, jo).vectorize(j, W).unroll(j).unroll(g);
  acc.update().reorder(j, g, ri).vectorize(j, W).unroll(j).unroll(g);
  if (s.parallel) {
    score.specialize(many).parallel(b);
    bout.specialize(many).parallel(b);
  }
  gmax.compute_root();
  weight.compute_root();
  total.compute_root();
  num.compute_root().vectorize(j, W);
  num.update().reorder(j, g, rb).vectorize(j, W);
  out.vectorize(j, W);

  Built bt;
  bt.pipeline = Pipeline({out, lse});
  bt.args = gathered ? std::vector<Argument>{q, k, v, ids, block} : std::vector<Argument>{q, k, v, block};
  std::ostringstream os;
  const char* rows = gathered ? "ids[b*block+i]" : "b*block+i";
  os << "  lanes(l, i, g, b) = sum_r q(r*" << W << "+l, g) * widen(k(r*" << W << "+l, " << rows
     << "))   [per " << U << " tokens; l vectorised x" << W << ", tokens and heads unrolled]\n"
     << "  score(i, g, b) = (sum_l lanes) / sqrt(" << D << ")   [root; " << (s.parallel ? "blocks parallel" : "serial") << "]\n"
     << "  block_max(g, b) = max_i score;  prob = exp(score - block_max);  block_sum(g, b) = sum_i prob   [root]\n"
     << "  block_out(j, g, b) = sum_i prob * widen(v(j, " << rows << "))   [root; j tiles of " << jt
     << " (vectorised x" << W << ", unrolled) x heads unrolled in registers, tokens inner; "
     << (s.parallel ? "blocks parallel" : "serial") << "]\n"
     << "  max(g) = max_b block_max;  weight = exp(block_max - max);  total(g) = sum_b weight*block_sum\n"
     << "  out(j, g) = sum_b weight*block_out / total;  lse(g) = max + log(total)   [natural log]\n";
  bt.stages = os.str();
  return bt;
}

Built build_merge(const HalideKernelConfig& c) {
  const int D = c.head_dim, W = c.schedule.vector_width;
  ImageParam op(Float(32), 3, "o_parts"), lp(Float(32), 2, "lse_parts");
  op.dim(0).set_bounds(0, D).set_stride(1);
  op.dim(1).set_min(0).set_stride(D);
  op.dim(2).set_min(0);
  lp.dim(0).set_min(0).set_stride(1);
  lp.dim(1).set_min(0);
  const Expr lowest = Expr(-std::numeric_limits<float>::max());
  Var j("j"), h("h"), p("p");
  RDom rp(0, lp.dim(1).extent(), "rp");
  // Parts with lse below the sentinel (i.e. -inf) are empty: weight 0.
  Expr empty_part = lp(h, p) <= kEmptyLse;
  Func gmax("max");
  gmax(h) = lowest;
  gmax(h) = max(gmax(h), select(lp(h, rp) <= kEmptyLse, lowest, lp(h, rp)));
  Func weight("weight");
  weight(h, p) = select(empty_part, 0.0f, exp(lp(h, p) - gmax(h)));
  Func total("total");
  total(h) = 0.0f;
  total(h) += weight(h, rp);
  Func num("num");
  num(j, h) = 0.0f;
  num(j, h) += weight(h, rp) * op(j, h, rp);
  Func out("out"), lse("lse");
  out(j, h) = select(total(h) > 0.0f, num(j, h) / total(h), 0.0f);
  lse(h) = select(total(h) > 0.0f, gmax(h) + log(total(h)), kEmptyLse);

  out.output_buffer().dim(0).set_bounds(0, D).set_stride(1);
  out.output_buffer().dim(1).set_min(0).set_stride(D);
  lse.output_buffer().dim(0).set_min(0);
  gmax.compute_root();
  weight.compute_root();
  total.compute_root();
  num.compute_at(out, h).vectorize(j, W);
  num.update().reorder(j, rp).vectorize(j, W);
  out.vectorize(j, W);

  Built bt{Pipeline({out, lse}), {op, lp}, ""};
  bt.stages =
      "  max(h) = max_p lse_parts(h, p)   [empty parts (lse = -inf) skipped]\n"
      "  weight(h, p) = exp(lse_parts - max);  total(h) = sum_p weight   [root]\n"
      "  out(j, h) = sum_p weight*o_parts / total   [per head; j vectorised]\n"
      "  lse(h) = max + log(total)   [natural log; -inf when every part is empty]\n";
  return bt;
}

Built build(const HalideKernelConfig& c) {
  switch (c.kind) {
    case HalideKernelKind::gathered_dot: return build_gathered_dot(c);
    case HalideKernelKind::partial_attention: return build_attention(c, true);
    case HalideKernelKind::dense_attention: return build_attention(c, false);
    case HalideKernelKind::merge: return build_merge(c);
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
    os << "\n stages:\n" << b.stages << " loop nest:\n";
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
