// Kernel names, schedules from plans, and the two-level cache of compiled
// kernels: in memory (name -> loaded shared object) and on disk
// (<cache dir>/<name>-<hash>.so, written atomically). No Halide.h here.
#include "codegen/halide/kernel_cache.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <atomic>
#include <future>
#include <thread>
#include <mutex>
#include <unordered_map>

#include "codegen/halide/pipelines.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "dsl/kernel_knobs.h"
#include "core/log.h"

namespace fs = std::filesystem;

namespace rattn {

const char* halide_kernel_kind_name(HalideKernelKind k) {
  switch (k) {
    case HalideKernelKind::gathered_dot: return "gathered_dot";
    case HalideKernelKind::partial_attention: return "partial_attention";
    case HalideKernelKind::dense_attention: return "dense_attention";
    case HalideKernelKind::merge: return "merge";
  }
  return "?";
}

HalideSchedule HalideSchedule::from_kernel_map(const std::map<std::string, double>& kernel) {
  HalideSchedule s;
  auto get = [&](const char* key, auto* field) {
    auto it = kernel.find(key);
    if (it == kernel.end()) return;
    if (!std::isfinite(it->second)) fail(Status::invalid_argument, std::string("plan key ") + key + " is not finite");
    *field = static_cast<std::remove_pointer_t<decltype(field)>>(std::llround(it->second));
  };
  get("halide.vector", &s.vector_width);
  get("halide.split", &s.split);
  get("halide.unroll", &s.unroll);
  get("halide.dtile", &s.d_tile);
  get("halide.stream_vector", &s.stream_vector);
  get("halide.stream_split", &s.stream_split);
  get("halide.stream_mib", &s.stream_mib);
  int par = s.parallel ? 1 : 0;
  get("halide.parallel", &par);
  s.parallel = par != 0;
  return s;
}

HalideSchedule HalideSchedule::from_plan(const ConcretePlan& plan) { return from_kernel_map(plan.kernel); }

HalideSchedule HalideSchedule::resolved(int head_dim) const {
  HalideSchedule s = *this;
  if (s.vector_width <= 0) s.vector_width = internal::default_vector_width();
  // The bounds are the DSL's legal values of the halide.* knobs.
  const auto hi = [](const char* key) { return int(find_kernel_knob(key)->hi); };
  const auto lo = [](const char* key) { return int(find_kernel_knob(key)->lo); };
  // Largest power of two <= the request that divides head_dim.
  const auto lanes = [&](int want) {
    int w = 1;
    while (w * 2 <= std::min(want, hi("halide.vector")) && head_dim % (w * 2) == 0) w *= 2;
    return w;
  };
  s.vector_width = lanes(s.vector_width);
  s.split = std::clamp(s.split, lo("halide.split"), hi("halide.split"));
  s.unroll = std::clamp(s.unroll, lo("halide.unroll"), hi("halide.unroll"));
  s.d_tile = std::clamp(s.d_tile, 0, std::max(1, head_dim / s.vector_width));
  // Twice AVX-512's width measured faster from memory (docs/kernels.md); no
  // narrower target was measured, so it keeps its width there.
  if (s.stream_vector <= 0) s.stream_vector = s.vector_width >= 16 ? 2 * s.vector_width : s.vector_width;
  s.stream_vector = lanes(s.stream_vector);
  if (s.stream_split <= 0) s.stream_split = s.stream_vector > s.vector_width ? 4096 : s.split;
  s.stream_split = std::clamp(s.stream_split, lo("halide.split"), hi("halide.split"));
  s.stream_mib = std::clamp(s.stream_mib, lo("halide.stream_mib"), hi("halide.stream_mib"));
  return s;
}

HalideSchedule HalideSchedule::streaming() const {
  HalideSchedule s = *this;
  s.vector_width = stream_vector;
  s.split = stream_split;
  s.unroll = 0;
  s.d_tile = 0;
  return s;
}

bool HalideSchedule::has_streaming_kernel() const {
  return stream_mib > 0 && (stream_vector != vector_width || stream_split != split);
}

HalideSchedule HalideSchedule::for_groups(int groups) const {
  // About 8 accumulator vectors: the 16 AVX2 registers also hold loaded rows
  // and broadcasts (twice as many with AVX-512's 32 registers).
  HalideSchedule s = *this;
  const int budget = s.vector_width >= 16 ? 16 : 8;
  if (s.unroll == 0) s.unroll = std::max(1, budget / groups);
  if (s.d_tile == 0) s.d_tile = std::max(1, budget / groups);
  return s;
}

std::string halide_kernel_name(const HalideKernelConfig& c) {
  const HalideSchedule& s = c.schedule;
  std::string name = std::string("rattn_") + halide_kernel_kind_name(c.kind) + "_d" + std::to_string(c.head_dim);
  if (c.kind != HalideKernelKind::merge)
    name += "_g" + std::to_string(c.groups) + "_" + dtype_name(c.kv_dtype);
  name += "_v" + std::to_string(s.vector_width);
  if (c.kind == HalideKernelKind::partial_attention || c.kind == HalideKernelKind::dense_attention)
    name += "_s" + std::to_string(s.split);
  if (c.kind != HalideKernelKind::merge) name += "_u" + std::to_string(s.unroll);
  if (c.kind == HalideKernelKind::partial_attention || c.kind == HalideKernelKind::dense_attention)
    name += "_t" + std::to_string(s.d_tile) + "_par" + std::to_string(s.parallel ? 1 : 0);
  return name;
}

namespace internal {

void check_spec(const KernelSpec& spec) {
  if (spec.head_dim < 8 || spec.head_dim > 1024 || spec.head_dim % 8 != 0)
    fail(Status::unsupported, "Halide kernels: head_dim must be a multiple of 8 in [8, 1024] (got " +
                                  std::to_string(spec.head_dim) + ")");
  if (spec.group_size < 1 || spec.group_size > 64)
    fail(Status::unsupported, "Halide kernels: group_size must be in [1, 64] (got " +
                                  std::to_string(spec.group_size) + ")");
}

}  // namespace internal

std::vector<HalideKernelConfig> halide_kernel_configs(const KernelSpec& spec, const HalideSchedule& sched) {
  internal::check_spec(spec);
  const HalideSchedule s = sched.resolved(spec.head_dim);
  std::vector<HalideKernelConfig> out;
  std::vector<int> groups{1};
  if (spec.group_size != 1) groups.push_back(spec.group_size);
  for (HalideKernelKind kind : {HalideKernelKind::gathered_dot, HalideKernelKind::partial_attention,
                                HalideKernelKind::dense_attention})
    for (int g : groups) out.push_back({kind, spec.head_dim, g, spec.kv_dtype, s.for_groups(g)});
  if (s.has_streaming_kernel())
    for (int g : groups)
      out.push_back({HalideKernelKind::dense_attention, spec.head_dim, g, spec.kv_dtype,
                     s.streaming().for_groups(g), /*streaming=*/true});
  out.push_back({HalideKernelKind::merge, spec.head_dim, 1, spec.kv_dtype, s.for_groups(1)});
  return out;
}

std::vector<std::string> halide_kernel_names(const KernelSpec& spec, const HalideSchedule& s) {
  std::vector<std::string> names;
  for (const auto& c : halide_kernel_configs(spec, s)) names.push_back(halide_kernel_name(c));
  return names;
}

std::string kernel_cache_dir() {
  std::string dir;
  if (const char* e = std::getenv("RATTN_CACHE_DIR"); e && *e) dir = e;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = std::string(x) + "/rattn";
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::string(h) + "/.cache/rattn";
  else dir = fs::temp_directory_path().string() + "/rattn-cache";
  return dir;
}

namespace internal {
namespace {

constexpr const char* kScratchPrefix = ".tmp-";

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Runs `cmd` through the shell with its stdout and stderr captured: the
// output goes to the library's log (a warning on success; on failure at
// `failure_level`, lower for a failure that is retried), never straight to
// the process's stderr.
void run_command(const std::string& cmd, const std::string& what, LogLevel failure_level = LogLevel::error) {
  std::FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) fail(Status::internal, what + ": cannot run the command (" + std::strerror(errno) + "): " + cmd);
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int rc = ::pclose(pipe);
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
  if (rc == 0) {
    if (!output.empty()) log_message(LogLevel::warn, what + ": " + output);
    return;
  }
  const std::string status = rc < 0                ? std::string("could not be waited for")
                             : WIFEXITED(rc)       ? "exit status " + std::to_string(WEXITSTATUS(rc))
                             : WIFSIGNALED(rc)     ? "killed by signal " + std::to_string(WTERMSIG(rc))
                                                   : "status " + std::to_string(rc);
  log_message(failure_level, what + " failed (" + status + "): " + cmd +
                                   (output.empty() ? std::string() : "\n" + output));
  // The message carries the output's end (the whole of it is in the log).
  constexpr size_t kTail = 2000;
  std::string tail = output.size() > kTail ? "..." + output.substr(output.size() - kTail) : output;
  fail(Status::internal, what + " failed (" + status + "): " + cmd + (tail.empty() ? std::string() : ": " + tail));
}

std::string compiler() {
  if (const char* e = std::getenv("RATTN_CXX"); e && *e) return e;
  return "c++";
}

std::string hex16(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// A private scratch directory under `parent`, removed when this goes out of
// scope (on success and on every error). Named .tmp-<pid>-XXXXXX so that the
// ones a killed process leaves behind can be found (remove_stale_scratch).
struct ScratchDir {
  std::string path;
  explicit ScratchDir(const std::string& parent) {
    std::string tmpl = parent + "/" + kScratchPrefix + std::to_string(::getpid()) + "-XXXXXX";
    if (!mkdtemp(tmpl.data()))
      fail(Status::io_error, "cannot create a scratch directory in " + parent + ": " + std::strerror(errno));
    path = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

struct CacheState {
  std::mutex mu;
  // By file key; a shared_future so that concurrent requests for one kernel
  // wait for a single build.
  std::unordered_map<std::string, std::shared_future<std::shared_ptr<const LoadedKernel>>> loaded;
  std::mutex runtime_mu;  // one runtime object build at a time
  HalideCacheStats stats;
};

CacheState& cache() {
  static CacheState* c = new CacheState;  // never destroyed: kernels may run during exit
  return *c;
}

std::shared_ptr<const LoadedKernel> open_kernel(const std::string& path, const std::string& name,
                                                std::string* error) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    *error = dlerror();
    return nullptr;
  }
  auto fn = reinterpret_cast<KernelEntry>(dlsym(h, (name + "_argv").c_str()));
  if (!fn) {
    *error = "symbol " + name + "_argv missing";
    dlclose(h);
    return nullptr;
  }
  auto k = std::make_shared<LoadedKernel>();
  k->name = name;
  k->path = path;
  k->entry = fn;
  return k;
}

// The pid in a scratch name: ".tmp-<pid>-XXXXXX" (a directory) or
// "<file>.tmp.<pid>.<n>.<random>" (write_file_atomic's temporary); 0 if none.
pid_t scratch_owner(const std::string& name) {
  auto digits = [&](size_t from) -> pid_t {
    size_t end = from;
    while (end < name.size() && end - from < 9 && name[end] >= '0' && name[end] <= '9') ++end;
    if (end == from || end >= name.size() || (name[end] != '-' && name[end] != '.')) return 0;
    return pid_t(std::stol(name.substr(from, end - from)));
  };
  if (name.rfind(kScratchPrefix, 0) == 0) return digits(std::string(kScratchPrefix).size());
  if (const size_t at = name.find(".tmp."); at != std::string::npos) return digits(at + 5);
  return 0;
}

bool process_alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

}  // namespace

int remove_stale_scratch(const std::string& dir) {
  using namespace std::chrono;
  // A build takes seconds: a younger entry may belong to a process in another
  // pid namespace sharing the cache, an older one of a live pid to a reused pid.
  constexpr auto kMinAge = minutes(10);
  constexpr auto kMaxAge = hours(24);
  int removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool scratch_dir = name.rfind(kScratchPrefix, 0) == 0;
    if (!scratch_dir && name.find(".tmp.") == std::string::npos) continue;
    std::error_code e2;
    const auto written = fs::last_write_time(it->path(), e2);
    if (e2) continue;
    const auto age = now - written;
    if (age < kMinAge) continue;
    const pid_t owner = scratch_owner(name);
    if (age < kMaxAge && owner > 0 && process_alive(owner)) continue;
    if (fs::remove_all(it->path(), e2) > 0 && !e2) ++removed;
  }
  if (removed > 0)
    log_message(LogLevel::info, "Halide kernel cache: removed " + std::to_string(removed) +
                                    " scratch entr" + (removed == 1 ? "y" : "ies") + " of dead builds in " + dir);
  return removed;
}

// Written at build time by rattn_halide_runtime_gen (embedded_runtime.cpp).
extern const char kEmbeddedHalideRuntimeTarget[];
extern const std::size_t kEmbeddedHalideRuntimeSize;
extern const unsigned char kEmbeddedHalideRuntime[];

namespace {

// The host target string starts with the embedded runtime's "arch-bits-os".
bool embedded_runtime_matches_host() {
  const std::string host = host_target_string();
  const std::string base = kEmbeddedHalideRuntimeTarget;
  return host.compare(0, base.size(), base) == 0 && (host.size() == base.size() || host[base.size()] == '-');
}

// The Halide runtime for the host, compiled once and cached next to the
// kernels (<cache dir>/halide_runtime-<hash>.o). Every kernel's shared object
// links its own copy, so kernels compile without it (it dominates compile time).
std::string runtime_object(const std::string& dir) {
  std::lock_guard<std::mutex> lock(cache().runtime_mu);
  const std::string salt = halide_fingerprint() + "|runtime";
  const std::string path = dir + "/halide_runtime-" + hex16(fnv1a64(salt.data(), salt.size())) + ".o";
  if (fs::exists(path)) return path;
  // The copy compiled into this library at build time (same architecture
  // and OS; the runtime uses no CPU features), else compile one now.
  if (kEmbeddedHalideRuntimeSize > 0 && embedded_runtime_matches_host()) {
    write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(kEmbeddedHalideRuntime),
                                             kEmbeddedHalideRuntimeSize));
    return path;
  }
  ScratchDir scratch(dir);
  const std::string obj = scratch.path + "/runtime.o";
  compile_runtime_object(obj, "host");
  write_file_atomic(path, read_file(obj));
  return path;
}

// Compiles `c` and links it into `final_path` (atomically).
void build_shared_object(const HalideKernelConfig& c, const std::string& dir, const std::string& final_path) {
  // The kernel first: while one thread builds the (shared) runtime object,
  // the others compile their kernels instead of waiting for it.
  const auto t0 = std::chrono::steady_clock::now();
  ScratchDir scratch(dir);
  const std::string obj = scratch.path + "/kernel.o", so = scratch.path + "/kernel.so";
  compile_kernel_object(c, obj, "", "host", /*with_runtime=*/false);
  const auto t1 = std::chrono::steady_clock::now();
  std::string runtime = runtime_object(dir);
  const auto t2 = std::chrono::steady_clock::now();
  // -Bsymbolic: the kernel's copy of the Halide runtime binds to itself, never
  // to runtime symbols exported by libHalide or another kernel.
  auto link = [&](LogLevel failure_level) {
    run_command(compiler() + " -shared -o " + shell_quote(so) + " " + shell_quote(obj) + " " +
                    shell_quote(runtime) + " -Wl,-Bsymbolic -lpthread -ldl -lm",
                "linking kernel " + halide_kernel_name(c), failure_level);
  };
  try {
    link(LogLevel::info);  // retried below
  } catch (const Error&) {
    // A damaged cached runtime object would fail every link: rebuild it once.
    {
      std::lock_guard<std::mutex> lock(cache().runtime_mu);
      std::error_code ec;
      fs::remove(runtime, ec);
    }
    runtime = runtime_object(dir);
    link(LogLevel::error);
  }
  write_file_atomic(final_path, read_file(so));
  if (std::getenv("RATTN_HALIDE_VERBOSE")) {
    const auto t3 = std::chrono::steady_clock::now();
    auto sec = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
    char times[160];
    std::snprintf(times, sizeof times, " (Halide %.3f s, runtime %.3f s, link %.3f s)", sec(t0, t1), sec(t1, t2),
                  sec(t2, t3));
    log_message(LogLevel::warn, "built " + halide_kernel_name(c) + times);
  }
}

}  // namespace

std::string kernel_file_key(const HalideKernelConfig& c) {
  const std::string name = halide_kernel_name(c);
  const std::string salt = halide_fingerprint() + "|pipeline v" + std::to_string(kPipelineVersion) + "|" + name;
  return name + "-" + hex16(fnv1a64(salt.data(), salt.size()));
}

namespace {

// A cheap integrity check before dlopen (which would hand back an already
// loaded object of the same path without looking at the file again).
bool looks_like_elf(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char magic[4] = {};
  const size_t got = std::fread(magic, 1, 4, f);
  std::fclose(f);
  return got == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' && magic[3] == 'F';
}

// Loads `key` from the disk cache, or builds it there. Runs without the cache lock.
// The cache directory, created if missing; the first time a process opens
// one, the scratch entries of builds killed there are removed.
std::string open_cache_dir() {
  const std::string dir = kernel_cache_dir();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    fail(Status::io_error, "Halide kernel cache: cannot create directory " + dir +
                               (ec ? " (" + ec.message() + ")" : std::string()));
  static std::mutex mu;
  static std::set<std::string> cleaned;
  std::lock_guard<std::mutex> lock(mu);
  if (cleaned.insert(dir).second) remove_stale_scratch(dir);
  return dir;
}

std::shared_ptr<const LoadedKernel> load_or_build(const HalideKernelConfig& c, const std::string& key) {
  const std::string dir = open_cache_dir();
  const std::string path = dir + "/" + key + ".so";
  const std::string name = halide_kernel_name(c);
  std::string error;
  if (fs::is_regular_file(path) && looks_like_elf(path)) {
    if (auto k = open_kernel(path, name, &error)) {
      std::lock_guard<std::mutex> lock(cache().mu);
      ++cache().stats.loaded_from_disk;
      return k;
    }
    // An unloadable file (damaged, or built for another machine) is rebuilt
    // and replaced below.
  }
  // As for the CUDA kernels: with the JIT disabled a miss is an error.
  if (const char* v = std::getenv("RATTN_DISABLE_JIT"); v && *v && std::string(v) != "0")
    fail(Status::not_found, "Halide kernel " + name + " is neither embedded nor in the cache (" + dir +
                                ") and RATTN_DISABLE_JIT is set");
  build_shared_object(c, dir, path);
  auto k = open_kernel(path, name, &error);
  if (!k) fail(Status::internal, "cannot load freshly built kernel " + path + ": " + error);
  std::lock_guard<std::mutex> lock(cache().mu);
  ++cache().stats.compiled;
  return k;
}

}  // namespace

std::shared_ptr<const LoadedKernel> get_kernel(const HalideKernelConfig& c) {
  CacheState& cs = cache();
  // A deployable library's own kernels come first: no cache, no compiler.
  if (const embedded::Kernel* e = find_embedded_kernel(halide_kernel_name(c))) {
    auto k = std::make_shared<LoadedKernel>();
    k->name = e->name;
    k->path = std::string(kEmbeddedPathPrefix) + embedded_kernel_set()->label;
    k->entry = e->entry;
    std::lock_guard<std::mutex> lock(cs.mu);
    ++cs.stats.embedded;
    return k;
  }
  const std::string key = kernel_file_key(c);
  std::shared_future<std::shared_ptr<const LoadedKernel>> pending;
  std::promise<std::shared_ptr<const LoadedKernel>> promise;
  {
    std::lock_guard<std::mutex> lock(cs.mu);
    if (auto it = cs.loaded.find(key); it != cs.loaded.end()) {
      ++cs.stats.memory_hits;
      pending = it->second;
    } else {
      cs.loaded.emplace(key, promise.get_future().share());
    }
  }
  if (pending.valid()) return pending.get();  // rethrows the builder's error
  try {
    auto k = load_or_build(c, key);
    promise.set_value(k);
    return k;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(cs.mu);
    cs.loaded.erase(key);  // a later request tries again
    throw;
  }
}

std::vector<std::shared_ptr<const LoadedKernel>> get_kernels(const std::vector<HalideKernelConfig>& configs) {
  std::vector<std::shared_ptr<const LoadedKernel>> out(configs.size());
  std::vector<std::exception_ptr> errors(configs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < configs.size();) {
      try {
        out[i] = get_kernel(configs[i]);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(configs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

}  // namespace internal

HalideCacheStats halide_cache_stats() {
  auto& cs = internal::cache();
  std::lock_guard<std::mutex> lock(cs.mu);
  return cs.stats;
}

void halide_clear_memory_cache() {
  auto& cs = internal::cache();
  std::lock_guard<std::mutex> lock(cs.mu);
  cs.loaded.clear();
}

std::vector<AotKernelObject> compile_halide_kernel_objects(const KernelSpec& spec, const HalideSchedule& s,
                                                           const std::string& out_dir, const std::string& target,
                                                           const std::string& symbol_prefix) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir)) fail(Status::io_error, "AOT: cannot create directory " + out_dir);
  std::vector<AotKernelObject> out;
  for (const auto& c : halide_kernel_configs(spec, s)) {
    AotKernelObject k;
    k.name = halide_kernel_name(c);
    k.symbol = symbol_prefix + k.name;
    k.object = out_dir + "/" + k.symbol + ".o";
    internal::compile_kernel_object(c, k.object, "", target, /*with_runtime=*/false, "", "", k.symbol);
    out.push_back(std::move(k));
  }
  return out;
}

std::string halide_host_target() { return internal::host_target_string(); }

int halide_target_vector_width(const std::string& target) { return internal::target_vector_width(target); }

void write_halide_runtime_object(const std::string& path) {
  using namespace internal;
  if (kEmbeddedHalideRuntimeSize > 0 && embedded_runtime_matches_host()) {
    write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(kEmbeddedHalideRuntime),
                                             kEmbeddedHalideRuntimeSize));
    return;
  }
  // "arch-bits-os" of the host: the runtime uses no CPU features.
  const std::string host = host_target_string();
  size_t end = 0;
  for (int dashes = 0; end < host.size() && dashes < 3; ++end) dashes += host[end] == '-';
  const std::string base = end < host.size() ? host.substr(0, end - 1) : host;
  const std::string tmp = path + ".tmp" + std::to_string(getpid()) + ".o";
  compile_runtime_object(tmp, base);
  const std::string bytes = read_file(tmp);
  std::error_code ec;
  fs::remove(tmp, ec);
  write_file_atomic(path, bytes);
}

std::vector<std::string> compile_halide_kernels_aot(const KernelSpec& spec, const HalideSchedule& s,
                                                    const std::string& out_dir, const std::string& lib_name,
                                                    const std::string& target) {
  const auto configs = halide_kernel_configs(spec, s);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (!fs::is_directory(out_dir)) fail(Status::io_error, "AOT: cannot create directory " + out_dir);
  std::vector<std::string> files, objects;
  for (const auto& c : configs) {
    const std::string base = out_dir + "/" + halide_kernel_name(c);
    internal::compile_kernel_object(c, base + ".o", base + ".h", target, /*with_runtime=*/false);
    objects.push_back(base + ".o");
    files.push_back(base + ".h");
  }
  const std::string runtime = out_dir + "/" + lib_name + "_halide_runtime.o";
  internal::compile_runtime_object(runtime, target);
  objects.push_back(runtime);
  // Archive into a temp name, then rename: readers never see a partial library.
  const std::string lib = out_dir + "/lib" + lib_name + ".a";
  const std::string tmp = lib + ".tmp" + std::to_string(getpid());
  fs::remove(tmp, ec);
  std::string cmd = "ar rcs " + internal::shell_quote(tmp);
  for (const auto& o : objects) cmd += " " + internal::shell_quote(o);
  try {
    internal::run_command(cmd, "archiving " + lib);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, lib, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    fail(Status::io_error, "AOT: cannot rename " + tmp + " to " + lib + ": " + why);
  }
  files.insert(files.begin(), objects.begin(), objects.end());
  files.insert(files.begin(), lib);
  return files;
}

}  // namespace rattn
