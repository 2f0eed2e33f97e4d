#include "bench/decode/roofline.h"

#include <algorithm>

#include "runtime/index/distance.h"

namespace rattn::bench {

double full_attention_bytes(double rows, int head_dim, DType kv) {
  return rows * 2.0 * double(head_dim) * double(dtype_size(kv));
}

double bytes_per_scored_key(int head_dim, DType kv, bool traversal_codes, int code_dims, int code_coarse_dims) {
  // A code row as stored and fetched (whole cache lines): 8-bit codes of d
  // dimensions, or of code_dims directions with the last code_coarse_dims at
  // 4 bits.
  const int coded = code_dims == 0 ? head_dim : code_dims;
  const double key = !traversal_codes ? double(head_dim) * double(dtype_size(kv))
                                      : double(internal::ScalarCodes::row_stride(coded, code_coarse_dims));
  return key + 4.0 + 1.0;
}

std::vector<RooflinePhase> decode_roofline(const RooflineInput& in, double triad_1thread, double triad_threads) {
  const DecodeProfile& p = in.profile;
  const double steps = double(std::max<int64_t>(1, p.steps));
  const double row = double(in.head_dim) * double(dtype_size(in.kv));
  const double partial = (double(in.head_dim) + 1.0) * 4.0;  // fp32 output and lse of one head
  const double scored = bytes_per_scored_key(in.head_dim, in.kv, in.traversal_codes, in.code_dims,
                                             in.code_coarse_dims);
  auto phase = [&](const char* name, double bytes, double ms, double triad) {
    RooflinePhase r;
    r.name = name;
    r.bytes = bytes;
    r.ms = ms;
    if (bytes >= 0 && ms > 0) r.gb_s = bytes / (ms * 1e6);
    if (triad > 0) r.share_of_triad = r.gb_s / triad;
    return r;
  };
  std::vector<RooflinePhase> out;
  out.push_back(phase("static set", double(p.static_rows) * 2.0 * row / steps, p.static_ms / steps, triad_1thread));
  out.push_back(phase("search", double(p.keys_scored) * scored / steps, p.search_ms / steps, triad_1thread));
  out.push_back(phase("retrieved attention", double(p.retrieved_rows) * 2.0 * row / steps,
                      p.retrieved_attention_ms / steps, triad_1thread));
  // Each merge reads a partial and the running result.
  out.push_back(phase("merge", double(p.merged_partials) * 2.0 * partial / steps, p.merge_ms / steps, triad_1thread));
  // Insertion's searches walk the keys themselves.
  const double insert_scored = bytes_per_scored_key(in.head_dim, in.kv, false, 0, 0);
  out.push_back(phase("insertion", p.insert_keys_scored < 0 ? -1.0 : double(p.insert_keys_scored) * insert_scored / steps,
                      p.insert_ms / steps, triad_1thread));
  out.push_back(phase("full attention", full_attention_bytes(in.full_rows, in.head_dim, in.kv), in.full_ms,
                      triad_threads));
  return out;
}

}  // namespace rattn::bench
