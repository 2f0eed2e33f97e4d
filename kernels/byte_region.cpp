#include "kernels/byte_region.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace rattn::internal {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kReserveFactor = 4;

size_t round_up(size_t n, size_t step) { return (n + step - 1) / step * step; }

// `bytes` (a multiple of kHugePage) of address space, kHugePage-aligned so
// that the kernel can back it with huge pages; nothing committed.
uint8_t* map_reservation(size_t bytes) {
  void* p = ::mmap(nullptr, bytes + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = round_up(raw, kHugePage);
  if (aligned > raw) ::munmap(p, aligned - raw);
  const size_t tail = raw + kHugePage - aligned;  // of the kHugePage mapped beyond `bytes`
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
#ifdef MADV_HUGEPAGE
  // A refusal (THP off) only costs TLB misses.
  (void)::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
#endif
  return reinterpret_cast<uint8_t*>(aligned);
}

void commit(uint8_t* at, size_t bytes) {
  if (bytes > 0 && ::mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) throw std::bad_alloc();
}

}  // namespace

void* alloc_row_storage(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t align = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = round_up(bytes, align);
  void* p = ::operator new(rounded, std::align_val_t(align));
#ifdef MADV_HUGEPAGE
  // A refusal (THP off) only costs TLB misses.
  if (align == kHugePage) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void free_row_storage(void* p, size_t bytes) {
  if (bytes == 0) bytes = 1;
  ::operator delete(p, std::align_val_t(bytes >= kHugePage ? kHugePage : 64));
}

ByteRegion::ByteRegion(const ByteRegion& other) {
  reserve(other.size_);
  if (other.size_ > 0) std::memcpy(base_, other.base_, other.size_);
  size_ = other.size_;
}

ByteRegion& ByteRegion::operator=(const ByteRegion& other) {
  if (this != &other) {
    ByteRegion copy(other);
    swap(copy);
  }
  return *this;
}

ByteRegion::ByteRegion(ByteRegion&& other) noexcept { swap(other); }

ByteRegion& ByteRegion::operator=(ByteRegion&& other) noexcept {
  if (this != &other) {
    release();
    swap(other);
  }
  return *this;
}

ByteRegion::~ByteRegion() { release(); }

void ByteRegion::release() noexcept {
  if (base_) {
    if (reserved_ > 0)
      ::munmap(base_, reserved_);
    else
      free_row_storage(base_, committed_);
  }
  base_ = nullptr;
  size_ = capacity_ = committed_ = reserved_ = 0;
}

void ByteRegion::swap(ByteRegion& other) noexcept {
  std::swap(base_, other.base_);
  std::swap(size_, other.size_);
  std::swap(capacity_, other.capacity_);
  std::swap(committed_, other.committed_);
  std::swap(reserved_, other.reserved_);
}

void ByteRegion::reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  if (bytes <= committed_) {
    capacity_ = bytes;
    return;
  }
  if (reserved_ > 0 && bytes <= reserved_) {  // commit more of the reservation, in place
    const size_t target = std::min(reserved_, round_up(bytes, kHugePage));
    commit(base_ + committed_, target - committed_);
    committed_ = target;
    capacity_ = bytes;
    return;
  }
  uint8_t* fresh;
  size_t fresh_committed, fresh_reserved = 0;
  if (bytes < kHugePage) {  // the heap, exactly (extend doubles)
    fresh_committed = bytes;
    fresh = static_cast<uint8_t*>(alloc_row_storage(fresh_committed));
  } else {
    fresh_reserved = round_up(bytes, kHugePage) * kReserveFactor;
    fresh = map_reservation(fresh_reserved);
    fresh_committed = round_up(bytes, kHugePage);
    try {
      commit(fresh, fresh_committed);
    } catch (...) {
      ::munmap(fresh, fresh_reserved);
      throw;
    }
  }
  if (size_ > 0) std::memcpy(fresh, base_, size_);
  const size_t used = size_;
  release();
  base_ = fresh;
  size_ = used;
  capacity_ = bytes;
  committed_ = fresh_committed;
  reserved_ = fresh_reserved;
}

uint8_t* ByteRegion::extend(size_t bytes) {
  // On the heap, grow geometrically so that appends cost amortised O(1).
  if (bytes > capacity_) reserve(reserved_ > 0 ? bytes : std::max(bytes, 2 * capacity_));
  uint8_t* first_new = base_ + std::min(size_, bytes);
  size_ = bytes;
  return first_new;
}

}  // namespace rattn::internal
