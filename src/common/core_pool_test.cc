#include "common/core_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

namespace sluice {
namespace {

// Spins until `pool` has `n` callers blocked in Acquire().
void AwaitWaiters(const CorePool& pool, int n) {
  while (pool.waiting() < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

TEST(CorePoolTest, ARunAloneTakesEveryCore) {
  CorePool pool(4);
  const int taken = pool.Acquire();
  EXPECT_EQ(taken, 4);
  EXPECT_EQ(pool.free(), 0);
  pool.Release(taken);
  EXPECT_EQ(pool.free(), 4);
  EXPECT_EQ(CorePool(0).size(), 1);  // A pool has at least one core.
}

TEST(CorePoolTest, ARunArrivingWhileAnotherHoldsTheCoresWaitsThenBothGetHalf) {
  CorePool pool(4);
  const int first = pool.Acquire();
  ASSERT_EQ(first, 4);
  std::atomic<int> second{-1};
  std::thread waiter([&] { second = pool.Acquire(); });
  AwaitWaiters(pool, 1);
  EXPECT_EQ(second.load(), -1);  // Nothing is free: it waits rather than oversubscribing.
  // The first instance finishes and comes back with its next batch before the waiter wakes: the
  // waiter is counted, so it takes half, not the whole pool.
  pool.Release(first);
  const int again = pool.Acquire();
  waiter.join();
  EXPECT_EQ(again, 2);
  EXPECT_EQ(second.load(), 2);  // Its share was fixed when it arrived, beside one holder.
  EXPECT_EQ(pool.free(), 0);
  pool.Release(again);
  pool.Release(second);
  EXPECT_EQ(pool.free(), 4);
}

TEST(CorePoolTest, EachArrivalsShareCountsTheRunsBeforeIt) {
  CorePool pool(4);
  const int first = pool.Acquire();
  std::vector<std::thread> late;
  std::vector<int> shares(3, 0);
  // Arriving one after another beside the holder: 4 / 2, 4 / 3 and 4 / 4 cores.
  for (int i = 0; i < 3; ++i) {
    late.emplace_back([&, i] { shares[i] = pool.Acquire(); });
    AwaitWaiters(pool, i + 1);
  }
  pool.Release(first);
  for (std::thread& t : late) t.join();
  EXPECT_EQ(shares, (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(pool.free(), 0);
  for (int share : shares) pool.Release(share);
  EXPECT_EQ(pool.free(), 4);
}

TEST(CorePoolTest, ConcurrentRunsNeverHoldMoreThanThePool) {
  constexpr int kCores = 3;
  constexpr int kInstances = 5;
  CorePool pool(kCores);
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  std::atomic<bool> below_one{false};
  std::vector<std::thread> instances;
  for (int i = 0; i < kInstances; ++i) {
    instances.emplace_back([&] {
      for (int run = 0; run < 2000; ++run) {
        CoreLease lease(pool);
        if (lease.cores() < 1) below_one = true;
        const int now = held += lease.cores();
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        if (run % 64 == 0) std::this_thread::yield();
        held -= lease.cores();
      }
    });
  }
  for (std::thread& t : instances) t.join();
  EXPECT_FALSE(below_one.load());
  EXPECT_LE(most.load(), kCores);
  EXPECT_EQ(pool.free(), kCores);
  EXPECT_EQ(pool.waiting(), 0);
}

TEST(CoreLeaseTest, GivesItsCoresBackOnceWhenMoved) {
  CorePool pool(2);
  {
    CoreLease lease(pool);
    EXPECT_EQ(lease.cores(), 2);
    CoreLease moved(std::move(lease));
    EXPECT_EQ(moved.cores(), 2);
    EXPECT_EQ(pool.free(), 0);
  }
  EXPECT_EQ(pool.free(), 2);  // Released once: not 4.
  CoreLease none;
  EXPECT_EQ(none.cores(), 0);
}

}  // namespace
}  // namespace sluice
