#pragma once
// Memory needs checked before large allocations, so that a request the
// machine cannot hold is an error saying how much it needed rather than a
// std::bad_alloc (or the OOM killer) half-way through.
#include <cstdint>
#include <string>

namespace rattn {

// Bytes the process can still get: MemAvailable + SwapFree from
// /proc/meminfo, capped by the cgroup's memory.max less its memory.current
// where one is set; 0 when unknown (then nothing is refused).
uint64_t available_memory_bytes();

// Throws Error(out_of_memory) "<what> needs X GiB (N bytes), Y GiB are
// available" when `bytes` exceeds what is available.
void require_memory(uint64_t bytes, const std::string& what);

// "1.50 GiB", "12.00 MiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace rattn
