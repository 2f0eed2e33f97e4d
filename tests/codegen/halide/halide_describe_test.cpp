// describe_halide_kernel, the text of `rattn emit --target halide`: what
// Halide holds for each pipeline (the Funcs' definitions and the loop nest).
// Describing builds the pipelines but compiles nothing.
#include <gtest/gtest.h>

#include <string>

#include "codegen/halide/halide_kernels.h"

namespace rattn {
namespace {

// The text between `from` and `to` in `text` (empty when either is missing).
std::string section(const std::string& text, const std::string& from, const std::string& to) {
  const size_t a = text.find(from);
  const size_t b = a == std::string::npos ? a : text.find(to, a);
  return b == std::string::npos ? std::string() : text.substr(a + from.size(), b - a - from.size());
}

// Lines of `defs` that define `func` (its pure definition and its updates).
int definitions_of(const std::string& defs, const std::string& func) {
  int count = 0;
  for (size_t at = defs.find("\n  " + func + "("); at != std::string::npos;
       at = defs.find("\n  " + func + "(", at + 1))
    ++count;
  return count;
}

// The description is what Halide holds: every Func's definitions (named as
// in the pipeline source, producers first) and the loop nest of the schedule.
TEST(HalideDescribe, PrintsHalideDefinitionsAndLoopNest) {
  const auto configs = halide_kernel_configs({128, 4, DType::f16});
  const bool streams = HalideSchedule{}.resolved(128).has_streaming_kernel();
  ASSERT_EQ(configs.size(), streams ? 9u : 7u);
  for (const auto& c : configs) {
    const std::string text = describe_halide_kernel(c);
    SCOPED_TRACE(halide_kernel_name(c));
    EXPECT_NE(text.find("pipeline " + halide_kernel_name(c)), std::string::npos);
    const std::string defs = "\n" + section(text, "definitions (X_im(...) reads argument X):\n", " loop nest:\n");
    const size_t nest_at = text.find(" loop nest:\n");
    ASSERT_NE(nest_at, std::string::npos) << text;
    ASSERT_GT(defs.size(), 1u) << text;
    const std::string nest = text.substr(nest_at);
    EXPECT_EQ(defs.find('$'), std::string::npos) << defs;  // no uniquifying suffixes
    EXPECT_EQ(definitions_of(defs, "k_im"), 0) << defs;    // ImageParam wrappers left out
    EXPECT_NE(nest.find("for "), std::string::npos) << text;
    switch (c.kind) {
      case HalideKernelKind::gathered_dot:
        EXPECT_EQ(definitions_of(defs, "q_scaled"), 1);
        EXPECT_EQ(definitions_of(defs, "lanes"), 2);  // zero, then the sum over r
        EXPECT_EQ(definitions_of(defs, "scores"), 1);
        EXPECT_LT(defs.find("\n  lanes("), defs.find("\n  scores("));  // producers first
        // r runs over the 128 / W vectors of a key.
        EXPECT_NE(defs.find("where r in [0, " + std::to_string(128 / c.schedule.vector_width - 1) + "]"),
                  std::string::npos)
            << defs;
        EXPECT_NE(defs.find("specialised when (ids.extent.0 >= " + std::to_string(c.schedule.unroll) + ")"),
                  std::string::npos)
            << defs;
        EXPECT_NE(nest.find("produce lanes:"), std::string::npos) << nest;
        break;
      case HalideKernelKind::partial_attention:
      case HalideKernelKind::dense_attention:
        for (const char* f : {"q_scaled", "score", "prob", "prob_scaled", "block_out", "block_stats", "weight", "out",
                              "lse"})
          EXPECT_EQ(definitions_of(defs, f), 1) << f;
        for (const char* f : {"tile", "block_max", "block_sum", "acc", "max", "total", "num"})
          EXPECT_EQ(definitions_of(defs, f), 2) << f;
        // unroll x groups is a power of two: the tile's W lanes per score fold
        // in log2(W) levels of halves, the last one read by score.
        EXPECT_EQ(definitions_of(defs, "lanes"), 0) << defs;
        for (int w = c.schedule.vector_width, level = 0; w > 1; w /= 2, ++level)
          EXPECT_EQ(definitions_of(defs, "halves" + std::to_string(level)), 1) << level;
        EXPECT_NE(defs.find("(float32)acc(j, g, b), (float32)block_max(g, b), (float32)block_sum(g, b)}"),
                  std::string::npos)
            << defs;
        EXPECT_NE(defs.find("  lse(g) = ((float32)max(g) + (float32)log_f32((float32)total(g)))"), std::string::npos)
            << defs;
        EXPECT_NE(defs.find("*0.088388f)"), std::string::npos) << defs;  // 1 / sqrt(128)
        EXPECT_NE(defs.find(c.kind == HalideKernelKind::partial_attention ? "ids_im(" : "k_im(t0, "),
                  std::string::npos)
            << defs;
        EXPECT_EQ(defs.find("specialised when"), std::string::npos) << defs;  // parallel off
        EXPECT_EQ(nest.find("parallel b"), std::string::npos) << nest;
        EXPECT_NE(nest.find("produce block_out:"), std::string::npos) << nest;
        break;
      case HalideKernelKind::merge:
        EXPECT_EQ(definitions_of(defs, "weight"), 1);
        EXPECT_EQ(definitions_of(defs, "num"), 2);
        EXPECT_NE(defs.find("where rp in [0, (lse_parts.extent.1 + -1)]"), std::string::npos) << defs;
        EXPECT_NE(defs.find("  lse(h) = "), std::string::npos) << defs;
        break;
    }
    // Let names are numbered per kernel: a second description is the same.
    const std::string again = describe_halide_kernel(c);
    EXPECT_EQ(section(again, "definitions", " loop nest:\n"), section(text, "definitions", " loop nest:\n"));
  }
}

// With `parallel`, the heavy stages' block loops run on the thread pool when
// there are >= 2 blocks: the description shows both the specialisation and
// the parallel loop.
TEST(HalideDescribe, ShowsTheParallelSpecialisation) {
  HalideSchedule s;
  s.parallel = true;
  int described = 0;
  for (const auto& c : halide_kernel_configs({64, 1, DType::f32}, s)) {
    if (c.kind != HalideKernelKind::dense_attention || c.streaming) continue;
    ++described;
    const std::string text = describe_halide_kernel(c);
    const std::string defs = "\n" + section(text, "definitions", " loop nest:\n");
    size_t found = 0;
    for (size_t at = defs.find("specialised when ((((k.extent.1 + block) - 1)/block) >= 2)");
         at != std::string::npos; at = defs.find("specialised when", at + 1))
      ++found;
    EXPECT_EQ(found, 1u) << defs;  // block_out, whose block loop computes every per-block stage
    EXPECT_NE(text.find("parallel b"), std::string::npos) << text;
  }
  EXPECT_EQ(described, 1);
}

}  // namespace
}  // namespace rattn
