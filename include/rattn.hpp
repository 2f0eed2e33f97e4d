// rattn.hpp - a thin RAII C++ layer over rattn.h. Failures throw
// rattn::api::Exception carrying the C status and the message.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "rattn.h"

namespace rattn::api {

class Exception : public std::runtime_error {
 public:
  Exception(rattn_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  rattn_status status() const { return status_; }

 private:
  rattn_status status_;
};

inline void check(rattn_status s, const rattn_context* ctx) {
  if (s != RATTN_OK) throw Exception(s, rattn_context_last_error(ctx));
}

class Context {
 public:
  explicit Context(const rattn_context_params& params) {
    rattn_context* c = nullptr;
    check(rattn_context_create(&params, &c), nullptr);
    ctx_.reset(c);
  }
  rattn_context* get() const { return ctx_.get(); }
  rattn_context_info info() const {
    rattn_context_info i;
    check(rattn_context_get_info(get(), &i), get());
    return i;
  }

 private:
  struct Free {
    void operator()(rattn_context* c) const { rattn_context_free(c); }
  };
  std::unique_ptr<rattn_context, Free> ctx_;
};

// A sequence must not outlive its context.
class Sequence {
 public:
  explicit Sequence(const Context& ctx) : ctx_(ctx.get()) {
    rattn_sequence* s = nullptr;
    check(rattn_sequence_create(ctx_, &s), ctx_);
    seq_.reset(s);
  }
  static Sequence load(const Context& ctx, const std::string& path) {
    rattn_sequence* s = nullptr;
    check(rattn_sequence_load(ctx.get(), path.c_str(), &s), ctx.get());
    return Sequence(ctx.get(), s);
  }
  rattn_sequence* get() const { return seq_.get(); }

  void prefill(int32_t layer, int64_t n_tokens, const void* q, const void* k, const void* v,
               rattn_dtype dtype) {
    check(rattn_sequence_prefill(get(), layer, n_tokens, q, k, v, dtype), ctx_);
  }
  void decode(int32_t layer, const void* q, const void* k, const void* v, rattn_dtype dtype,
              float* out, float* lse = nullptr) {
    check(rattn_sequence_decode(get(), layer, q, k, v, dtype, out, lse), ctx_);
  }
  int64_t n_tokens(int32_t layer) const { return rattn_sequence_n_tokens(get(), layer); }
  rattn_memory_info memory() const {
    rattn_memory_info m;
    check(rattn_sequence_memory(get(), &m), ctx_);
    return m;
  }
  void save(const std::string& path) const { check(rattn_sequence_save(get(), path.c_str()), ctx_); }
  // rattn_sequence_refresh: the kept queries used.
  int64_t refresh() {
    int64_t used = 0;
    check(rattn_sequence_refresh(get(), &used), ctx_);
    return used;
  }

 private:
  Sequence(rattn_context* ctx, rattn_sequence* s) : ctx_(ctx), seq_(s) {}
  struct Free {
    void operator()(rattn_sequence* s) const { rattn_sequence_free(s); }
  };
  rattn_context* ctx_;
  std::unique_ptr<rattn_sequence, Free> seq_;
};

}  // namespace rattn::api
