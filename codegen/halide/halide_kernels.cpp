// The Halide kernel set behind CpuKernels: argument checks, halide_buffer_t
// descriptors on the stack, calls into the compiled kernels. No Halide.h.
#include <HalideRuntime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "codegen/halide/halide_kernels.h"
#include "codegen/halide/kernel_cache.h"
#include "codegen/halide/pipelines.h"
#include "core/error.h"

namespace rattn {
namespace {

constexpr int kMaxDims = 3;

// A halide_buffer_t describing caller memory (dense, innermost first).
struct BufferArg {
  halide_buffer_t buf{};
  halide_dimension_t dims[kMaxDims]{};
  BufferArg(const void* data, halide_type_t type, std::initializer_list<int64_t> extents) {
    buf.host = static_cast<uint8_t*>(const_cast<void*>(data));
    buf.type = type;
    buf.dimensions = int(extents.size());
    buf.dim = dims;
    int64_t stride = 1;
    int d = 0;
    for (int64_t e : extents) {
      dims[d].min = 0;
      dims[d].extent = int32_t(e);
      dims[d].stride = int32_t(stride);
      stride *= e;
      ++d;
    }
  }
};

halide_type_t storage_type(DType t) {
  switch (t) {
    case DType::f32: return halide_type_t(halide_type_float, 32);
    case DType::f16:  // both 16-bit types travel as uint16 (see pipelines.cpp)
    case DType::bf16: return halide_type_t(halide_type_uint, 16);
  }
  return halide_type_t(halide_type_float, 32);
}

const halide_type_t kF32(halide_type_float, 32), kI32(halide_type_int, 32);
constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();

class HalideKernelSet final : public HalideKernels {
 public:
  HalideKernelSet(const KernelSpec& spec, const HalideSchedule& sched) : spec_(spec) {
    internal::check_spec(spec);
    schedule_ = sched.resolved(spec.head_dim);
    const auto configs = halide_kernel_configs(spec, schedule_);
    const auto kernels = internal::get_kernels(configs);
    embedded_ = true;
    for (const auto& k : kernels)
      embedded_ = embedded_ && k->path.rfind(internal::kEmbeddedPathPrefix, 0) == 0;
    for (size_t i = 0; i < configs.size(); ++i) {
      const auto& c = configs[i];
      const auto& k = kernels[i];
      const bool one = c.groups == 1;
      switch (c.kind) {
        case HalideKernelKind::gathered_dot: (one ? dot1_ : dotg_) = k; break;
        case HalideKernelKind::partial_attention: (one ? part1_ : partg_) = k; break;
        case HalideKernelKind::dense_attention:
          if (c.streaming)
            (one ? stream1_ : streamg_) = k;
          else
            (one ? dense1_ : denseg_) = k;
          break;
        case HalideKernelKind::merge: merge_ = k; break;
      }
    }
    if (spec.group_size == 1) dotg_ = dot1_, partg_ = part1_, denseg_ = dense1_, streamg_ = stream1_;
    if (schedule_.has_streaming_kernel()) {
      const int64_t row_bytes = int64_t(spec.head_dim) * int64_t(dtype_size(spec.kv_dtype));
      stream_from_rows_ = std::max<int64_t>(1, (int64_t(schedule_.stream_mib) << 20) / (2 * row_bytes));
    }
  }

  const KernelSpec& spec() const override { return spec_; }
  const HalideSchedule& schedule() const override { return schedule_; }
  bool embedded() const override { return embedded_; }
  const std::string& dense_kernel_name(int groups, int64_t rows) const override {
    return dense_kernel(groups, rows).name;
  }

  void gathered_dot(const float* queries, int groups, const RowsView& keys, const int32_t* ids, int n,
                    float* scores) override {
    const auto& k = pick(groups, dot1_, dotg_, "gathered_dot");
    check_rows(keys, "gathered_dot", "keys");
    if (n < 0) fail(Status::invalid_argument, "gathered_dot: negative id count");
    if (n == 0) return;
    BufferArg q(queries, kF32, {spec_.head_dim, groups});
    BufferArg kb(keys.data, storage_type(keys.dtype), {keys.dim, keys.rows});
    BufferArg ib(ids, kI32, {n});
    BufferArg sb(scores, kF32, {n, groups});
    void* args[] = {&q.buf, &kb.buf, &ib.buf, &sb.buf};
    call(k, args);
  }

  void partial_attention(const float* queries, int groups, const RowsView& keys, const RowsView& values,
                         const int32_t* ids, int n, float* out, float* lse) override {
    const auto& k = pick(groups, part1_, partg_, "partial_attention");
    check_kv(keys, values, "partial_attention");
    if (n < 0) fail(Status::invalid_argument, "partial_attention: negative id count");
    if (n == 0) return empty(groups, out, lse);
    int32_t block = block_size(n, schedule_.split);
    BufferArg q(queries, kF32, {spec_.head_dim, groups});
    BufferArg kb(keys.data, storage_type(keys.dtype), {keys.dim, keys.rows});
    BufferArg vb(values.data, storage_type(values.dtype), {values.dim, values.rows});
    BufferArg ib(ids, kI32, {n});
    BufferArg ob(out, kF32, {spec_.head_dim, groups});
    BufferArg lb(lse, kF32, {groups});
    void* args[] = {&q.buf, &kb.buf, &vb.buf, &ib.buf, &block, &ob.buf, &lb.buf};
    call(k, args);
  }

  void dense_attention(const float* queries, int groups, const RowsView& keys, const RowsView& values,
                       int64_t begin, int64_t end, float* out, float* lse) override {
    check_kv(keys, values, "dense_attention");
    if (begin < 0 || end < begin || end > keys.rows)
      fail(Status::invalid_argument, "dense_attention: rows [" + std::to_string(begin) + ", " +
                                         std::to_string(end) + ") outside [0, " + std::to_string(keys.rows) + ")");
    const int64_t n = end - begin;
    const auto& k = dense_kernel(groups, n);
    if (n == 0) return empty(groups, out, lse);
    int32_t block = block_size(n, streams(n) ? schedule_.stream_split : schedule_.split);
    BufferArg q(queries, kF32, {spec_.head_dim, groups});
    BufferArg kb(keys.row(begin), storage_type(keys.dtype), {keys.dim, n});
    BufferArg vb(values.row(begin), storage_type(values.dtype), {values.dim, n});
    BufferArg ob(out, kF32, {spec_.head_dim, groups});
    BufferArg lb(lse, kF32, {groups});
    void* args[] = {&q.buf, &kb.buf, &vb.buf, &block, &ob.buf, &lb.buf};
    call(k, args);
  }

  void merge_ln(const float* o_parts, const float* lse_parts, int parts, int heads, float* out,
                float* lse_out) override {
    if (parts < 0 || heads < 0) fail(Status::invalid_argument, "merge_ln: negative parts or heads");
    if (heads == 0) return;
    if (parts == 0) return empty(heads, out, lse_out);
    if (int64_t(parts) * heads * spec_.head_dim > kMaxElements)
      fail(Status::unsupported, "merge_ln: more than 2^31 elements");
    BufferArg ob(o_parts, kF32, {spec_.head_dim, heads, parts});
    BufferArg lb(lse_parts, kF32, {heads, parts});
    BufferArg oo(out, kF32, {spec_.head_dim, heads});
    BufferArg lo(lse_out, kF32, {heads});
    void* args[] = {&ob.buf, &lb.buf, &oo.buf, &lo.buf};
    call(*merge_, args);
    for (int h = 0; h < heads; ++h)
      if (lse_out[h] <= internal::kEmptyLse) lse_out[h] = -std::numeric_limits<float>::infinity();
  }

 private:
  using Kernel = std::shared_ptr<const internal::LoadedKernel>;

  const internal::LoadedKernel& pick(int groups, const Kernel& one, const Kernel& group, const char* what) const {
    if (groups == 1) return *one;
    if (groups == spec_.group_size) return *group;
    fail(Status::invalid_argument, std::string(what) + ": groups must be 1 or the group size " +
                                       std::to_string(spec_.group_size) + " (got " + std::to_string(groups) + ")");
  }

  bool streams(int64_t rows) const { return stream_from_rows_ > 0 && rows >= stream_from_rows_; }

  const internal::LoadedKernel& dense_kernel(int groups, int64_t rows) const {
    return streams(rows) ? pick(groups, stream1_, streamg_, "dense_attention")
                         : pick(groups, dense1_, denseg_, "dense_attention");
  }

  void check_rows(const RowsView& r, const char* what, const char* which) const {
    if (r.dtype != spec_.kv_dtype || r.dim != spec_.head_dim)
      fail(Status::invalid_argument, std::string(what) + ": " + which + " are " + dtype_name(r.dtype) + " x " +
                                         std::to_string(r.dim) + ", kernels were built for " +
                                         dtype_name(spec_.kv_dtype) + " x " + std::to_string(spec_.head_dim));
    if (r.rows < 0 || r.rows * r.dim > kMaxElements)
      fail(Status::unsupported, std::string(what) + ": more than 2^31 elements in one row store");
    if (r.rows > 0 && !r.data) fail(Status::invalid_argument, std::string(what) + ": null row data");
  }

  void check_kv(const RowsView& k, const RowsView& v, const char* what) const {
    check_rows(k, what, "keys");
    check_rows(v, what, "values");
    if (k.rows != v.rows) fail(Status::invalid_argument, std::string(what) + ": keys and values differ in rows");
  }

  // Blocks of at most `split` tokens, as even as possible.
  static int32_t block_size(int64_t n, int64_t split) {
    const int64_t blocks = (n + split - 1) / split;
    return int32_t((n + blocks - 1) / blocks);
  }

  void empty(int groups, float* out, float* lse) const {
    std::memset(out, 0, sizeof(float) * size_t(groups) * size_t(spec_.head_dim));
    for (int g = 0; g < groups; ++g) lse[g] = -std::numeric_limits<float>::infinity();
  }

  static void call(const internal::LoadedKernel& k, void** args) {
    const int rc = k.entry(args);
    if (rc != 0) fail(Status::internal, "Halide kernel " + k.name + " failed with status " + std::to_string(rc));
  }

  KernelSpec spec_;
  HalideSchedule schedule_;
  bool embedded_ = false;
  Kernel dot1_, dotg_, part1_, partg_, dense1_, denseg_, stream1_, streamg_, merge_;
  int64_t stream_from_rows_ = 0;  // dense ranges of this many rows and more stream; 0 = none do
};

}  // namespace

std::unique_ptr<HalideKernels> make_halide_kernel_set(const KernelSpec& spec, const HalideSchedule& s) {
  return std::make_unique<HalideKernelSet>(spec, s);
}

std::unique_ptr<CpuKernels> make_halide_kernels(const KernelSpec& spec, const HalideSchedule& s) {
  return make_halide_kernel_set(spec, s);
}

}  // namespace rattn
