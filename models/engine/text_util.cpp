#include "models/engine/text_util.h"

#include <cstdlib>

#include "core/atomic_file.h"
#include "core/error.h"
#include "models/engine/gemma.h"

namespace rattn::engine {

std::string read_text_file(const std::string& path) { return read_file(path); }

std::string resolve_gguf_path(const std::string& arg, const char* command) {
  if (!arg.empty()) return arg;
  const char* env = std::getenv("RATTN_GEMMA_GGUF");
  if (env && *env) return env;
  usage_fail(std::string("rattn ") + command +
             ": error: --gguf FILE is required (or set RATTN_GEMMA_GGUF; scripts/get-gemma installs the model and prints its path)");
}

std::vector<int32_t> tokenize_prefix(const GemmaModel& model, const std::string& text, int64_t tokens,
                                     const std::string& what) {
  size_t bytes = size_t(tokens) * 6 + 4096;
  for (;;) {
    size_t cut = std::min(bytes, text.size());
    // Cut at a line end so no word or UTF-8 character is split.
    if (cut < text.size()) {
      const size_t nl = text.rfind('\n', cut);
      if (nl != std::string::npos && nl > cut / 2) cut = nl + 1;
    }
    std::vector<int32_t> ids = model.tokenizer().encode(std::string_view(text).substr(0, cut), model.tokenizer().add_bos());
    if (int64_t(ids.size()) >= tokens) {
      ids.resize(size_t(tokens));
      return ids;
    }
    if (cut >= text.size())
      fail(Status::invalid_argument, what + " has only " + std::to_string(ids.size()) + " tokens, fewer than the " +
                                         std::to_string(tokens) + " asked for");
    bytes *= 2;
  }
}

}  // namespace rattn::engine
