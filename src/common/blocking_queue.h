// A bounded multi-producer multi-consumer FIFO that blocks, for pipelines of threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <utility>

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
    std::unique_lock lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || capacity_ == 0 || items_.size() < capacity_; });
    if (closed_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }
  bool Push(T&& item) { return Push(item); }

  std::optional<T> Pop() {
    std::unique_lock lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  void Close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    not_empty_.notify_all();
    not_full_.notify_all();
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return items_.size();
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable not_empty_;
  std::condition_variable not_full_;
  std::deque<T> items_;  // Guarded by mu_.
  bool closed_ = false;  // Guarded by mu_.
};

}  // namespace sluice
