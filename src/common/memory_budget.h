// A server-wide budget of bytes for what requests hold in memory: bodies being read and the
// tensors decoded from them, until each request is answered. A request that would take the budget
// past its limit is refused (503) instead of waiting: a waiting connection would be a queue in
// disguise, holding its socket and its client's time, while a refusal with Retry-After lets the
// client back off or go to another replica at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace sluice {

// Thread-safe.
class MemoryBudget {
 public:
  explicit MemoryBudget(size_t limit_bytes);  // >= 1.
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Takes `bytes` when they fit under the limit (all or nothing); false, counted as a refusal,
  // when they do not.
  bool TryAcquire(size_t bytes);
  void Release(size_t bytes);

  size_t limit() const { return limit_; }
  size_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

  // A quarter of the machine's physical memory.
  static size_t DefaultLimit();

 private:
  const size_t limit_;
  std::atomic<size_t> in_use_{0};
  std::atomic<int64_t> refusals_{0};
};

// The bytes one request holds from a budget, given back when the last owner lets go (it is
// shared between the connection and the handler's callbacks). Thread-safe.
class MemoryReservation {
 public:
  explicit MemoryReservation(MemoryBudget& budget) : budget_(budget) {}
  ~MemoryReservation() { budget_.Release(bytes_.load()); }
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;

  // Holds `bytes` more; false (holding what it held) when the budget has not got them.
  bool Grow(size_t bytes);
  // Holds at least `total` bytes in all.
  bool GrowTo(size_t total);
  size_t bytes() const { return bytes_.load(); }
  const MemoryBudget& budget() const { return budget_; }

 private:
  MemoryBudget& budget_;
  std::atomic<size_t> bytes_{0};
};

}  // namespace sluice
