// A bounded multi-producer multi-consumer FIFO that blocks, for pipelines of threads.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

#include "common/mutex.h"

namespace sluice {

// Thread-safe. Push() blocks while the queue is full; Pop() blocks while it is empty. After
// Close(), Push() fails at once and Pop() drains what is left, then returns nullopt.
template <typename T>
class BlockingQueue {
 public:
  // `capacity`: most items held at once; 0 means unbounded.
  explicit BlockingQueue(size_t capacity = 0) : capacity_(capacity) {}

  // Returns false (and drops nothing: `item` is left unmoved) when the queue is closed.
  bool Push(T& item) {
    MutexLock lock(mu_);
    while (!closed_ && capacity_ != 0 && items_.size() >= capacity_) not_full_.Wait(lock);
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.Signal();
    return true;
  }
  bool Push(T&& item) { return Push(item); }

  std::optional<T> Pop() {
    MutexLock lock(mu_);
    while (!closed_ && items_.empty()) not_empty_.Wait(lock);
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.Signal();
    return item;
  }

  void Close() {
    MutexLock lock(mu_);
    closed_ = true;
    not_empty_.SignalAll();
    not_full_.SignalAll();
  }

  size_t size() const {
    MutexLock lock(mu_);
    return items_.size();
  }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  CondVar not_empty_;
  CondVar not_full_;
  std::deque<T> items_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace sluice
