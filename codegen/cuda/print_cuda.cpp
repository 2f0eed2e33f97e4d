#include "codegen/cuda/print_cuda.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace rattn::cuda {

namespace {

const char* kHelpers = R"(#ifndef RATTN_DECODE_HELPERS
#define RATTN_DECODE_HELPERS
// NVRTC has no <math.h>: -inf from its bit pattern.
#define RATTN_NEG_INF __int_as_float(0xff800000)
#define RATTN_FULL_MASK 0xffffffffu
// fp16 bits -> fp32, exact for normals and subnormals: move the fields into an
// fp32 pattern and rebias the exponent by multiplying with 2^112.
static __device__ __forceinline__ float rattn_f16_to_float(unsigned short h) {
  const unsigned int mag = (unsigned int)(h & 0x7fffu);
  float f = __uint_as_float(mag << 13) * __uint_as_float(0x77800000u);
  if (mag >= 0x7c00u) f = __uint_as_float(0x7f800000u | (mag << 13));
  return __uint_as_float(__float_as_uint(f) | ((unsigned int)(h & 0x8000u) << 16));
}
static __device__ __forceinline__ float rattn_bf16_to_float(unsigned short h) {
  return __uint_as_float((unsigned int)h << 16);
}
// Global -> shared copy of BYTES (4, 8 or 16): cp.async on sm_80+, else a plain
// vector copy (also what the host SIMT emulation runs).
template <int BYTES>
static __device__ __forceinline__ void rattn_cp_async(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(BYTES));
#else
  if (BYTES == 16) *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  else if (BYTES == 8) *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src);
  else *reinterpret_cast<unsigned int*>(dst) = *reinterpret_cast<const unsigned int*>(src);
#endif
}
static __device__ __forceinline__ void rattn_cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
static __device__ __forceinline__ void rattn_cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
extern __shared__ float4 rattn_smem[];
#endif  // RATTN_DECODE_HELPERS
)";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
}

std::string fmt_float(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9gf", v);
  return buf;
}

class Printer {
 public:
  Printer(const KernelModule& m, const KernelDef& k) : m_(m), k_(k) {}

  std::string run() {
    if (k_.role == KernelRole::partial) partial_prelude();
    else merge_prelude();
    stmt(k_.body, 1);
    os_ << "}\n";
    return os_.str();
  }

 private:
  // Emits a multi-line snippet at `indent`, with $CVT etc. substituted.
  void block(std::string text, int indent) {
    replace_all(text, "$CVT",
                m_.params.kv_dtype == DType::bf16 ? "rattn_bf16_to_float" : "rattn_f16_to_float");
    const std::string pad(size_t(indent) * 2, ' ');
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      os_ << (line.empty() || line[0] == '#' ? "" : pad) << line << '\n';
  }

  void partial_prelude() {
    const auto& p = m_.params;
    const auto& t = m_.mapping;
    os_ << "// Partial attention of " << t.heads_per_block << " of the " << p.group_size
        << " query heads of a KV head (grid.z) over one split of the static set.\n";
    os_ << "extern \"C\" __global__ void __launch_bounds__(" << t.block_threads << ")\n"
        << k_.name << "(const float* __restrict__ q, const unsigned short* __restrict__ k_cache,\n"
        << "    const unsigned short* __restrict__ v_cache, const int* __restrict__ page_table,\n"
        << "    long long head_stride, int n_sinks, int n_window, long long window_begin,\n"
        << "    float* __restrict__ o_out, float* __restrict__ lse_out) {\n";
    std::ostringstream c;
    c << "constexpr int D = " << p.head_dim << ", G = " << p.group_size << ", TILE = " << p.tile
      << ", THREADS = " << t.block_threads << ";\n"
      << "constexpr int SPLITS = " << p.splits << ", VEC = " << p.vec << ", STAGES = " << p.stages
      << ";\n"
      << "constexpr int LANES = " << t.lanes_per_token << ", CHUNKS = " << t.chunks_per_lane
      << ", SLOTS = " << t.slots_per_warp << ", PASS = " << t.tokens_per_pass
      << ", PER_SLOT = " << t.tokens_per_slot << ";\n";
    if (p.layout == KvLayout::paged) c << "constexpr int PAGE = " << p.page_size << ";\n";
    c << "constexpr int HG = " << t.heads_per_block << ";  // query heads of the group in this block\n";
    block(c.str(), 1);
    block(R"(const int split = blockIdx.x;
const int head = blockIdx.y;
const int g0 = blockIdx.z * HG;  // this block's first query head of the group
const int tid = threadIdx.x;
const int lane = tid & 31;
const int warp = tid >> 5;
const int sub = lane % LANES;                 // lane within the token's lane group
const int slot = warp * SLOTS + lane / LANES;  // token slot within a block pass
// This split's tokens: a tile-aligned share of the static set.
const int n = n_sinks + n_window;
const int per_split = ((n + SPLITS - 1) / SPLITS + TILE - 1) / TILE * TILE;
const int begin = split * per_split;
const int end = n < begin + per_split ? n : begin + per_split;
const int num_tiles = end > begin ? (end - begin + TILE - 1) / TILE : 0;
unsigned char* const smem = reinterpret_cast<unsigned char*>(rattn_smem);
)",
          1);
    for (const auto& b : k_.shared)
      os_ << "  " << b.elem << "* const " << b.name << " = reinterpret_cast<" << b.elem
          << "*>(smem + " << b.offset_bytes << ");  // [" << b.count << "]\n";
    bool staged = false;
    visit(k_.body, [&](const Stmt& s) {
      staged |= s.kind == Stmt::Kind::op &&
                (s.op == OpKind::stage_tile || s.op == OpKind::stage_prologue);
    });
    if (staged) {
      std::string row = p.layout == KvLayout::paged
                            ? "const long long row = (long long)page_table[(long long)head * "
                              "head_stride + pos / PAGE] * PAGE + pos % PAGE;"
                            : "const long long row = (long long)head * head_stride + pos;";
      std::string s = R"(// Copies tile t of this split into buffer buf; rows past the end are zeros.
auto stage_tile = [&](int t, int buf) {
  const int tile_begin = begin + t * TILE;
  unsigned short* const ks = k_tiles + buf * (TILE * D);
  unsigned short* const vs = v_tiles + buf * (TILE * D);
  for (int c = tid; c < TILE * (D / VEC); c += THREADS) {
    const int r = c / (D / VEC);
    const int col = (c % (D / VEC)) * VEC;
    const int tok = tile_begin + r;
    if (tok < end) {
      const long long pos = tok < n_sinks ? (long long)tok : window_begin + (tok - n_sinks);
      $ROW
      rattn_cp_async<VEC * 2>(ks + r * D + col, k_cache + row * D + col);
      rattn_cp_async<VEC * 2>(vs + r * D + col, v_cache + row * D + col);
    } else {
      for (int e = 0; e < VEC; ++e) {
        ks[r * D + col + e] = 0;
        vs[r * D + col + e] = 0;
      }
    }
  }
};
)";
      replace_all(s, "$ROW", row);
      block(s, 1);
    }
  }

  void merge_prelude() {
    const auto& p = m_.params;
    os_ << "// Merges the splits' (o, lse) by natural-log log-sum-exp.\n";
    os_ << "extern \"C\" __global__ void __launch_bounds__(" << k_.block_threads << ")\n"
        << k_.name
        << "(const float* __restrict__ o_ws, const float* __restrict__ lse_ws,\n"
        << "    float* __restrict__ o_out, float* __restrict__ lse_out) {\n";
    std::ostringstream c;
    c << "constexpr int D = " << p.head_dim << ", G = " << p.group_size << ", SPLITS = " << p.splits
      << ";\n";
    block(c.str(), 1);
    block("const int head = blockIdx.y;\n", 1);
  }

  void stmt(const Stmt& s, int indent) {
    switch (s.kind) {
      case Stmt::Kind::seq:
        for (const auto& c : s.body) stmt(c, indent);
        return;
      case Stmt::Kind::loop: loop(s, indent); return;
      case Stmt::Kind::op: op(s, indent); return;
    }
  }

  void loop(const Stmt& s, int indent) {
    const std::string pad(size_t(indent) * 2, ' ');
    if (s.var == "tile") {
      os_ << pad << "for (int tile = 0; tile < num_tiles; ++tile) {\n";
      block(R"(const int tile_begin = begin + tile * TILE;
const unsigned short* const kt = k_tiles + (tile % STAGES) * (TILE * D);
const unsigned short* const vt = v_tiles + (tile % STAGES) * (TILE * D);
)",
            indent + 1);
    } else if (s.var == "j") {
      const bool has_scores = !s.body.empty() && s.body[0].kind == Stmt::Kind::op &&
                              s.body[0].op == OpKind::scores;
      if (has_scores) os_ << pad << "float s[PER_SLOT][HG];  // log2-scaled scores\n";
      os_ << "#pragma unroll\n" << pad << "for (int j = 0; j < PER_SLOT; ++j) {\n";
    } else if (s.var == "i" && s.loop_kind == LoopKind::threads) {
      os_ << pad << "for (int i = threadIdx.x; i < G * D; i += blockDim.x) {\n";
    } else {
      fail(Status::internal, "print_cuda: unexpected loop '" + s.var + "'");
    }
    for (const auto& c : s.body) stmt(c, indent + 1);
    os_ << pad << "}\n";
  }

  void op(const Stmt& s, int indent) {
    os_ << std::string(size_t(indent) * 2, ' ') << "// " << op_kind_name(s.op) << '\n';
    switch (s.op) {
      case OpKind::load_queries: {
        const double scale = 1.0 / std::sqrt(double(m_.params.head_dim)) / std::log(2.0);
        block("const float q_scale = " + fmt_float(scale) + R"(;  // log2(e) / sqrt(D)
float qr[HG][CHUNKS * VEC];
#pragma unroll
for (int g = 0; g < HG; ++g)
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      qr[g][c * VEC + e] = q[((long long)head * G + g0 + g) * D + (c * LANES + sub) * VEC + e] * q_scale;
)",
              indent);
        return;
      }
      case OpKind::init_state:
        block(R"(float m_run[HG], l_run[HG], acc[HG][CHUNKS * VEC];
#pragma unroll
for (int g = 0; g < HG; ++g) {
  m_run[g] = RATTN_NEG_INF;
  l_run[g] = 0.f;
#pragma unroll
  for (int i = 0; i < CHUNKS * VEC; ++i) acc[g][i] = 0.f;
}
)",
              indent);
        return;
      case OpKind::stage_prologue:
        block(R"(#pragma unroll
for (int t = 0; t < STAGES - 1; ++t) {
  if (t < num_tiles) stage_tile(t, t);
  rattn_cp_async_commit();
}
)",
              indent);
        return;
      case OpKind::stage_issue:
        block(R"(if (tile + STAGES - 1 < num_tiles) stage_tile(tile + STAGES - 1, (tile + STAGES - 1) % STAGES);
rattn_cp_async_commit();
)",
              indent);
        return;
      case OpKind::stage_wait: block("rattn_cp_async_wait<STAGES - 1>();\n", indent); return;
      case OpKind::stage_tile:
        block("stage_tile(tile, 0);\nrattn_cp_async_commit();\nrattn_cp_async_wait<0>();\n", indent);
        return;
      case OpKind::barrier: block("__syncthreads();\n", indent); return;
      case OpKind::scores:
        block(R"(const int r = j * PASS + slot;
const unsigned short* const krow = kt + r * D;
float dot[HG];
#pragma unroll
for (int g = 0; g < HG; ++g) dot[g] = 0.f;
#pragma unroll
for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const float kx = $CVT(krow[(c * LANES + sub) * VEC + e]);
#pragma unroll
    for (int g = 0; g < HG; ++g) dot[g] += qr[g][c * VEC + e] * kx;
  }
// The lanes of a token's group sum their parts (xor butterfly: every lane gets the sum).
#pragma unroll
for (int g = 0; g < HG; ++g)
#pragma unroll
  for (int off = LANES / 2; off > 0; off >>= 1) dot[g] += __shfl_xor_sync(RATTN_FULL_MASK, dot[g], off);
const bool valid = tile_begin + r < end;
#pragma unroll
for (int g = 0; g < HG; ++g) s[j][g] = valid ? dot[g] : RATTN_NEG_INF;
)",
              indent);
        return;
      case OpKind::online_softmax:
        block(R"(#pragma unroll
for (int g = 0; g < HG; ++g) {
  float mx = m_run[g];
#pragma unroll
  for (int j = 0; j < PER_SLOT; ++j) mx = fmaxf(mx, s[j][g]);
  // A fully masked tile keeps the state (and avoids -inf - -inf).
  const float rescale = mx == RATTN_NEG_INF ? 1.f : exp2f(m_run[g] - mx);
  m_run[g] = mx;
  l_run[g] *= rescale;
#pragma unroll
  for (int i = 0; i < CHUNKS * VEC; ++i) acc[g][i] *= rescale;
}
)",
              indent);
        return;
      case OpKind::accumulate_values:
        block(R"(const unsigned short* const vrow = vt + (j * PASS + slot) * D;
float vx[CHUNKS * VEC];
#pragma unroll
for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
  for (int e = 0; e < VEC; ++e) vx[c * VEC + e] = $CVT(vrow[(c * LANES + sub) * VEC + e]);
#pragma unroll
for (int g = 0; g < HG; ++g) {
  const float p = s[j][g] == RATTN_NEG_INF ? 0.f : exp2f(s[j][g] - m_run[g]);
  l_run[g] += p;
#pragma unroll
  for (int i = 0; i < CHUNKS * VEC; ++i) acc[g][i] += p * vx[i];
}
)",
              indent);
        return;
      case OpKind::merge_slots:
        block(R"(// Lane groups of a warp saw disjoint tokens: combine them pairwise.
#pragma unroll
for (int off = LANES; off < 32; off <<= 1) {
#pragma unroll
  for (int g = 0; g < HG; ++g) {
    const float m_o = __shfl_xor_sync(RATTN_FULL_MASK, m_run[g], off);
    const float l_o = __shfl_xor_sync(RATTN_FULL_MASK, l_run[g], off);
    const float mx = fmaxf(m_run[g], m_o);
    const float a = mx == RATTN_NEG_INF ? 0.f : exp2f(m_run[g] - mx);
    const float b = mx == RATTN_NEG_INF ? 0.f : exp2f(m_o - mx);
    l_run[g] = l_run[g] * a + l_o * b;
#pragma unroll
    for (int i = 0; i < CHUNKS * VEC; ++i)
      acc[g][i] = acc[g][i] * a + __shfl_xor_sync(RATTN_FULL_MASK, acc[g][i], off) * b;
    m_run[g] = mx;
  }
}
)",
              indent);
        return;
      case OpKind::merge_warps:
        block(R"(// Lane group 0 of each warp now holds the warp's state.
if (lane < LANES) {
#pragma unroll
  for (int g = 0; g < HG; ++g) {
    if (sub == 0) {
      warp_max[warp * HG + g] = m_run[g];
      warp_sum[warp * HG + g] = l_run[g];
    }
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        warp_acc[(warp * HG + g) * D + (c * LANES + sub) * VEC + e] = acc[g][c * VEC + e];
  }
}
__syncthreads();
)",
              indent);
        return;
      case OpKind::store_final:
      case OpKind::store_partial: {
        std::string text = R"(for (int i = tid; i < HG * D; i += THREADS) {
  const int h = i / D, x = i % D;  // h: the block's head, g: the group's
  const int g = g0 + h;
  float mx = RATTN_NEG_INF;
  for (int w = 0; w < THREADS / 32; ++w) mx = fmaxf(mx, warp_max[w * HG + h]);
  float l = 0.f, o = 0.f;
  if (mx != RATTN_NEG_INF) {
    for (int w = 0; w < THREADS / 32; ++w) {
      const float sc = exp2f(warp_max[w * HG + h] - mx);
      l += warp_sum[w * HG + h] * sc;
      o += warp_acc[(w * HG + h) * D + x] * sc;
    }
  }
  const long long at = $AT;
  o_out[at * D + x] = l > 0.f ? o / l : 0.f;
  // Natural log: the running max is in log2 units.
  if (x == 0) lse_out[at] = l > 0.f ? (mx + log2f(l)) * 0.693147181f : RATTN_NEG_INF;
}
)";
        replace_all(text, "$AT",
                    s.op == OpKind::store_final ? "(long long)head * G + g"
                                                : "((long long)head * SPLITS + split) * G + g");
        block(text, indent);
        return;
      }
      case OpKind::merge_splits:
        block(R"(const int g = i / D, x = i % D;
const long long first = (long long)head * SPLITS * G + g;  // split s at first + s * G
float mx = RATTN_NEG_INF;
for (int s = 0; s < SPLITS; ++s) mx = fmaxf(mx, lse_ws[first + (long long)s * G]);
float wsum = 0.f, o = 0.f;
if (mx != RATTN_NEG_INF) {
  for (int s = 0; s < SPLITS; ++s) {
    const float w = expf(lse_ws[first + (long long)s * G] - mx);
    wsum += w;
    o += w * o_ws[(first + (long long)s * G) * D + x];
  }
}
o_out[((long long)head * G + g) * D + x] = wsum > 0.f ? o / wsum : 0.f;
if (x == 0) lse_out[(long long)head * G + g] = wsum > 0.f ? mx + logf(wsum) : RATTN_NEG_INF;
)",
              indent);
        return;
    }
  }

  const KernelModule& m_;
  const KernelDef& k_;
  std::ostringstream os_;
};

}  // namespace

std::string print_cuda(const KernelModule& m) {
  if (m.name.empty() || !m.mapping.mapped)
    fail(Status::internal, "print_cuda: the module has not been lowered (run lower_decode_attention)");
  std::ostringstream os;
  const auto& p = m.params;
  os << "// Generated by rattn codegen/cuda: decode-time partial attention over the static set\n"
     << "// (sinks + recent window), every query head of a GQA group, fp32 accumulation,\n"
     << "// flash-decoding split along the KV length; lse in NATURAL log.\n"
     << "// module " << m.name << "\n// head_dim=" << p.head_dim << " group=" << p.group_size
     << " kv=" << dtype_name(p.kv_dtype) << " layout=" << kv_layout_name(p.layout)
     << " tile=" << p.tile << " warps=" << p.warps << " splits=" << p.splits << " vec=" << p.vec
     << " stages=" << p.stages << " arch=" << p.arch << "\n";
  os << kHelpers;
  for (const auto& k : m.kernels) os << '\n' << Printer(m, k).run();
  return os.str();
}

}  // namespace rattn::cuda
