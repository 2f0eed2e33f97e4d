#pragma once
// Generated kernels compiled on the host against simt_emu.h register here
// (see emu_gen.cpp); the numeric tests run every registered module.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "codegen/cuda/kernel_ir.h"
#include "codegen/cuda/knn_kernel.h"

namespace rattn::emu_test {

using PartialFn = void (*)(const float*, const unsigned short*, const unsigned short*, const int*,
                           long long, int, int, long long, float*, float*);
using MergeFn = void (*)(const float*, const float*, float*, float*);

struct EmuModule {
  std::string name;
  uint64_t text_hash = 0;  // fnv1a64 of the emitted text that was compiled
  cuda::DecodeAttentionParams params;
  PartialFn partial = nullptr;
  MergeFn merge = nullptr;  // null when splits == 1
};

// Every registered module of type M (EmuModule, EmuKnnModule): the shards'
// static initialisers add them, the tests read them.
template <class M>
std::vector<M>& registered() {
  static std::vector<M> all;
  return all;
}
template <class M>
bool register_module(M m) {
  registered<M>().push_back(std::move(m));
  return true;
}
inline std::vector<EmuModule>& modules() { return registered<EmuModule>(); }

// The specialisations the emulated tests cover (shared with the generator).
std::vector<cuda::DecodeAttentionParams> covered_specialisations();

// The training-query kNN kernels (codegen/cuda/knn_kernel.h), likewise.
using KnnFn = void (*)(const float*, const float*, const int*, long long, long long, int*, float*);
struct EmuKnnModule {
  std::string name;
  uint64_t text_hash = 0;
  cuda::KnnKernelParams params;
  KnnFn kernel = nullptr;
};
inline std::vector<EmuKnnModule>& knn_modules() { return registered<EmuKnnModule>(); }
std::vector<cuda::KnnKernelParams> covered_knn_kernels();

}  // namespace rattn::emu_test
