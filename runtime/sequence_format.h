#pragma once
// The sequence file's framing (runtime/sequence_file.cpp writes and reads it;
// the loader fuzzer builds inputs with it):
//   magic | u32 version | u32 flags (0) | u64 payload bytes | payload | u64 fnv1a64(payload)
#include <cstdint>

namespace rattn {
inline constexpr char kSequenceFileMagic[8] = {'R', 'A', 'T', 'T', 'N', 'S', 'Q', '1'};
inline constexpr uint32_t kSequenceFileVersion = 5;        // written
inline constexpr uint32_t kSequenceFileOldestVersion = 1;  // still read
}  // namespace rattn
