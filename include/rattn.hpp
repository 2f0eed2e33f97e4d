// rattn.hpp - a thin RAII C++ layer over rattn.h. Failures throw
// rattn::api::Exception carrying the C status and the message.
#pragma once
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
  // rattn_sequence_clone: an independent copy.
  Sequence clone() const {
    rattn_sequence* s = nullptr;
    check(rattn_sequence_clone(get(), &s), ctx_);
    return Sequence(ctx_, s);
  }

  void prefill(int32_t layer, int64_t n_tokens, const void* q, const void* k, const void* v,
               rattn_dtype dtype) {
    check(rattn_sequence_prefill(get(), layer, n_tokens, q, k, v, dtype), ctx_);
  }
  void prefill_chunk(int32_t layer, int64_t n_tokens, const void* q, const void* k, const void* v,
                     rattn_dtype dtype) {
    check(rattn_sequence_prefill_chunk(get(), layer, n_tokens, q, k, v, dtype), ctx_);
  }
  void prefill_end(int32_t layer) { check(rattn_sequence_prefill_end(get(), layer), ctx_); }
  void prefill_end_async(int32_t layer) { check(rattn_sequence_prefill_end_async(get(), layer), ctx_); }
  void prefill_wait() { check(rattn_sequence_prefill_wait(get()), ctx_); }
  void decode(int32_t layer, const void* q, const void* k, const void* v, rattn_dtype dtype,
              float* out, float* lse = nullptr) {
    check(rattn_sequence_decode(get(), layer, q, k, v, dtype, out, lse), ctx_);
  }
  // rattn_sequence_decode_batch: entry i of each array is seqs[i]'s.
  static void decode_batch(const std::vector<Sequence*>& seqs, int32_t layer, const std::vector<const void*>& q,
                           const std::vector<const void*>& k, const std::vector<const void*>& v, rattn_dtype dtype,
                           const std::vector<float*>& out, const std::vector<float*>& lse = {}) {
    const size_t n = seqs.size();
    if (q.size() != n || k.size() != n || v.size() != n || out.size() != n || (!lse.empty() && lse.size() != n))
      throw Exception(RATTN_INVALID_ARGUMENT, "decode_batch: one q, k, v, out (and lse, if any) per sequence");
    std::vector<rattn_sequence*> handles(n);
    for (size_t i = 0; i < n; ++i) handles[i] = seqs[i] ? seqs[i]->get() : nullptr;
    rattn_context* ctx = n > 0 && seqs[0] ? seqs[0]->ctx_ : nullptr;
    check(rattn_sequence_decode_batch(handles.data(), int32_t(n), layer, q.data(), k.data(), v.data(), dtype,
                                      out.data(), lse.empty() ? nullptr : lse.data()),
          ctx);
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
