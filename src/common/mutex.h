// A mutex, its scoped lock and a condition variable that clang's thread-safety analysis
// understands, so fields marked GUARDED_BY(mu_) are checked at compile time. Thin wrappers over
// std::mutex, std::unique_lock and std::condition_variable.
//
// Condition waits are written as loops (`while (!ready_) cv_.Wait(lock);`) rather than with a
// predicate lambda: the analysis cannot see that a lambda runs with the lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace sluice {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex from construction to destruction; Unlock() and Lock() let a scope drop it for a
// while (to run a callback, to sleep).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() { lock_.unlock(); }
  void Lock() ACQUIRE() { lock_.lock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// Waits release the lock while blocked and hold it again on return, as std::condition_variable.
class CondVar {
 public:
  void Wait(MutexLock& lock) { cv_.wait(lock.lock_); }
  // False when `deadline` passed (the caller rechecks its condition either way).
  template <class ClockType, class Duration>
  bool WaitUntil(MutexLock& lock, std::chrono::time_point<ClockType, Duration> deadline) {
    return cv_.wait_until(lock.lock_, deadline) == std::cv_status::no_timeout;
  }
  template <class Rep, class Period>
  bool WaitFor(MutexLock& lock, std::chrono::duration<Rep, Period> timeout) {
    return cv_.wait_for(lock.lock_, timeout) == std::cv_status::no_timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace sluice
