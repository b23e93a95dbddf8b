// Fixed thread pool.
#include "common/thread_pool.h"

#include <algorithm>

namespace sluice {

ThreadPool::ThreadPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

bool ThreadPool::TrySubmit(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    if (stopping_ || tasks_.size() >= max_queued_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
  return true;
}

int64_t ThreadPool::wakeups() const {
  MutexLock lock(mu_);
  return wakeups_;
}

size_t ThreadPool::queued() const {
  MutexLock lock(mu_);
  return tasks_.size();
}

void ThreadPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      while (!stopping_ && tasks_.empty()) {
        cv_.Wait(lock);
        ++wakeups_;
      }
      if (tasks_.empty()) return;  // Stopping and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace sluice
