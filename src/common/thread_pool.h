// A fixed pool of threads with a bounded queue of tasks, for CPU work that should leave the I/O
// threads (image decoding).
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace sluice {

// Thread-safe. TrySubmit() never blocks: a full queue refuses the task (back-pressure).
class ThreadPool {
 public:
  // `threads` >= 1; `max_queued` tasks may wait beyond those running.
  ThreadPool(int threads, size_t max_queued);
  ~ThreadPool();  // Runs what is queued, then joins.
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`; false (and `task` dropped unrun) when the queue is full or the pool stopping.
  bool TrySubmit(std::function<void()> task);
  // Times a thread waiting for a task was woken: the hand-offs to the pool.
  int64_t wakeups() const;
  // Tasks submitted and not yet taken by a thread (the backlog).
  size_t queued() const;

 private:
  void Loop();

  const size_t max_queued_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t wakeups_ GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace sluice
