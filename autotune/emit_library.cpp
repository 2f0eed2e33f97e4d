// emit_deployable_library: compiles the plan's kernels (Halide ahead of time
// for two CPU targets, CUDA through NVRTC), generates the payload source,
// and links it with the runtime archives the way librattn.so is linked.
#include "autotune/emit_library.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "codegen/cuda/gpu_backend.h"
#include "codegen/cuda/lower.h"
#include "codegen/cuda/nvrtc_compiler.h"
#include "codegen/cuda/passes.h"
#include "codegen/cuda/print_cuda.h"
#include "codegen/halide/halide_kernels.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "dsl/dsl.h"
#include "rattn.h"

namespace fs = std::filesystem;

namespace rattn {
namespace {

void say(const EmitLibraryOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// The emit's progress in compiled kernels.
struct EmitProgress {
  const EmitLibraryOptions& o;
  double done = 0, total = 1;
  void add(double units, const std::string& now) {
    done += units;
    if (o.progress) o.progress(done, total, now);
  }
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// Runs a command; on failure throws with its output.
void run(const std::vector<std::string>& args, const std::string& what) {
  std::string cmd;
  for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + quote(a);
  std::FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) fail(Status::internal, what + ": cannot run " + cmd + ": " + std::strerror(errno));
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
  const int rc = ::pclose(pipe);
  if (rc == 0) return;
  // The shell's 127: the program is not there.
  const Status s = WIFEXITED(rc) && WEXITSTATUS(rc) == 127 ? Status::not_found : Status::internal;
  constexpr size_t kTail = 3000;
  if (output.size() > kTail) output = "..." + output.substr(output.size() - kTail);
  fail(s, what + " failed (" + cmd + "):\n" + output);
}

// <dir>/rattn_embed: $RATTN_LIB_DIR, else ../lib next to the running executable.
std::string embed_dir() {
  std::string lib;
  if (const char* e = std::getenv("RATTN_LIB_DIR"); e && *e) {
    lib = e;
  } else {
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) fail(Status::not_found, "emit library: cannot find the running executable (/proc/self/exe); set RATTN_LIB_DIR");
    lib = (exe.parent_path().parent_path() / "lib").string();
  }
  const std::string dir = lib + "/rattn_embed";
  for (const char* f : {"link.txt", "rattn_embedded_abi.h", "rattn.h"})
    if (!fs::is_regular_file(dir + "/" + f))
      fail(Status::not_found, "emit library: " + dir + "/" + f +
                                  " is missing: build the target rattn_lib (librattn.so) first, or point "
                                  "RATTN_LIB_DIR at the lib directory of a rattn build");
  return dir;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

// C array initialiser of `bytes` plus a terminating 0.
void write_bytes(std::ostream& os, const std::string& bytes) {
  os << "{";
  for (size_t i = 0; i < bytes.size(); ++i) os << unsigned(static_cast<unsigned char>(bytes[i])) << (i % 32 == 31 ? ",\n" : ",");
  os << "0}";
}

struct EmbeddedSet {
  std::string label, target;
  int vector_width = 0;
  std::vector<AotKernelObject> kernels;
};

struct EmbeddedGpu {
  std::string name, arch, cubin, ptx;
};

// The KV dtypes a context may store: the C API's default (fp16) and the model's own.
std::vector<DType> kv_dtypes(const ModelLayout& m) {
  std::vector<DType> out{DType::f16};
  if (m.kv_dtype != DType::f16 && m.kv_dtype != DType::f32) out.push_back(m.kv_dtype);
  return out;
}

// Static-set capacities the runtime opens GPU streams for (runtime/sequence.cpp).
std::set<int64_t> static_capacities(const ModelLayout& m, const ConcretePlan& p) {
  std::set<int64_t> caps;
  for (const LayerSpec& l : m.layers)
    caps.insert(l.global ? int64_t(p.sinks) + p.window : (l.sliding_window > 0 ? l.sliding_window : p.window));
  if (caps.empty()) caps.insert(int64_t(p.sinks) + p.window);
  return caps;
}

std::vector<EmbeddedGpu> compile_gpu(const Program& prog, const ConcretePlan& plan, const std::string& arch,
                                     const EmitLibraryOptions& o, EmitProgress& progress) {
  std::vector<EmbeddedGpu> out;
  std::set<std::string> seen;
  for (DType dt : kv_dtypes(prog.model)) {
    for (int64_t cap : static_capacities(prog.model, plan)) {
      // As the runtime lowers it (Runtime::gpu_options, open_gpu_attention).
      ModelLayout model;
      model.head_dim = prog.model.head_dim;
      model.num_kv_heads = 1;
      model.num_q_heads = prog.model.group_size();
      model.kv_dtype = dt;
      ConcretePlan p;
      p.kernel = plan.kernel;
      if (!p.kernel.count("cuda.splits")) p.kernel["cuda.splits"] = static_set_splits(cap, prog.model.num_kv_heads);
      cuda::LowerOptions lo;
      lo.arch = arch;
      cuda::KernelModule ir;
      try {
        ir = cuda::lower_decode_attention(model, p, lo);
      } catch (const Error& e) {
        // The runtime keeps such a static set on the CPU kernels.
        say(o, std::string("  GPU: no kernel for kv ") + dtype_name(dt) + " (" + e.what() + "): CPU only");
        progress.add(1, "GPU modules");
        continue;
      }
      if (!seen.insert(ir.name).second) {
        progress.add(1, "GPU modules");
        continue;
      }
      cuda::CompileOptions co;
      co.arch = arch;
      const cuda::CompiledModule m = cuda::nvrtc_compile(ir.name, cuda::print_cuda(ir), co);
      say(o, "  GPU: " + ir.name + " (CUBIN " + std::to_string(m.cubin.size()) + " B, PTX " +
                 std::to_string(m.ptx.size()) + " B)");
      out.push_back({ir.name, arch, m.cubin, m.ptx});
      progress.add(1, "GPU modules");
    }
  }
  return out;
}

std::string payload_source(const std::string& model, const std::string& plan_text,
                           const std::vector<EmbeddedSet>& sets, const std::vector<EmbeddedGpu>& gpu) {
  std::ostringstream os;
  os << "// Generated by `rattn emit --target library`: the payload of librattn_" << model << ".so.\n"
     << "#include \"rattn_embedded_abi.h\"\n\n";
  for (const auto& s : sets)
    for (const auto& k : s.kernels) os << "extern \"C\" int " << k.symbol << "_argv(void**);\n";
  os << "\nnamespace {\nusing namespace rattn::embedded;\n\n";
  os << "const char kModel[] = \"" << model << "\";\n";
  os << "const unsigned char kPlan[] = ";
  write_bytes(os, plan_text);
  os << ";\n";
  for (size_t i = 0; i < sets.size(); ++i) {
    os << "const Kernel kSet" << i << "[] = {\n";
    for (const auto& k : sets[i].kernels) os << "  {\"" << k.name << "\", &" << k.symbol << "_argv},\n";
    os << "};\n";
  }
  os << "const KernelSet kSets[] = {\n";
  for (size_t i = 0; i < sets.size(); ++i)
    os << "  {\"" << sets[i].label << "\", \"" << sets[i].target << "\", " << sets[i].vector_width << ", kSet" << i
       << ", " << sets[i].kernels.size() << "},\n";
  os << "};\n";
  for (size_t i = 0; i < gpu.size(); ++i) {
    os << "const unsigned char kCubin" << i << "[] = ";
    write_bytes(os, gpu[i].cubin);
    os << ";\nconst unsigned char kPtx" << i << "[] = ";
    write_bytes(os, gpu[i].ptx);
    os << ";\n";
  }
  os << "const GpuModule kGpu[] = {\n";
  for (size_t i = 0; i < gpu.size(); ++i)
    os << "  {\"" << gpu[i].name << "\", \"" << gpu[i].arch << "\", kCubin" << i << ", " << gpu[i].cubin.size()
       << ", reinterpret_cast<const char*>(kPtx" << i << "), " << gpu[i].ptx.size() << "},\n";
  if (gpu.empty()) os << "  {\"\", \"\", nullptr, 0, nullptr, 0},\n";
  os << "};\n";
  os << "const Payload kPayload = {kAbiVersion, kModel, reinterpret_cast<const char*>(kPlan), kSets, "
     << sets.size() << ", kGpu, " << gpu.size() << "};\n";
  os << "}  // namespace\n\n"
     << "const rattn::embedded::Payload* rattn::embedded::payload() { return &kPayload; }\n";
  return os.str();
}

// A private scratch directory, removed on every exit.
struct Scratch {
  std::string path;
  explicit Scratch(const std::string& parent) {
    std::string t = parent + "/.tmp-emit-" + std::to_string(::getpid()) + "-XXXXXX";
    if (!::mkdtemp(t.data())) fail(Status::io_error, "cannot create a scratch directory in " + parent);
    path = t;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

void write_package_files(const std::string& out, const std::string& m, EmitLibraryResult& r) {
  const std::string cmake_dir = out + "/lib/cmake/rattn_" + m, pc_dir = out + "/lib/pkgconfig";
  fs::create_directories(cmake_dir);
  fs::create_directories(pc_dir);
  const std::string t = "rattn_" + m + "::rattn_" + m;
  std::ostringstream c;
  c << "# find_package(rattn_" << m << "): the imported target " << t << "\n"
    << "# (librattn_" << m << ".so, the rattn C API with the " << m << " plan and kernels embedded).\n"
    << "get_filename_component(_rattn_prefix \"${CMAKE_CURRENT_LIST_DIR}/../../..\" ABSOLUTE)\n"
    << "if(NOT TARGET " << t << ")\n"
    << "  add_library(" << t << " SHARED IMPORTED)\n"
    << "  set_target_properties(" << t << " PROPERTIES\n"
    << "    IMPORTED_LOCATION \"${_rattn_prefix}/lib/librattn_" << m << ".so\"\n"
    << "    IMPORTED_SONAME \"librattn_" << m << ".so\"\n"
    << "    INTERFACE_INCLUDE_DIRECTORIES \"${_rattn_prefix}/include\")\n"
    << "endif()\n"
    << "set(rattn_" << m << "_FOUND TRUE)\n"
    << "unset(_rattn_prefix)\n";
  const std::string config = cmake_dir + "/rattn_" + m + "Config.cmake";
  write_file_atomic(config, c.str());
  std::ostringstream pc;
  pc << "prefix=${pcfiledir}/../..\nlibdir=${prefix}/lib\nincludedir=${prefix}/include\n\n"
     << "Name: rattn_" << m << "\n"
     << "Description: RetrievalAttention runtime (C API) with the " << m << " plan and kernels embedded\n"
     << "Version: " << rattn_version() << "\n"
     << "Libs: -L${libdir} -Wl,-rpath,${libdir} -lrattn_" << m << "\n"
     << "Cflags: -I${includedir}\n";
  const std::string pcfile = pc_dir + "/rattn_" + m + ".pc";
  write_file_atomic(pcfile, pc.str());
  r.files.push_back(config);
  r.files.push_back(pcfile);
}

}  // namespace

std::string sanitise_model_name(const std::string& name) {
  std::string out;
  bool gap = false;
  for (char ch : name) {
    const char c = (ch >= 'A' && ch <= 'Z') ? char(ch - 'A' + 'a') : ch;
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      if (gap && !out.empty()) out += '_';
      out += c;
      gap = false;
    } else {
      gap = true;
    }
  }
  return out;
}

EmitLibraryResult emit_deployable_library(const Program& prog, const std::string& plan_text,
                                          const EmitLibraryOptions& o) {
  EmitLibraryResult r;
  r.model = sanitise_model_name(o.model_name.empty() ? prog.model.name : o.model_name);
  if (r.model.empty())
    fail(Status::invalid_argument, "emit library: the model name '" + (o.model_name.empty() ? prog.model.name : o.model_name) +
                                       "' has no letters or digits; give one (--name)");
  if (o.out_dir.empty()) fail(Status::invalid_argument, "emit library: no output directory");
  const std::string arch = o.gpu_arch.empty() ? "none" : o.gpu_arch;
  if (arch != "none") {
    const auto& archs = cuda::supported_archs();
    if (std::find(archs.begin(), archs.end(), arch) == archs.end()) {
      std::string list;
      for (const auto& a : archs) list += (list.empty() ? "" : ", ") + a;
      fail(Status::invalid_argument, "emit library: GPU arch '" + arch + "' is not one of " + list + " or none");
    }
  }
  // The embedded plan must be the plan: it is parsed again where it runs.
  (void)parse_program(plan_text, "<plan text>");
  const std::string embed = embed_dir();
  const std::vector<std::string> recorded = read_lines(embed + "/link.txt");
  if (recorded.size() < 2) fail(Status::not_found, "emit library: " + embed + "/link.txt is empty; rebuild rattn_lib");

  const std::string out = fs::absolute(o.out_dir).lexically_normal().string();
  fs::create_directories(out + "/lib");
  fs::create_directories(out + "/include");
  Scratch scratch(out);
  const ConcretePlan plan = default_concrete_plan(prog.plan);
  const HalideSchedule sched = HalideSchedule::from_plan(plan);

  // Halide kernel sets: this CPU, then the portable baseline.
  std::vector<KernelSpec> specs;
  for (DType dt : kv_dtypes(prog.model)) {
    KernelSpec s;
    s.head_dim = prog.model.head_dim;
    s.group_size = prog.model.group_size();
    s.kv_dtype = dt;
    specs.push_back(s);
  }
  std::vector<std::pair<std::string, std::string>> targets{{"host", halide_host_target()},
                                                            {"baseline", o.baseline_target}};
  if (targets[0].second == targets[1].second) targets.erase(targets.begin());
  // Total: each target's kernels, a GPU module per KV dtype and static-set
  // capacity (at most), the payload and the link.
  EmitProgress progress{o};
  {
    double kernels = 0;
    for (const KernelSpec& spec : specs) kernels += double(halide_kernel_names(spec, sched).size());
    progress.total = kernels * double(targets.size()) + 2;
    if (arch != "none")
      progress.total += double(kv_dtypes(prog.model).size() * static_capacities(prog.model, plan).size());
  }
  std::vector<EmbeddedSet> sets;
  for (const auto& [label, target] : targets) {
    EmbeddedSet set{label, target, halide_target_vector_width(target), {}};
    HalideSchedule s = sched;
    if (s.vector_width <= 0) s.vector_width = set.vector_width;  // as the runtime resolves it there
    std::set<std::string> names;
    for (const KernelSpec& spec : specs) {
      progress.add(0, "CPU kernels for the " + label + " set");
      std::vector<AotKernelObject> compiled =
          compile_halide_kernel_objects(spec, s, scratch.path + "/" + label, target, "rattn_" + label + "_");
      progress.add(double(compiled.size()), "CPU kernels");
      for (auto& k : compiled)
        if (names.insert(k.name).second) set.kernels.push_back(std::move(k));
    }
    say(o, "  CPU: " + std::to_string(set.kernels.size()) + " kernels for the " + label + " set (" + target + ")");
    r.kernel_sets.push_back(label + " (" + target + ")");
    sets.push_back(std::move(set));
  }
  const std::string runtime_obj = scratch.path + "/halide_runtime.o";
  write_halide_runtime_object(runtime_obj);

  std::vector<EmbeddedGpu> gpu;
  if (arch != "none") gpu = compile_gpu(prog, plan, arch, o, progress);
  for (const auto& g : gpu) r.gpu_modules.push_back(g.name);

  // The payload, compiled by the compiler librattn.so was linked with.
  const std::string cxx = std::getenv("RATTN_CXX") && *std::getenv("RATTN_CXX") ? std::getenv("RATTN_CXX") : recorded[0];
  const std::string src = scratch.path + "/payload.cpp", obj = scratch.path + "/payload.o";
  write_file_atomic(src, payload_source(r.model, plan_text, sets, gpu));
  say(o, "  compiling the payload with " + cxx);
  progress.add(0, "the payload");
  run({cxx, "-std=c++17", "-O1", "-fPIC", "-I" + embed, "-c", src, "-o", obj}, "emit library: compiling the payload");
  progress.add(1, "linking");

  // librattn.so's link command with this library's name and objects first.
  const std::string lib_name = "librattn_" + r.model + ".so";
  const std::string tmp_lib = scratch.path + "/" + lib_name;
  std::vector<std::string> objects{obj, runtime_obj};
  for (const auto& s : sets)
    for (const auto& k : s.kernels) objects.push_back(k.object);
  std::vector<std::string> cmd{cxx};
  bool inserted = false;
  for (size_t i = 1; i < recorded.size(); ++i) {
    const std::string& a = recorded[i];
    if (a == "-o") {
      ++i;
      continue;
    }
    if (a.rfind("-Wl,-soname", 0) == 0) continue;
    if (!inserted && (a.rfind("-Wl,--push-state", 0) == 0 || a.rfind("-Wl,--whole-archive", 0) == 0 ||
                      (a.size() > 2 && a.compare(a.size() - 2, 2, ".a") == 0))) {
      cmd.insert(cmd.end(), objects.begin(), objects.end());
      inserted = true;
    }
    cmd.push_back(a);
  }
  if (!inserted) cmd.insert(cmd.end(), objects.begin(), objects.end());
  cmd.insert(cmd.end(), {"-Wl,-soname," + lib_name, "-o", tmp_lib});
  say(o, "  linking " + lib_name);
  run(cmd, "emit library: linking " + lib_name);
  progress.add(1, "linked");

  r.library = out + "/lib/" + lib_name;
  write_file_atomic(r.library, read_file(tmp_lib));
  r.files.push_back(r.library);
  for (const char* h : {"rattn.h", "rattn.hpp"}) {
    if (!fs::is_regular_file(embed + "/" + h)) continue;
    write_file_atomic(out + "/include/" + h, read_file(embed + "/" + h));
    r.files.push_back(out + "/include/" + h);
  }
  write_package_files(out, r.model, r);
  return r;
}

}  // namespace rattn
