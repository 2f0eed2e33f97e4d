// Writes the fuzz targets' seed corpora: fuzz_seeds DIR makes DIR/index,
// DIR/npy, DIR/gguf, DIR/sequence and DIR/c_api (scripts/fuzz-files).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/fuzz/loaders.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  namespace fs = std::filesystem;
  const struct {
    const char* dir;
    std::vector<rattn::fuzz::Seed> seeds;
  } sets[] = {{"index", rattn::fuzz::index_seeds()},
               {"npy", rattn::fuzz::npy_seeds()},
               {"gguf", rattn::fuzz::gguf_seeds()},
               {"sequence", rattn::fuzz::sequence_seeds()},
               {"c_api", rattn::fuzz::c_api_seeds()}};
  for (const auto& set : sets) {
    const fs::path dir = fs::path(argv[1]) / set.dir;
    fs::create_directories(dir);
    for (const auto& s : set.seeds) {
      std::ofstream out(dir / s.name, std::ios::binary);
      out.write(reinterpret_cast<const char*>(s.bytes.data()), std::streamsize(s.bytes.size()));
      if (!out) {
        std::fprintf(stderr, "cannot write %s\n", (dir / s.name).c_str());
        return 1;
      }
    }
  }
  return 0;
}
