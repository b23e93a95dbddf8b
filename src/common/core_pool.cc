#include "common/core_pool.h"

#include <algorithm>

namespace sluice {

CorePool::CorePool(int cores) : size_(std::max(1, cores)), free_(std::max(1, cores)) {}

int CorePool::Acquire() {
  MutexLock lock(mu_);
  const int share = std::max(1, size_ / (holders_ + waiters_ + 1));
  ++waiters_;
  while (free_ == 0) freed_.Wait(lock);
  --waiters_;
  const int taken = std::min(share, free_);
  free_ -= taken;
  ++holders_;
  return taken;
}

void CorePool::Release(int cores) {
  {
    MutexLock lock(mu_);
    free_ += cores;
    --holders_;
  }
  freed_.SignalAll();
}

int CorePool::free() const {
  MutexLock lock(mu_);
  return free_;
}

int CorePool::waiting() const {
  MutexLock lock(mu_);
  return waiters_;
}

}  // namespace sluice
