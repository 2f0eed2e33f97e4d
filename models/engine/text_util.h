#pragma once
// Small helpers shared by the capture and eval commands.
#include <cstdint>
#include <string>
#include <vector>

namespace rattn::engine {

class GemmaModel;

// Reads a text file whole; throws Error(io_error) naming it.
std::string read_text_file(const std::string& path);
// Path of the model: the argument, else $RATTN_GEMMA_GGUF; throws when neither is set.
std::string resolve_gguf_path(const std::string& arg, const char* command);
// The first `tokens` tokens of `text` (BOS first when the model adds one),
// tokenizing only as much of the text as needed; throws Error(invalid_argument)
// naming `what` when the text is too short.
std::vector<int32_t> tokenize_prefix(const GemmaModel& model, const std::string& text, int64_t tokens,
                                     const std::string& what);

}  // namespace rattn::engine
