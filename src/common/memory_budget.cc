// MemoryBudget: a compare-and-swap on the bytes in use, so acquisitions never overshoot.
#include "common/memory_budget.h"

#include <unistd.h>

#include <algorithm>

namespace sluice {

MemoryBudget::MemoryBudget(size_t limit_bytes) : limit_(std::max<size_t>(1, limit_bytes)) {}

bool MemoryBudget::TryAcquire(size_t bytes) {
  size_t used = in_use_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ - std::min(used, limit_)) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!in_use_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

void MemoryBudget::Release(size_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

size_t MemoryBudget::DefaultLimit() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return size_t{1} << 30;
  return static_cast<size_t>(pages) * static_cast<size_t>(page_size) / 4;
}

bool MemoryReservation::Grow(size_t bytes) {
  if (bytes == 0) return true;
  if (!budget_.TryAcquire(bytes)) return false;
  bytes_.fetch_add(bytes);
  return true;
}

bool MemoryReservation::GrowTo(size_t total) {
  const size_t held = bytes_.load();
  return total <= held || Grow(total - held);
}

}  // namespace sluice
