#pragma once
// A fresh directory under the system temp dir, removed with everything in it
// when the test ends.
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace rattn::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace rattn::test
