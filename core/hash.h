#pragma once
#include <cstdint>

namespace rattn {

// splitmix64's finaliser: a well-mixed 64-bit value of z (seeded shuffles and
// sampling that must give the same result on every platform).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64's stride: successive states st += kGoldenGamma, mixed, give its stream.
constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ull;

}  // namespace rattn
