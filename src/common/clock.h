// Injected time: a Clock interface, the real steady clock, and a FakeClock for tests.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "common/mutex.h"

namespace sluice {

using Micros = std::chrono::microseconds;
using Millis = std::chrono::milliseconds;
using Seconds = std::chrono::duration<double>;

// Thread-safe.
class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual time_point Now() const = 0;
  virtual void SleepFor(duration d) = 0;

  // Waits on `cv` (whose mutex `lock` holds) until notified or until `deadline` on this clock.
  // May return early (spuriously): callers re-check their condition in a loop.
  virtual void WaitUntil(CondVar& cv, MutexLock& lock, time_point deadline) = 0;

  // The process-wide real clock.
  static Clock& Real();
};

// Thread-safe. std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
  void SleepFor(duration d) override { std::this_thread::sleep_for(d); }
  void WaitUntil(CondVar& cv, MutexLock& lock, time_point deadline) override {
    if (deadline == time_point::max()) {
      cv.Wait(lock);
    } else {
      cv.WaitUntil(lock, deadline);
    }
  }
};

// Thread-safe. Time moves only when a test calls Advance() (SleepFor advances it too, so code
// that sleeps finishes at once while still seeing time pass). WaitUntil() with a deadline in the
// future returns after a short real-time pause (or a notify), so waiting code re-reads the fake
// time and sees Advance() without the test sleeping.
class FakeClock final : public Clock {
 public:
  FakeClock() : now_ns_(1'000'000'000) {}  // Not zero, so "unset" time points stand out.

  time_point Now() const override { return time_point(std::chrono::nanoseconds(now_ns_.load())); }
  void SleepFor(duration d) override { Advance(d); }
  void WaitUntil(CondVar& cv, MutexLock& lock, time_point deadline) override {
    if (Now() >= deadline) return;
    cv.WaitFor(lock, std::chrono::microseconds(200));
  }
  void Advance(duration d) {
    now_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

 private:
  std::atomic<int64_t> now_ns_;
};

inline Clock& Clock::Real() {
  static SteadyClock clock;
  return clock;
}

// Seconds between two time points, as a double.
inline double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace sluice
