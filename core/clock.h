#pragma once
// Wall-clock seconds on the steady clock, for timing phases and steps.
#include <chrono>

namespace rattn {

inline double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace rattn
