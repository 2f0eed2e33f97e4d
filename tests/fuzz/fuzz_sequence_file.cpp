// libFuzzer target: check_sequence_file (tests/fuzz/loaders.h) on arbitrary bytes;
// scripts/fuzz-files builds and runs it.
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/loaders.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string finding = rattn::fuzz::check_sequence_file(data, size);
  if (!finding.empty()) {
    std::fprintf(stderr, "finding: %s\n", finding.c_str());
    std::abort();
  }
  return 0;
}
