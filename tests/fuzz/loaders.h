#pragma once
// The binary loaders on arbitrary bytes: index images, .npy files and GGUF
// files. Each check feeds the bytes to one loader and, when they load, uses
// what loaded (searches and an insert on an index, dequantisation and the
// tokenizer of a GGUF file). A rattn::Error is an accepted outcome; anything
// else (another exception, or a loaded object that contradicts itself) is
// returned as a message. Crashes and out-of-bounds accesses are the
// sanitizers' to report. The libFuzzer targets (scripts/fuzz-files) and the
// replay test (fuzz_replay_test) share these checks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace rattn::fuzz {

// Input layout: byte 0 even: bytes 1.. are a whole index image (header and
// checksum as on disk); odd: byte 1 picks the kind, byte 2 the format version
// and bytes 3.. are the payload, wrapped with a valid header and checksum, so
// that the payload parser is reached past the checksum.
std::string check_index_image(const uint8_t* data, size_t size);
// The index image such an input stands for (empty for inputs too short).
std::string index_image_of(const uint8_t* data, size_t size);
std::string check_npy(const uint8_t* data, size_t size);
std::string check_gguf(const uint8_t* data, size_t size);
// A sequence file (rattn_sequence_load, through a temporary file) for a small
// fixed context; byte 0 odd: byte 1 picks the format version and bytes 2..
// are the payload, wrapped with a valid header and checksum. What loads
// decodes one token per layer.
std::string check_sequence_file(const uint8_t* data, size_t size);
// The same, telling whether the file loaded.
std::string check_sequence_file(const uint8_t* data, size_t size, bool* loaded);

// Random calls of the C API (prefill, chunks, decode, batch decode, save and
// load) on small fixed contexts, with random float payloads and shapes. A
// finding: a refused call that changed the sequence (its token counts,
// memory, or a probe decode against a copy taken before the call), an
// accepted call whose outputs are not finite, an internal error, or a status
// without a message.
std::string check_c_api(const uint8_t* data, size_t size);

struct Seed {
  std::string name;
  std::vector<uint8_t> bytes;
};
// Valid inputs of each check: small index images (a projected graph in both
// layouts, a brute-force index), .npy files of every dtype, a GGUF file with
// metadata, a tokenizer and tensors of every dequantised type.
std::vector<Seed> index_seeds();
std::vector<Seed> npy_seeds();
std::vector<Seed> gguf_seeds();
std::vector<Seed> sequence_seeds();
// Each context's prompt, decode steps (one with a NaN), save and load.
std::vector<Seed> c_api_seeds();

}  // namespace rattn::fuzz
