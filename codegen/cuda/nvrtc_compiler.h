#pragma once
// NVRTC: CUDA text -> PTX + CUBIN for a chosen arch, no GPU needed; and the
// disk cache in front of it (FlashInfer-style: check, lock, check again,
// compile, write atomically).
#include <string>
#include <vector>

namespace rattn::cuda {

struct CompileOptions {
  std::string arch = "sm_90";            // sm_75 ... sm_120
  std::vector<std::string> extra_flags;  // appended to the NVRTC options
};

struct CompiledModule {
  std::string name;   // the module URI
  std::string arch;
  std::string ptx;    // text
  std::string cubin;  // ELF
  bool from_cache = false;
  double seconds = 0;      // compile or cache-load wall time
  std::string cache_path;  // empty when not cached
};

// Compiles with NVRTC (linked; libcuda is never needed). Throws
// Error(invalid_argument) with NVRTC's log when the text does not compile.
CompiledModule nvrtc_compile(const std::string& name, const std::string& source,
                             const CompileOptions& options);

// "major.minor" of the linked NVRTC.
std::string nvrtc_version();

// True when RATTN_DISABLE_JIT is set (to anything but "" or "0").
bool jit_disabled();

// Disk cache of compiled modules. Entry: DIR/<name>/<hash>.<arch>.bin where hash =
// fnv1a64(source, options, NVRTC version); the entry carries its own checksum.
// A lock file next to it is held with flock() while compiling (released by the
// kernel when the process dies, so it cannot go stale).
class KernelCache {
 public:
  // dir "" = $RATTN_CUDA_CACHE, else $XDG_CACHE_HOME/rattn/cuda, else ~/.cache/rattn/cuda.
  explicit KernelCache(std::string dir = "");
  const std::string& dir() const { return dir_; }
  static std::string default_dir();

  // Cached module, or compile + store. With JIT disabled a miss throws
  // Error(not_found).
  CompiledModule get_or_compile(const std::string& name, const std::string& source,
                                const CompileOptions& options);
  // Only looks; false on a miss (or a corrupt entry).
  bool lookup(const std::string& name, const std::string& source, const CompileOptions& options,
              CompiledModule* out);
  std::string entry_path(const std::string& name, const std::string& source,
                         const CompileOptions& options) const;

 private:
  std::string dir_;
};

}  // namespace rattn::cuda
