// libFuzzer target: one check of tests/fuzz/loaders.h on arbitrary bytes,
// chosen at build time (RATTN_FUZZ_CHECK, e.g. check_npy: one executable per
// format, tests/fuzz/CMakeLists.txt); scripts/fuzz-files builds and runs them.
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/loaders.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string finding = rattn::fuzz::RATTN_FUZZ_CHECK(data, size);
  if (!finding.empty()) {
    std::fprintf(stderr, "finding: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
