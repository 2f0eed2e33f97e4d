#pragma once
// Keeps the k best (score, id) pairs of a stream: values below the current
// k-th best are rejected with one compare; the buffer (2k) is compacted with
// select_best when it fills: a 2k buffer keeps the threshold closer to the
// k-th best than 4k did, so fewer values pass it (measured on the index
// build's exact top-100 lists). Order: score descending, ties by lower id.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace rattn::internal {

struct ScoredId {
  float score;
  int32_t id;
};
inline bool better(const ScoredId& a, const ScoredId& b) {
  return a.score > b.score || (a.score == b.score && a.id < b.id);
}
// `better` as a type, so that sorts inline it (a function pointer is not).
struct Better {
  bool operator()(const ScoredId& a, const ScoredId& b) const { return better(a, b); }
};

// Moves the k best of v under `better` to v[0, k), in any order (the rest
// after them). Pairs must have distinct ids and no NaN score (TopK::push
// keeps both out). AVX-512 quickselect where the CPU has it (topk.cpp).
void select_best(std::vector<ScoredId>& v, size_t k);

// Sorts v under `better` (score descending, ties by lower id) as one 64-bit
// integer key per pair: a single compare instead of `better`'s two, whose
// branches were the cost (the projection's selection and sort of ~96 of
// ~212 pairs per node: 4.3 -> 3.0 us). -0 sorts as +0 (the two compare equal
// under `better` too); no NaN (TopK::push and the finite key checks keep
// them out).
void sort_best(std::vector<ScoredId>& v);

// The best min(k, size) pairs of v, sorted under `better`; the rest dropped.
inline void keep_best_sorted(std::vector<ScoredId>& v, size_t k) {
  select_best(v, k);
  if (v.size() > k) v.resize(k);
  sort_best(v);
}

// Orders v into groups under `better`: v[0] the best, v[1, end) the next
// best, then the rest; each group in any order (two selections, not a sort).
inline void best_then_group(std::vector<ScoredId>& v, size_t end) {
  if (v.empty()) return;
  const auto first = v.begin(), group_end = first + std::ptrdiff_t(std::min(end, v.size()));
  select_best(v, end);
  std::iter_swap(first, std::min_element(first, group_end, Better{}));
}

class TopK {
 public:
  explicit TopK(int k) : k_(std::max(k, 1)) { buf_.reserve(size_t(k_) * kSlack); }
  // A copy keeps the capacity (std::vector's copy would not).
  TopK(const TopK& o) : k_(o.k_), threshold_(o.threshold_) {
    buf_.reserve(size_t(k_) * kSlack);
    buf_ = o.buf_;
  }
  TopK& operator=(const TopK& o) {
    k_ = o.k_;
    threshold_ = o.threshold_;
    buf_.reserve(size_t(k_) * kSlack);
    buf_ = o.buf_;
    return *this;
  }
  TopK(TopK&&) = default;
  TopK& operator=(TopK&&) = default;
  void reset() {
    buf_.clear();
    threshold_ = -std::numeric_limits<float>::infinity();
  }
  float threshold() const { return threshold_; }
  void push(float score, int32_t id) {
    // Written so that a NaN is rejected too: it would break the selection's ordering.
    if (!(score >= threshold_)) return;
    buf_.push_back({score, id});
    if (buf_.size() >= size_t(k_) * kSlack) compact();
  }
  // Best first.
  void take_sorted(std::vector<int32_t>* ids, std::vector<float>* scores) {
    compact();
    sort_best(buf_);
    ids->resize(buf_.size());
    scores->resize(buf_.size());
    for (size_t i = 0; i < buf_.size(); ++i) {
      (*ids)[i] = buf_[i].id;
      (*scores)[i] = buf_[i].score;
    }
  }
  // The kept k, in no order (cheaper than sorted() where the order is not needed).
  std::vector<ScoredId>& unordered() {
    compact();
    return buf_;
  }
  std::vector<ScoredId>& sorted() {
    compact();
    sort_best(buf_);
    return buf_;
  }

 private:
  static constexpr size_t kSlack = 2;
  void compact() {
    if (buf_.size() <= size_t(k_)) return;
    select_best(buf_, size_t(k_));
    buf_.resize(size_t(k_));
    threshold_ = buf_[size_t(k_) - 1].score;
    for (const auto& e : buf_) threshold_ = std::min(threshold_, e.score);
  }
  int k_;
  float threshold_ = -std::numeric_limits<float>::infinity();
  std::vector<ScoredId> buf_;
};

}  // namespace rattn::internal
