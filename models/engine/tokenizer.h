#pragma once
// SentencePiece-style tokenizer read from a GGUF vocabulary
// (tokenizer.ggml.model == "llama"): spaces become U+2581, user-defined tokens
// (newline runs, space runs, tags) are matched literally first, the rest is
// split into UTF-8 characters and adjacent pieces are merged greedily, highest
// vocabulary score first (SentencePiece BPE); characters missing from the
// vocabulary fall back to <0xNN> byte tokens.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace rattn::engine {

class GgufFile;

enum class TokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

class Tokenizer {
 public:
  // From explicit lists (used by tests); `types` may be empty (all normal).
  Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types,
            int32_t bos_id, int32_t eos_id, int32_t unk_id, bool add_bos, bool add_space_prefix);
  static Tokenizer from_gguf(const GgufFile& f);

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // control tokens dropped
  std::string piece(int32_t id) const;                         // one token's text

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  int32_t size() const { return int32_t(tokens_.size()); }
  int32_t find(std::string_view piece) const;  // -1 if absent

 private:
  void encode_fragment(std::string_view text, std::vector<int32_t>* out) const;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> index_;
  std::vector<int32_t> user_defined_;  // ids, longest text first
  int32_t byte_ids_[256];
  int32_t bos_, eos_, unk_;
  bool add_bos_, add_space_prefix_;
};

}  // namespace rattn::engine
