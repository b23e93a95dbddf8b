#include "common/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace sluice {
namespace {

TEST(MemoryBudgetTest, AcquiresAllOrNothingAndCountsRefusals) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.TryAcquire(60));
  EXPECT_FALSE(budget.TryAcquire(41));  // 101 would pass the limit: nothing is taken.
  EXPECT_EQ(budget.in_use(), 60u);
  EXPECT_EQ(budget.refusals(), 1);
  EXPECT_TRUE(budget.TryAcquire(40));  // Exactly the limit fits.
  EXPECT_FALSE(budget.TryAcquire(1));
  budget.Release(100);
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(budget.refusals(), 2);
}

TEST(MemoryReservationTest, GrowsAndGivesEverythingBackWhenTheLastOwnerLetsGo) {
  MemoryBudget budget(1000);
  auto reservation = std::make_shared<MemoryReservation>(budget);
  EXPECT_TRUE(reservation->Grow(300));
  EXPECT_TRUE(reservation->GrowTo(200));  // Already holds more.
  EXPECT_TRUE(reservation->GrowTo(500));
  EXPECT_EQ(reservation->bytes(), 500u);
  EXPECT_FALSE(reservation->Grow(501));  // A refused growth keeps what was held.
  EXPECT_EQ(reservation->bytes(), 500u);
  EXPECT_EQ(budget.in_use(), 500u);
  std::shared_ptr<MemoryReservation> handler_copy = reservation;
  reservation.reset();
  EXPECT_EQ(budget.in_use(), 500u);  // The handler still holds the request's data.
  handler_copy.reset();
  EXPECT_EQ(budget.in_use(), 0u);
}

// Bodies arriving on many connections at once: each grows its reservation piece by piece as its
// chunks arrive. The budget is never exceeded, the pieces granted add up to what is in use, and
// when every request is answered nothing is left held.
TEST(MemoryBudgetTest, ConcurrentBodiesNeverExceedTheLimitAndReturnEveryByte) {
  constexpr size_t kLimit = 256 << 10;
  MemoryBudget budget(kLimit);
  std::atomic<size_t> peak{0};
  std::atomic<int64_t> refused_bodies{0};
  std::atomic<int64_t> whole_bodies{0};
  std::vector<std::thread> connections;
  for (int c = 0; c < 8; ++c) {
    connections.emplace_back([&, c] {
      for (int request = 0; request < 200; ++request) {
        MemoryReservation body(budget);
        bool whole = true;
        for (int chunk = 0; chunk < 16 && whole; ++chunk) {
          whole = body.Grow(4096 + 1024 * static_cast<size_t>((c + request + chunk) % 7));
          size_t used = budget.in_use();
          size_t seen = peak.load();
          while (used > seen && !peak.compare_exchange_weak(seen, used)) {
          }
        }
        (whole ? whole_bodies : refused_bodies).fetch_add(1);
      }
    });
  }
  for (auto& thread : connections) thread.join();
  EXPECT_LE(peak.load(), kLimit);
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(whole_bodies.load() + refused_bodies.load(), 8 * 200);
  EXPECT_GT(whole_bodies.load(), 0);
  // Every refused body was refused by exactly one failed growth.
  EXPECT_EQ(budget.refusals(), refused_bodies.load());
}

TEST(MemoryBudgetTest, DefaultIsAQuarterOfPhysicalMemory) {
  const size_t limit = MemoryBudget::DefaultLimit();
  EXPECT_GT(limit, size_t{64} << 20);
  EXPECT_LT(limit, size_t{1} << 50);
}

}  // namespace
}  // namespace sluice
