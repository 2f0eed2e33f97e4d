// rattn eval (placeholder body while the forward pass is checked).
#include <cstdio>
#include <string>

#include "core/error.h"
#include "models/engine/gemma.h"
#include "models/engine/matmul.h"
#include "models/engine/text_util.h"
#include "tools/rattn/commands.h"

namespace rattn::cli {

int eval_main(int argc, char** argv) {
  std::string gguf, prompt;
  int steps = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--gguf" && i + 1 < argc) gguf = argv[++i];
    else if (a == "--prompt" && i + 1 < argc) prompt = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
  }
  gguf = engine::resolve_gguf_path(gguf, "eval");
  engine::set_engine_threads(2);
  auto model = engine::GemmaModel::load(gguf);
  auto ids = model->tokenizer().encode(prompt, true);
  for (auto id : ids) std::printf("%d[%s] ", id, model->tokenizer().piece(id).c_str());
  std::printf("\n");
  engine::GemmaSession s(*model, int64_t(ids.size()) + steps + 1);
  std::vector<float> h = s.prefill(ids, {int64_t(ids.size()) - 1});
  std::vector<float> logits(size_t(model->config().vocab));
  model->output_head(h.data(), 1, logits.data());
  std::string out;
  for (int t = 0; t < steps; ++t) {
    int32_t best = 0;
    for (int64_t j = 1; j < model->config().vocab; ++j)
      if (logits[size_t(j)] > logits[size_t(best)]) best = int32_t(j);
    out += model->tokenizer().piece(best);
    std::printf("%d ", best);
    logits = s.decode(best);
  }
  std::printf("\n%s|%s\n", prompt.c_str(), out.c_str());
  return 0;
}

}  // namespace rattn::cli
