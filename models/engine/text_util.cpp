#include "models/engine/text_util.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace rattn::engine {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(Status::io_error, "cannot read text file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string resolve_gguf_path(const std::string& arg, const char* command) {
  if (!arg.empty()) return arg;
  const char* env = std::getenv("RATTN_GEMMA_GGUF");
  if (env && *env) return env;
  fail(Status::invalid_argument, std::string("rattn ") + command +
                                     ": error: --gguf FILE is required (or set RATTN_GEMMA_GGUF; scripts/get-gemma installs the model and prints its path)");
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace rattn::engine
