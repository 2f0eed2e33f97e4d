// Every models/*.ra parses and has the published shape of its model.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "dsl/dsl.h"

namespace {

namespace fs = std::filesystem;

std::string models_dir() { return std::string(RATTN_SOURCE_DIR) + "/models"; }

struct Shape {
  int layers, q_heads, kv_heads, head_dim, group, global_layers;
  int64_t context;
  double rope_global;
};

// The shapes of the published models, with the configs' rope_theta and max_position_embeddings.
const std::map<std::string, Shape> kShapes = {
    {"llama3-8b-262k.ra", {32, 32, 8, 128, 4, 32, 262144, 283461213}},
    {"yi-6b-200k.ra", {32, 32, 4, 128, 8, 32, 200000, 5e6}},
    {"yi-9b-200k.ra", {48, 32, 4, 128, 8, 48, 262144, 1e7}},
    {"llama3-70b.ra", {80, 64, 8, 128, 8, 80, 8192, 5e5}},
    {"qwen2.5-7b.ra", {28, 28, 4, 128, 7, 28, 32768, 1e6}},
    {"qwen3-14b.ra", {40, 40, 8, 128, 5, 40, 40960, 1e6}},
    {"gemma3-270m.ra", {18, 4, 1, 256, 4, 3, 32768, 1e6}},
    {"glm4-9b.ra", {40, 32, 2, 128, 16, 40, 131072, 5e6}},
};

TEST(DslModels, EveryFileParsesAndIsListed) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(models_dir())) {
    if (e.path().extension() != ".ra") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    const rattn::Program p = rattn::load_program(e.path().string());
    EXPECT_EQ(kShapes.count(e.path().filename().string()), 1u) << "add the new model's shape to this test";
    EXPECT_EQ(p.model.source.rfind("https://", 0), 0u) << "each model names its source";
    EXPECT_EQ(int(p.model.layers.size()), p.model.num_layers);
    // The paper's plan by default.
    const auto c = rattn::default_concrete_plan(p.plan);
    EXPECT_EQ(c.sinks, 128);
    EXPECT_EQ(c.window, 512);
    EXPECT_EQ(c.top_k, 100);
  }
  EXPECT_EQ(n, int(kShapes.size()));
}

TEST(DslModels, PublishedShapes) {
  for (const auto& [file, s] : kShapes) {
    SCOPED_TRACE(file);
    const rattn::Program p = rattn::load_program(models_dir() + "/" + file);
    EXPECT_EQ(p.model.num_layers, s.layers);
    EXPECT_EQ(p.model.num_q_heads, s.q_heads);
    EXPECT_EQ(p.model.num_kv_heads, s.kv_heads);
    EXPECT_EQ(p.model.head_dim, s.head_dim);
    EXPECT_EQ(p.model.group_size(), s.group);
    EXPECT_EQ(p.model.num_global_layers(), s.global_layers);
    EXPECT_EQ(p.model.max_context, s.context);
    EXPECT_EQ(p.model.rope_base_global, s.rope_global);
  }
}

TEST(DslModels, Gemma3HasFiveLocalLayersPerGlobalLayer) {
  const rattn::Program p = rattn::load_program(models_dir() + "/gemma3-270m.ra");
  ASSERT_EQ(p.model.layers.size(), 18u);
  for (int i = 0; i < 18; ++i) {
    const auto& l = p.model.layers[size_t(i)];
    SCOPED_TRACE(i);
    if (i % 6 == 5) {
      EXPECT_TRUE(l.global);
      EXPECT_EQ(l.rope_base, 1e6);
    } else {
      EXPECT_FALSE(l.global);
      EXPECT_EQ(l.sliding_window, 512);
      EXPECT_EQ(l.rope_base, 1e4);
    }
  }
  EXPECT_FALSE(p.target.has_gpu());
}

TEST(DslModels, DefaultModelTargetsAGpu) {
  const rattn::Program p = rattn::load_program(models_dir() + "/llama3-8b-262k.ra");
  EXPECT_EQ(p.model.name, "Llama-3-8B-Instruct-262k");
  EXPECT_EQ(p.model.kv_dtype, rattn::DType::f16);
  EXPECT_EQ(p.target.gpu_arch, "sm_90");
}

}  // namespace
