// The ahead-of-time kernel sets a deployable library embeds: which one this
// CPU runs (chosen once per process by CPU features) and lookups in it. No
// Halide.h: the host's features come as Halide's host target string.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "codegen/halide/kernel_cache.h"
#include "codegen/halide/pipelines.h"
#include "core/log.h"

namespace rattn {
namespace internal {
namespace {

std::vector<std::string> split_target(const std::string& t) {
  std::vector<std::string> out;
  std::stringstream ss(t);
  for (std::string tok; std::getline(ss, tok, '-');) out.push_back(tok);
  return out;
}

}  // namespace

std::vector<std::string> missing_target_features(const std::string& target, const std::string& host) {
  const auto want = split_target(target), have = split_target(host);
  std::vector<std::string> missing;
  // "arch-bits-os" first, then the features.
  for (size_t i = 0; i < want.size(); ++i) {
    const bool base = i < 3;
    const bool ok = base ? i < have.size() && have[i] == want[i]
                         : std::find(have.begin() + std::min<size_t>(3, have.size()), have.end(), want[i]) != have.end();
    if (!ok) missing.push_back(base ? "architecture " + want[0] + "-" + (want.size() > 1 ? want[1] : "") +
                                          "-" + (want.size() > 2 ? want[2] : "")
                                    : want[i]);
    if (!ok && base) break;
  }
  return missing;
}

EmbeddedChoice choose_embedded_set(const embedded::KernelSet* sets, int n, const std::string& host_target,
                                   const std::string& preference) {
  EmbeddedChoice c;
  if (!sets || n <= 0 || preference == "jit") return c;
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  std::string pref = preference;
  if (pref != "auto" && pref != "host" && pref != "baseline" && !pref.empty()) {
    c.warning = "RATTN_CPU_KERNELS=" + pref + " is not auto, host, baseline or jit: using auto. ";
    pref = "auto";
  }
  for (int i = 0; i < n; ++i) {
    const embedded::KernelSet& s = sets[i];
    if (pref == "baseline" && std::string(s.label) != "baseline") continue;
    const auto missing = missing_target_features(s.target, host_target);
    if (missing.empty()) {
      c.set = &s;
      return c;
    }
    c.warning += std::string("the embedded ") + s.label + " kernel set (" + s.target +
                 ") does not run on this CPU (" + host_target + "; missing " + join(missing) + "). ";
  }
  c.warning += "No embedded kernel set runs here: kernels come from the kernel cache or the JIT compiler.";
  return c;
}

const embedded::KernelSet* embedded_kernel_set() {
  static const embedded::KernelSet* chosen = [] {
    const embedded::Payload* p = embedded::payload();
    if (!p) return static_cast<const embedded::KernelSet*>(nullptr);
    if (p->abi_version != embedded::kAbiVersion) {
      log_message(LogLevel::warn, "embedded kernels: payload version " + std::to_string(p->abi_version) +
                                      " is not " + std::to_string(embedded::kAbiVersion) + ": not used");
      return static_cast<const embedded::KernelSet*>(nullptr);
    }
    const char* env = std::getenv("RATTN_CPU_KERNELS");
    const std::string pref = env && *env ? env : "auto";
    const EmbeddedChoice c = choose_embedded_set(p->kernel_sets, p->n_kernel_sets, host_target_string(), pref);
    if (c.set && !c.warning.empty())
      log_message(LogLevel::warn, "embedded kernels: " + c.warning + "Using the " + c.set->label + " set (" +
                                      c.set->target + ").");
    else if (!c.set && !c.warning.empty())
      log_message(LogLevel::warn, "embedded kernels: " + c.warning);
    else if (c.set)
      log_message(LogLevel::info, std::string("embedded kernels: the ") + c.set->label + " set (" +
                                      c.set->target + ")");
    return c.set;
  }();
  return chosen;
}

const embedded::Kernel* find_embedded_kernel(const std::string& name) {
  const embedded::KernelSet* s = embedded_kernel_set();
  if (!s) return nullptr;
  for (int i = 0; i < s->n_kernels; ++i)
    if (name == s->kernels[i].name) return &s->kernels[i];
  return nullptr;
}

int default_vector_width() {
  if (const embedded::KernelSet* s = embedded_kernel_set()) return s->vector_width;
  return host_vector_width();
}

}  // namespace internal

std::string embedded_kernel_set_name() {
  const embedded::KernelSet* s = internal::embedded_kernel_set();
  return s ? std::string(s->label) + " (" + s->target + ")" : std::string();
}

}  // namespace rattn
