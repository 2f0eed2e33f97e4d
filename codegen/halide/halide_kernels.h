#pragma once
// Halide-generated CPU kernels behind kernels/cpu_kernels.h. This header does
// NOT include Halide.h: only codegen/halide/pipelines.cpp does (5 s per file).
//
// Kernels (every log-sum-exp is the NATURAL logarithm, scores scaled by
// 1/sqrt(head_dim)):
//   gathered_dot       scores of 1 query head or a whole GQA group against a
//                      list of key ids (the graph search's inner loop)
//   partial_attention  (o, lse) per query head over a list of token ids
//   dense_attention    (o, lse) per query head over rows [begin, end)
//   merge              n-way merge of (o, lse) partials
//
// Each kernel is specialised for (head dim, groups, KV dtype, schedule),
// compiled for the host CPU on first use ("JIT"), linked into a shared object
// and cached in memory and on disk (see kernel_cache_dir()).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dsl/ir.h"
#include "kernels/cpu_kernels.h"

namespace rattn {

// Schedule knobs of all Halide kernels; every one has a good default and is a
// tuning parameter. Plan keys (ConcretePlan::kernel) in brackets.
struct HalideSchedule {
  int vector_width = 0;   // fp32 lanes; 0 = natural width of the target [halide.vector]
  int split = 1024;       // tokens per block: attention runs blockwise, blocks merged by lse [halide.split]
  bool parallel = false;  // run the blocks of one call on Halide's thread pool when there are >= 2 [halide.parallel]
                          // (off by default: callers parallelise over heads, and a busy machine
                          // starves the pool's spinning workers)
  int unroll = 0;         // tokens scored per iteration of the dot-product loop; 0 = auto [halide.unroll]
  int d_tile = 0;         // vectors of o[] per head kept in registers per pass over the tokens; 0 = auto [halide.dtile]
  // Dense attention over a range whose K and V leave the caches streams from
  // memory, where wider tiles keep more loads in flight (docs/kernels.md): a
  // second dense kernel with its own vector width and split serves ranges of
  // at least stream_mib MiB of K + V.
  int stream_vector = 0;  // 0 = auto: 2 x vector_width from 16 lanes up, else vector_width [halide.stream_vector]
  int stream_split = 0;   // 0 = auto: 4096 when stream_vector is wider than vector_width, else split [halide.stream_split]
  int stream_mib = 48;    // K + V MiB from which dense attention streams; 0 = never [halide.stream_mib]

  // Defaults overridden by the "halide.*" keys of a plan's kernel map.
  static HalideSchedule from_plan(const ConcretePlan& plan);
  static HalideSchedule from_kernel_map(const std::map<std::string, double>& kernel);
  // Resolves vector_width = 0 and clamps every knob to a valid value for head
  // dim d (e.g. vector_width divides d).
  HalideSchedule resolved(int head_dim) const;
  // Fills the automatic knobs (0) for a kernel serving `groups` query heads:
  // about 8 accumulator vectors with AVX2, 16 with AVX-512.
  HalideSchedule for_groups(int groups) const;
  // The streaming dense kernel's schedule, from a resolved one (automatic
  // unroll and d_tile); built only when has_streaming_kernel().
  HalideSchedule streaming() const;
  // Whether a resolved schedule builds a streaming dense kernel of its own.
  bool has_streaming_kernel() const;
};

enum class HalideKernelKind { gathered_dot, partial_attention, dense_attention, merge };
const char* halide_kernel_kind_name(HalideKernelKind k);

// One specialisation of one kernel.
struct HalideKernelConfig {
  HalideKernelKind kind = HalideKernelKind::partial_attention;
  int head_dim = 128;
  int groups = 1;  // query heads per call (1 or the GQA group size); unused by merge
  DType kv_dtype = DType::f16;
  HalideSchedule schedule;  // resolved
  bool streaming = false;   // the dense kernel for ranges of stream_mib MiB and more
};

// Deterministic name spelling out every specialisation, e.g.
// "rattn_partial_attention_d128_g4_f16_v8_s1024_u4_t2_par1"; also the C symbol.
std::string halide_kernel_name(const HalideKernelConfig& c);
// The distinct kernels a kernel set for `spec` uses (groups 1 and group_size).
std::vector<HalideKernelConfig> halide_kernel_configs(const KernelSpec& spec, const HalideSchedule& s = {});
std::vector<std::string> halide_kernel_names(const KernelSpec& spec, const HalideSchedule& s = {});

// Kernel set: CpuKernels plus the merge and the AOT-free extras.
class HalideKernels : public CpuKernels {
 public:
  // Merges `parts` partial results (o: parts x heads x d, lse: parts x heads,
  // natural log) into out (heads x d) and lse_out (heads). Parts with
  // lse = -inf are empty; if all are, out = 0 and lse_out = -inf.
  virtual void merge_ln(const float* o_parts, const float* lse_parts, int parts, int heads,
                        float* out, float* lse_out) = 0;
  virtual const HalideSchedule& schedule() const = 0;
  // The kernel dense_attention runs for `groups` query heads over `rows` rows.
  virtual const std::string& dense_kernel_name(int groups, int64_t rows) const = 0;
  // True when every kernel of the set came from the library's embedded
  // (ahead-of-time) kernels, with no cache or compiler involved.
  virtual bool embedded() const = 0;
};

// Compiles (or loads from the caches) every kernel of `spec` and returns a
// thread-safe kernel set. Throws rattn::Error (unsupported) if the spec cannot
// be served (head_dim not a multiple of 8, group_size < 1).
std::unique_ptr<HalideKernels> make_halide_kernel_set(const KernelSpec& spec, const HalideSchedule& s = {});
std::unique_ptr<CpuKernels> make_halide_kernels(const KernelSpec& spec, const HalideSchedule& s = {});

// The embedded kernel set this process runs, e.g. "host (x86-64-linux-avx2-...)"
// or "baseline (x86-64-linux-sse41)"; "" in plain librattn or when no
// embedded set runs on this CPU (RATTN_CPU_KERNELS=auto|host|baseline|jit
// picks; docs/deploy.md).
std::string embedded_kernel_set_name();

// Where compiled kernels are cached: $RATTN_CACHE_DIR, else
// $XDG_CACHE_HOME/rattn, else ~/.cache/rattn (created on demand).
std::string kernel_cache_dir();

// Statistics of this process's kernel cache (for benchmarks and tests).
struct HalideCacheStats {
  int compiled = 0;        // built with Halide + linked
  int loaded_from_disk = 0;
  int memory_hits = 0;
  int embedded = 0;        // found in the library's embedded kernel set
};
HalideCacheStats halide_cache_stats();
// Forgets the in-memory cache (loaded objects stay mapped); next use reloads
// from disk. For tests and the warm-load benchmark.
void halide_clear_memory_cache();

// Writes the Halide runtime object for this architecture and OS (no CPU
// features: it serves every kernel set) to `path`.
void write_halide_runtime_object(const std::string& path);

// Ahead-of-time build of every kernel of `spec` for `target` ("host" or a
// Halide target string such as "x86-64-linux-avx2-f16c-fma-sse41"): writes
// into `out_dir` one object + C header per kernel, the Halide runtime object
// and a static library `lib_name`.a holding all of them. Returns the paths
// written (library first).
std::vector<std::string> compile_halide_kernels_aot(const KernelSpec& spec, const HalideSchedule& s,
                                                    const std::string& out_dir,
                                                    const std::string& lib_name = "rattn_kernels",
                                                    const std::string& target = "host");

// One kernel compiled ahead of time into an object of its own.
struct AotKernelObject {
  std::string name;    // halide_kernel_name(config)
  std::string symbol;  // its C function (NAME_argv is the generic entry point)
  std::string object;  // the object file
};
// Every kernel of `spec` for Halide target `target` (an explicit target
// string, or "host") into `out_dir`, without the Halide runtime (see
// write_halide_runtime_object), each C function named `symbol_prefix` + its
// name, so that sets for several targets link into one library.
std::vector<AotKernelObject> compile_halide_kernel_objects(const KernelSpec& spec, const HalideSchedule& s,
                                                           const std::string& out_dir, const std::string& target,
                                                           const std::string& symbol_prefix);
// Halide's target string of this CPU, e.g. "x86-64-linux-avx-avx2-f16c-fma-sse41".
std::string halide_host_target();
// The natural fp32 vector width of a Halide target string ("host" = this CPU).
int halide_target_vector_width(const std::string& target);

// Human-readable description of a kernel's pipeline, all of it as Halide
// reports it: each Func's definitions (producers first, with reduction ranges
// and specialisation conditions) and the loop nest of its schedule.
std::string describe_halide_kernel(const HalideKernelConfig& c);
// The Halide version, e.g. "14.0.0".
std::string halide_version();
// The Halide version, the pipelines' source hash and the host target string
// (part of every cache key).
std::string halide_fingerprint();

}  // namespace rattn
