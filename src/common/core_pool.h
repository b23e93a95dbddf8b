// The cores a model's CPU instances share (`instances.share_cores`). Each run takes its share of
// the pool and gives it back when it is done: an instance running alone gets every core (one
// request at a time runs as fast as one instance with all the threads), and instances running at
// once split the pool between them (concurrent batches then run side by side, each on its own
// cores, instead of one batch split many ways with a barrier after every operator). The threads
// handed out never exceed the pool: an instance that finds no core free waits for one.
#pragma once

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace sluice {

// Thread-safe.
class CorePool {
 public:
  explicit CorePool(int cores);  // >= 1.
  CorePool(const CorePool&) = delete;
  CorePool& operator=(const CorePool&) = delete;

  // Blocks until a core is free, then takes this run's share: the pool divided among the runs
  // holding or waiting for cores when the caller arrived (itself included), at least one, at most
  // what is free. The share is fixed on arrival so that a waiter does not take the whole pool
  // back in the instant between another instance's release and its next acquire (the instances
  // would then take turns, one at a time, each with every core). Returns the cores taken.
  int Acquire();
  // Gives back `cores` that Acquire() returned.
  void Release(int cores);

  int size() const { return size_; }
  int free() const;
  int waiting() const;  // Callers blocked in Acquire().

 private:
  const int size_;
  mutable Mutex mu_;
  CondVar freed_;
  int free_ GUARDED_BY(mu_);
  int holders_ GUARDED_BY(mu_) = 0;
  int waiters_ GUARDED_BY(mu_) = 0;
};

// One run's cores, given back when it goes. Empty (no pool): holds nothing.
class CoreLease {
 public:
  CoreLease() = default;
  explicit CoreLease(CorePool& pool) : pool_(&pool), cores_(pool.Acquire()) {}
  ~CoreLease() {
    if (pool_ != nullptr) pool_->Release(cores_);
  }
  CoreLease(CoreLease&& other) noexcept : pool_(other.pool_), cores_(other.cores_) {
    other.pool_ = nullptr;
  }
  CoreLease& operator=(CoreLease&&) = delete;
  CoreLease(const CoreLease&) = delete;
  CoreLease& operator=(const CoreLease&) = delete;

  int cores() const { return cores_; }

 private:
  CorePool* pool_ = nullptr;
  int cores_ = 0;
};

}  // namespace sluice
