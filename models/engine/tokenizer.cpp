#include "models/engine/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>
#include <string>
#include <utility>

#include "core/error.h"
#include "models/engine/gguf.h"

namespace rattn::engine {
namespace {

const std::string kSpaceMark = "\xE2\x96\x81";  // U+2581

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // invalid lead byte: treat as one byte
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> tokens, std::vector<float> scores, std::vector<int32_t> types,
                     int32_t bos_id, int32_t eos_id, int32_t unk_id, bool add_bos, bool add_space_prefix)
    : tokens_(std::move(tokens)), scores_(std::move(scores)), types_(std::move(types)),
      bos_(bos_id), eos_(eos_id), unk_(unk_id), add_bos_(add_bos), add_space_prefix_(add_space_prefix) {
  const size_t n = tokens_.size();
  if (scores_.size() != n) fail(Status::invalid_argument, "tokenizer: scores and tokens differ in length");
  if (types_.empty()) types_.assign(n, int32_t(TokenType::normal));
  if (types_.size() != n) fail(Status::invalid_argument, "tokenizer: token types and tokens differ in length");
  for (const auto& [what, id] : {std::pair<const char*, int32_t>{"bos", bos_}, {"eos", eos_}, {"unknown", unk_}})
    if (id < 0 || size_t(id) >= n)
      fail(Status::invalid_argument, std::string("tokenizer: ") + what + " token id " + std::to_string(id) +
                                         " is outside the vocabulary of " + std::to_string(n));
  index_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const auto t = TokenType(types_[i]);
    if (t == TokenType::control || t == TokenType::unused) continue;
    index_.emplace(tokens_[i], int32_t(i));  // first occurrence wins
    if (t == TokenType::user_defined && !tokens_[i].empty()) user_defined_.push_back(int32_t(i));
  }
  std::sort(user_defined_.begin(), user_defined_.end(),
            [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = index_.find(name);
    byte_ids_[b] = it == index_.end() ? -1 : it->second;
  }
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "llama")
    fail(Status::unsupported, "tokenizer model '" + model + "' is not supported (only SentencePiece 'llama')");
  const GgufArray& toks = f.get_array("tokenizer.ggml.tokens");
  std::vector<std::string> tokens;
  tokens.reserve(toks.size());
  for (const auto& v : toks) {
    auto* s = std::get_if<std::string>(&v.v);
    if (!s) fail(Status::corrupt_data, "tokenizer.ggml.tokens holds a non-string");
    tokens.push_back(*s);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  if (f.has("tokenizer.ggml.scores")) {
    const GgufArray& sc = f.get_array("tokenizer.ggml.scores");
    if (sc.size() != tokens.size()) fail(Status::corrupt_data, "tokenizer.ggml.scores has the wrong length");
    for (size_t i = 0; i < sc.size(); ++i) {
      auto* d = std::get_if<double>(&sc[i].v);
      if (!d) fail(Status::corrupt_data, "tokenizer.ggml.scores holds a non-number");
      scores[i] = float(*d);
    }
  }
  std::vector<int32_t> types;
  if (f.has("tokenizer.ggml.token_type")) {
    const GgufArray& ty = f.get_array("tokenizer.ggml.token_type");
    if (ty.size() != tokens.size()) fail(Status::corrupt_data, "tokenizer.ggml.token_type has the wrong length");
    for (const auto& v : ty) {
      if (auto* i = std::get_if<int64_t>(&v.v)) types.push_back(int32_t(*i));
      else if (auto* u = std::get_if<uint64_t>(&v.v)) types.push_back(int32_t(*u));
      else fail(Status::corrupt_data, "tokenizer.ggml.token_type holds a non-integer");
    }
  }
  // Special ids must name tokens: a corrupted one would reach the model as an embedding row.
  auto special = [&](const char* key, int64_t fallback) {
    const int64_t id = f.get_int(key, fallback);
    if (id < 0 || uint64_t(id) >= tokens.size())
      fail(Status::corrupt_data, std::string(key) + " = " + std::to_string(id) + " is outside the vocabulary of " +
                                     std::to_string(tokens.size()) + " tokens");
    return int32_t(id);
  };
  const int32_t bos = special("tokenizer.ggml.bos_token_id", 1), eos = special("tokenizer.ggml.eos_token_id", 2),
                unk = special("tokenizer.ggml.unknown_token_id", 0);
  return Tokenizer(std::move(tokens), std::move(scores), std::move(types), bos, eos, unk,
                   f.get_bool("tokenizer.ggml.add_bos_token", true),
                   f.get_bool("tokenizer.ggml.add_space_prefix", true));
}

int32_t Tokenizer::find(std::string_view piece) const {
  auto it = index_.find(std::string(piece));
  return it == index_.end() ? -1 : it->second;
}

// Greedy SentencePiece-BPE merge over the characters of one fragment.
void Tokenizer::encode_fragment(std::string_view raw, std::vector<int32_t>* out) const {
  if (raw.empty()) return;
  std::string text;
  text.reserve(raw.size() + 3);
  for (char c : raw) {
    if (c == ' ') text += kSpaceMark;
    else text += c;
  }
  struct Sym {
    size_t begin, len;
    int prev, next;
  };
  std::vector<Sym> syms;
  for (size_t i = 0; i < text.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(text[i])), text.size() - i);
    syms.push_back({i, n, int(syms.size()) - 1, int(syms.size()) + 1});
    i += n;
  }
  syms.back().next = -1;
  struct Cand {
    float score;
    int left;
    size_t len;  // combined length when queued: stale entries are skipped
    bool operator<(const Cand& o) const {
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Cand> queue;
  auto try_pair = [&](int left) {
    if (left < 0 || syms[left].next < 0) return;
    const Sym& a = syms[left];
    const Sym& b = syms[a.next];
    auto it = index_.find(text.substr(a.begin, a.len + b.len));
    if (it == index_.end()) return;
    queue.push({scores_[it->second], left, a.len + b.len});
  };
  for (int i = 0; i + 1 < int(syms.size()); ++i) try_pair(i);
  while (!queue.empty()) {
    const Cand c = queue.top();
    queue.pop();
    Sym& a = syms[c.left];
    if (a.len == 0 || a.next < 0) continue;
    Sym& b = syms[a.next];
    if (a.len + b.len != c.len) continue;  // a neighbour changed since queued
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (a.next >= 0) syms[a.next].prev = c.left;
    try_pair(a.prev);
    try_pair(c.left);
  }
  for (int i = 0; i >= 0 && i < int(syms.size()); i = syms[i].next) {
    const Sym& s = syms[i];
    auto it = index_.find(text.substr(s.begin, s.len));
    if (it != index_.end()) {
      out->push_back(it->second);
      continue;
    }
    for (size_t k = 0; k < s.len; ++k) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(text[s.begin + k])];
      out->push_back(id >= 0 ? id : unk_);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> out;
  if (add_bos && bos_ >= 0) out.push_back(bos_);
  std::string prefixed;
  if (add_space_prefix_ && !text.empty() && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  // Split on user-defined tokens (longest match), then merge the fragments.
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t match = -1;
    if (!user_defined_.empty()) {
      for (int32_t id : user_defined_) {
        const std::string& t = tokens_[id];
        if (t[0] == text[i] && text.compare(i, t.size(), t) == 0) {
          match = id;
          break;
        }
      }
    }
    if (match < 0) {
      ++i;
      continue;
    }
    encode_fragment(text.substr(start, i - start), &out);
    out.push_back(match);
    i += tokens_[match].size();
    start = i;
  }
  encode_fragment(text.substr(start), &out);
  return out;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= size()) return "";
  const auto t = TokenType(types_[id]);
  if (t == TokenType::control || t == TokenType::unused) return "";
  const std::string& s = tokens_[id];
  if (t == TokenType::byte && s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>') {
    // A file's byte token may be malformed ("<0xZZ>"): then it is plain text.
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    };
    const int hi = hex(s[3]), lo = hex(s[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, char(hi * 16 + lo));
  }
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, kSpaceMark) == 0) {
      out += ' ';
      i += 3;
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += piece(id);
  if (add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace rattn::engine
