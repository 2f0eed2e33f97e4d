#include "codegen/cuda/nvrtc_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace rattn::cuda {

namespace {

constexpr char kMagic[8] = {'R', 'A', 'T', 'T', 'N', 'C', 'U', '1'};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// NVRTC is opened at run time, as the driver is: librattn.so then loads on a
// machine without the CUDA toolkit, and only a JIT compile needs it.
struct NvrtcApi {
  decltype(&::nvrtcVersion) Version = nullptr;
  decltype(&::nvrtcGetErrorString) GetErrorString = nullptr;
  decltype(&::nvrtcCreateProgram) CreateProgram = nullptr;
  decltype(&::nvrtcDestroyProgram) DestroyProgram = nullptr;
  decltype(&::nvrtcCompileProgram) CompileProgram = nullptr;
  decltype(&::nvrtcGetProgramLogSize) GetProgramLogSize = nullptr;
  decltype(&::nvrtcGetProgramLog) GetProgramLog = nullptr;
  decltype(&::nvrtcGetPTXSize) GetPTXSize = nullptr;
  decltype(&::nvrtcGetPTX) GetPTX = nullptr;
  decltype(&::nvrtcGetCUBINSize) GetCUBINSize = nullptr;
  decltype(&::nvrtcGetCUBIN) GetCUBIN = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

NvrtcApi load_nvrtc() {
  NvrtcApi api;
  // The toolkit's soname first, then the library the build found, then any.
  void* lib = nullptr;
  std::string tried;
  for (const char* path : {RATTN_NVRTC_SONAME, RATTN_NVRTC_PATH, "libnvrtc.so"}) {
    lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    const char* why = dlerror();
    tried += std::string("\n  ") + path + ": " + (why ? why : "not found");
  }
  if (!lib) {
    api.error = "cannot load the NVRTC library (CUDA toolkit); tried:" + tried;
    return api;
  }
  const auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn && api.error.empty()) api.error = std::string("the NVRTC library lacks ") + name;
  };
  sym(api.Version, "nvrtcVersion");
  sym(api.GetErrorString, "nvrtcGetErrorString");
  sym(api.CreateProgram, "nvrtcCreateProgram");
  sym(api.DestroyProgram, "nvrtcDestroyProgram");
  sym(api.CompileProgram, "nvrtcCompileProgram");
  sym(api.GetProgramLogSize, "nvrtcGetProgramLogSize");
  sym(api.GetProgramLog, "nvrtcGetProgramLog");
  sym(api.GetPTXSize, "nvrtcGetPTXSize");
  sym(api.GetPTX, "nvrtcGetPTX");
  sym(api.GetCUBINSize, "nvrtcGetCUBINSize");
  sym(api.GetCUBIN, "nvrtcGetCUBIN");
  return api;  // the library stays open for the process's lifetime
}

// Throws Error(unsupported) when NVRTC cannot be loaded.
const NvrtcApi& nvrtc() {
  static const NvrtcApi api = load_nvrtc();
  if (!api.error.empty()) fail(Status::unsupported, "nvrtc: " + api.error);
  return api;
}

std::vector<std::string> nvrtc_options(const CompileOptions& o) {
  std::vector<std::string> v = {"--gpu-architecture=" + o.arch, "-std=c++17", "-default-device"};
  v.insert(v.end(), o.extra_flags.begin(), o.extra_flags.end());
  return v;
}

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS)
    fail(Status::internal, std::string("nvrtc: ") + what + ": " + nvrtc().GetErrorString(r));
}

void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

std::string serialize(const CompiledModule& m) {
  std::string payload = m.ptx + m.cubin;
  std::string s(kMagic, 8);
  put_u64(s, m.ptx.size());
  put_u64(s, m.cubin.size());
  put_u64(s, fnv1a64(payload.data(), payload.size()));
  return s + payload;
}

bool deserialize(const std::string& s, CompiledModule* m) {
  if (s.size() < 32 || std::memcmp(s.data(), kMagic, 8) != 0) return false;
  const uint64_t np = get_u64(s, 8), nc = get_u64(s, 16), sum = get_u64(s, 24);
  if (np > s.size() || nc > s.size() || 32 + np + nc != s.size()) return false;
  if (fnv1a64(s.data() + 32, np + nc) != sum) return false;
  m->ptx = s.substr(32, np);
  m->cubin = s.substr(32 + np, nc);
  return true;
}

// flock-held lock file: released on close or process death.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail(Status::io_error, path + ": cannot open lock file: " + std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd_);
      fail(Status::io_error, path + ": flock failed: " + std::strerror(e));
    }
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtc().Version(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

bool jit_disabled() {
  const char* v = std::getenv("RATTN_DISABLE_JIT");
  return v && *v && std::strcmp(v, "0") != 0;
}

CompiledModule nvrtc_compile(const std::string& name, const std::string& source,
                             const CompileOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog;
  check_nvrtc(nvrtc().CreateProgram(&prog, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram* p;
    ~Destroy() { nvrtc().DestroyProgram(p); }
  } destroy{&prog};
  const auto opts = nvrtc_options(options);
  std::vector<const char*> argv;
  for (const auto& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtc().CompileProgram(prog, int(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtc().GetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    if (n) nvrtc().GetProgramLog(prog, log.data());
    if (r == NVRTC_ERROR_INVALID_OPTION)
      fail(Status::invalid_argument, "nvrtc: " + name + ": invalid option (arch '" + options.arch +
                                         "'?): " + log);
    fail(Status::invalid_argument, "nvrtc: " + name + " does not compile for " + options.arch +
                                       ":\n" + log);
  }
  CompiledModule m;
  m.name = name;
  m.arch = options.arch;
  size_t n = 0;
  check_nvrtc(nvrtc().GetPTXSize(prog, &n), "nvrtcGetPTXSize");
  m.ptx.resize(n);
  check_nvrtc(nvrtc().GetPTX(prog, m.ptx.data()), "nvrtcGetPTX");
  while (!m.ptx.empty() && m.ptx.back() == '\0') m.ptx.pop_back();
  check_nvrtc(nvrtc().GetCUBINSize(prog, &n), "nvrtcGetCUBINSize");
  m.cubin.resize(n);
  if (n) check_nvrtc(nvrtc().GetCUBIN(prog, m.cubin.data()), "nvrtcGetCUBIN");
  if (m.cubin.size() < 4 || m.cubin.compare(0, 4, "\x7f" "ELF") != 0)
    fail(Status::internal, "nvrtc: " + name + ": no CUBIN produced for " + options.arch);
  m.seconds = seconds_since(t0);
  return m;
}

std::string KernelCache::default_dir() {
  if (const char* d = std::getenv("RATTN_CUDA_CACHE"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/rattn/cuda";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/rattn/cuda";
  return "/tmp/rattn-cuda-cache";
}

KernelCache::KernelCache(std::string dir) : dir_(dir.empty() ? default_dir() : std::move(dir)) {}

std::string KernelCache::entry_path(const std::string& name, const std::string& source,
                                    const CompileOptions& options) const {
  uint64_t h = fnv1a64(source.data(), source.size());
  for (const auto& o : nvrtc_options(options)) h = fnv1a64(o.data(), o.size() + 1, h);
  const std::string v = nvrtc_version();
  h = fnv1a64(v.data(), v.size(), h);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return dir_ + "/" + name + "/" + hex + "." + options.arch + ".bin";
}

bool KernelCache::lookup(const std::string& name, const std::string& source,
                         const CompileOptions& options, CompiledModule* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string path = entry_path(name, source, options);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  std::string bytes;
  try {
    bytes = read_file(path);
  } catch (const Error&) {
    return false;
  }
  CompiledModule m;
  if (!deserialize(bytes, &m)) return false;  // corrupt: recompiled and replaced
  m.name = name;
  m.arch = options.arch;
  m.from_cache = true;
  m.cache_path = path;
  m.seconds = seconds_since(t0);
  *out = std::move(m);
  return true;
}

CompiledModule KernelCache::get_or_compile(const std::string& name, const std::string& source,
                                           const CompileOptions& options) {
  CompiledModule m;
  if (lookup(name, source, options, &m)) return m;
  const std::string path = entry_path(name, source, options);
  if (jit_disabled())
    fail(Status::not_found, "cuda kernel cache: " + name + " for " + options.arch +
                                " is not in " + dir_ + " (expected " + path +
                                ") and RATTN_DISABLE_JIT is set");
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) fail(Status::io_error, "cuda kernel cache: cannot create " + dir_ + ": " + ec.message());
  const auto t0 = std::chrono::steady_clock::now();
  FileLock lock(path.substr(0, path.size() - 4) + ".lock");
  if (lookup(name, source, options, &m)) {  // another process built it meanwhile
    m.seconds = seconds_since(t0);
    return m;
  }
  m = nvrtc_compile(name, source, options);
  write_file_atomic(path, serialize(m));
  m.cache_path = path;
  m.seconds = seconds_since(t0);
  return m;
}

}  // namespace rattn::cuda
