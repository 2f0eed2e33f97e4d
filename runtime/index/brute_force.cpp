#include "runtime/index/brute_force.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <string>

#include "core/error.h"
#include "runtime/index/distance.h"
#include "runtime/index/serial.h"
#include "runtime/index/topk.h"

namespace rattn {
namespace {

constexpr uint32_t kBruteForceVersion = 1;

class BruteForceScratch final : public SearchScratch {
 public:
  std::vector<int32_t> ids;
  std::vector<float> scores;
  size_t memory_bytes() const override { return ids.capacity() * sizeof(int32_t) + scores.capacity() * sizeof(float); }
};

class BruteForceIndex final : public KeyIndex {
 public:
  BruteForceIndex(int64_t n, std::shared_ptr<CpuKernels> kernels)
      : num_keys_(n), distance_(internal::make_distance(std::move(kernels))) {
    if (n < 0) fail(Status::invalid_argument, "brute-force index: negative key count");
  }
  std::unique_ptr<SearchScratch> make_scratch() const override { return std::make_unique<BruteForceScratch>(); }

  void search(const float* query, const RowsView& keys, const SearchParams& params, SearchScratch& scratch_base,
              SearchResult& out) const override {
    if (keys.rows < num_keys_)
      fail(Status::invalid_argument, "brute-force index: key store has fewer rows than the index");
    if (params.k <= 0) fail(Status::invalid_argument, "brute-force index: k must be positive");
    auto& scratch = static_cast<BruteForceScratch&>(scratch_base);
    constexpr int kChunk = 1024;
    scratch.ids.resize(kChunk);
    scratch.scores.resize(kChunk);
    internal::TopK top(params.k);
    for (int64_t begin = 0; begin < num_keys_; begin += kChunk) {
      const int n = int(std::min<int64_t>(kChunk, num_keys_ - begin));
      for (int i = 0; i < n; ++i) scratch.ids[size_t(i)] = int32_t(begin + i);
      distance_->dots(query, keys, scratch.ids.data(), n, scratch.scores.data());
      for (int i = 0; i < n; ++i) top.push(scratch.scores[size_t(i)], int32_t(begin + i));
    }
    top.take_sorted(&out.ids, &out.scores);
    out.keys_scored = num_keys_;
  }

  void insert(int32_t key_id, const float*, const RowsView& keys) override {
    if (key_id != num_keys_)
      fail(Status::invalid_argument, "brute-force index: insert expects key id " + std::to_string(num_keys_) +
                                         ", got " + std::to_string(key_id));
    if (key_id >= keys.rows) fail(Status::invalid_argument, "brute-force index: inserted row not in key store");
    ++num_keys_;
  }
  int64_t size() const override { return num_keys_; }
  size_t memory_bytes() const override { return sizeof(*this); }
  void serialize(std::string* out) const override {
    internal::ByteWriter w;
    w.put<int64_t>(num_keys_);
    internal::append_index_image(out, internal::IndexKind::brute_force, kBruteForceVersion, w.bytes());
  }

 private:
  int64_t num_keys_;
  std::unique_ptr<internal::Distance> distance_;
};

}  // namespace

std::unique_ptr<KeyIndex> make_brute_force_index(int64_t num_keys, std::shared_ptr<CpuKernels> kernels) {
  return std::make_unique<BruteForceIndex>(num_keys, std::move(kernels));
}

namespace internal {
std::unique_ptr<KeyIndex> load_brute_force(std::string_view payload, uint32_t version) {
  if (version != kBruteForceVersion)
    fail(Status::corrupt_data, "brute-force index image: unknown version " + std::to_string(version));
  ByteReader r(payload);
  const int64_t n = r.get<int64_t>();
  if (n < 0 || n > (int64_t(1) << 31) || !r.at_end()) fail(Status::corrupt_data, "brute-force index image: bad size");
  return make_brute_force_index(n);
}
}  // namespace internal

void exact_top_k(const float* query, const RowsView& keys, int64_t num_keys, int k, std::vector<int32_t>* ids,
                 std::vector<float>* scores) {
  if (num_keys > keys.rows) fail(Status::invalid_argument, "exact_top_k: num_keys exceeds the store");
  internal::TopK top(k);
  for (int64_t i = 0; i < num_keys; ++i) top.push(internal::dot_row(query, keys, i), int32_t(i));
  std::vector<float> s;
  top.take_sorted(ids, scores ? scores : &s);
}

double recall_at(const std::vector<int32_t>& got, const std::vector<int32_t>& truth, int k) {
  std::vector<int32_t> a(got.begin(), got.begin() + std::min<ptrdiff_t>(ptrdiff_t(got.size()), k));
  std::vector<int32_t> b(truth.begin(), truth.begin() + std::min<ptrdiff_t>(ptrdiff_t(truth.size()), k));
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return b.empty() ? 1.0 : double(both.size()) / double(b.size());
}

}  // namespace rattn
