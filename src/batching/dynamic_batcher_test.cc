// Dynamic batcher rules, one test each, on a FakeClock: no test sleeps.
#include "batching/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <cmath>
#include <future>
#include <thread>

namespace sluice {
namespace {

using std::chrono::milliseconds;

// A request of `samples` rows of 2 floats, tagged by `id`.
std::unique_ptr<InferRequest> MakeRequest(RequestId id, int64_t samples = 1, int64_t width = 2) {
  auto request = std::make_unique<InferRequest>();
  request->id = id;
  request->inputs.push_back(Tensor::Zeros(DataType::kFp32, {samples, width}));
  request->done = [](InferResponse&&) {};
  return request;
}

std::vector<RequestId> Ids(const std::vector<std::unique_ptr<InferRequest>>& requests) {
  std::vector<RequestId> ids;
  for (const auto& r : requests) ids.push_back(r->id);
  return ids;
}

class BatcherTest : public ::testing::Test {
 protected:
  void Make(BatcherOptions options) {
    batcher_ = std::make_unique<DynamicBatcher>(std::move(options), clock_);
  }
  void Add(RequestId id, int64_t samples = 1) {
    auto request = MakeRequest(id, samples);
    ASSERT_TRUE(batcher_->Enqueue(request).ok()) << "request " << id;
  }
  BatcherPoll Poll() { return batcher_->Poll(clock_.Now()); }
  // `n` one-sample requests admitted at their header; their tickets.
  std::vector<std::shared_ptr<const void>> AdmitAll(int n) {
    std::vector<std::shared_ptr<const void>> tickets;
    for (int i = 0; i < n; ++i) {
      auto ticket = batcher_->Admit(1, std::nullopt);
      EXPECT_TRUE(ticket.ok()) << i;
      if (ticket.ok()) tickets.push_back(*ticket);
    }
    return tickets;
  }
  // One-sample requests from `id` on until one is refused (at most `limit`): how many were taken,
  // and the refusal in `refusal`.
  int EnqueueUntilRefused(RequestId& id, int limit, Status& refusal) {
    int taken = 0;
    refusal = Status::Ok();
    while (refusal.ok() && taken < limit) {
      auto request = MakeRequest(id++, 1);
      refusal = batcher_->Enqueue(request);
      if (refusal.ok()) ++taken;
    }
    return taken;
  }

  FakeClock clock_;
  std::unique_ptr<DynamicBatcher> batcher_;
};

BatcherOptions Options(int max_batch_size, Micros delay, std::vector<int> preferred = {},
                       int max_queue_size = 1024) {
  BatcherOptions o;
  o.max_batch_size = max_batch_size;
  o.max_queue_delay = delay;
  o.preferred_batch_sizes = std::move(preferred);
  o.max_queue_size = max_queue_size;
  return o;
}

TEST_F(BatcherTest, DispatchesAtOnceWhenTheBatchIsFull) {
  Make(Options(4, Micros(1'000'000)));
  for (RequestId id = 1; id <= 3; ++id) Add(id);
  EXPECT_TRUE(Poll().batch.requests.empty());
  Add(4);
  BatcherPoll poll = Poll();
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{1, 2, 3, 4}));
  EXPECT_EQ(poll.batch.samples, 4);
  EXPECT_EQ(batcher_->queued_requests(), 0);
}

TEST_F(BatcherTest, DelayIsMeasuredFromTheOldestRequest) {
  Make(Options(8, Micros(2000)));
  const Clock::time_point t0 = clock_.Now();
  Add(1);
  clock_.Advance(milliseconds(1));
  Add(2);
  BatcherPoll early = Poll();
  EXPECT_TRUE(early.batch.requests.empty());
  EXPECT_EQ(early.wake_at, t0 + milliseconds(2));  // The oldest's expiry, not the newest's.
  clock_.Advance(Micros(999));
  EXPECT_TRUE(Poll().batch.requests.empty());
  clock_.Advance(Micros(1));
  BatcherPoll due = Poll();
  EXPECT_EQ(Ids(due.batch.requests), (std::vector<RequestId>{1, 2}));
  for (const auto& r : due.batch.requests) EXPECT_EQ(r->times.dispatch, t0 + milliseconds(2));
}

TEST_F(BatcherTest, ZeroDelayDispatchesWhatIsThere) {
  Make(Options(8, Micros(0)));
  Add(1);
  Add(2);
  EXPECT_EQ(Poll().batch.samples, 2);
}

TEST_F(BatcherTest, PreferredSizeDispatchesAtOnce) {
  Make(Options(8, Micros(1'000'000), {2, 4}));
  Add(1);
  EXPECT_TRUE(Poll().batch.requests.empty());
  Add(2);
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{1, 2}));
}

TEST_F(BatcherTest, LargestReachablePreferredSizeWinsAndTheRestWaits) {
  Make(Options(8, Micros(1'000'000), {2, 4}));
  // Not polled in between: five single-sample requests queue up.
  for (RequestId id = 1; id <= 5; ++id) Add(id);
  BatcherPoll poll = Poll();
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{1, 2, 3, 4}));
  EXPECT_EQ(batcher_->queued_requests(), 1);
  EXPECT_TRUE(Poll().batch.requests.empty());  // One left: below every preferred size.
}

TEST_F(BatcherTest, CountsSamplesNotRequests) {
  Make(Options(8, Micros(1'000'000)));
  Add(1, 4);
  Add(2, 3);
  EXPECT_EQ(batcher_->queued_samples(), 7);
  EXPECT_TRUE(Poll().batch.requests.empty());  // 7 of 8 samples: may still grow.
  Add(3, 2);                                   // Would make 9: the batch cannot grow.
  BatcherPoll poll = Poll();
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(poll.batch.samples, 7);
  EXPECT_EQ(batcher_->queued_samples(), 2);
}

TEST_F(BatcherTest, MultiSampleRequestsFillABatchExactly) {
  Make(Options(8, Micros(1'000'000)));
  Add(1, 4);
  Add(2, 4);
  EXPECT_EQ(Poll().batch.samples, 8);
}

TEST_F(BatcherTest, RequestLargerThanMaxBatchIsInvalidAndLeftWithTheCaller) {
  Make(Options(4, Micros(0)));
  auto request = MakeRequest(1, 5);
  Status status = batcher_->Enqueue(request);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("max_batch_size is 4"), std::string::npos);
  EXPECT_NE(request, nullptr);
  auto empty = MakeRequest(2, 0);
  EXPECT_EQ(batcher_->Enqueue(empty).code(), StatusCode::kInvalidArgument);
}

TEST_F(BatcherTest, FullQueueRejectsWithUnavailableUntilSpaceFrees) {
  Make(Options(2, Micros(1'000'000), {}, /*max_queue_size=*/4));
  Add(1, 2);
  Add(2, 2);
  auto extra = MakeRequest(3);
  Status status = batcher_->Enqueue(extra);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("queue full"), std::string::npos);
  EXPECT_NE(extra, nullptr);
  EXPECT_EQ(Poll().batch.samples, 2);  // Full batch: goes at once and frees two slots.
  EXPECT_TRUE(batcher_->Enqueue(extra).ok());
}

TEST_F(BatcherTest, RequestPastItsDeadlineExpiresWithoutRunning) {
  Make(Options(8, Micros(5000)));
  auto request = MakeRequest(1);
  request->deadline = clock_.Now() + milliseconds(1);
  ASSERT_TRUE(batcher_->Enqueue(request).ok());
  Add(2);
  BatcherPoll before = Poll();
  EXPECT_TRUE(before.expired.empty());
  EXPECT_EQ(before.wake_at, clock_.Now() + milliseconds(1));  // The deadline comes first.
  clock_.Advance(milliseconds(1));
  BatcherPoll after = Poll();
  EXPECT_EQ(Ids(after.expired), (std::vector<RequestId>{1}));
  EXPECT_TRUE(after.batch.requests.empty());
  clock_.Advance(milliseconds(4));
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{2}));
}

// A request whose batch would end after its deadline (at the cost model's cost) is not run, when
// its wait made it late; one whose deadline never left room for a run goes all the same.
TEST_F(BatcherTest, RequestThatWouldFinishPastItsDeadlineExpiresWithoutRunning) {
  Make(Options(1, Micros(0)));
  batcher_->cost_model().Seed(1, 0.100);  // A batch of one: 100 ms.
  auto late = MakeRequest(1);
  late->deadline = clock_.Now() + milliseconds(150);
  ASSERT_TRUE(batcher_->Enqueue(late).ok());
  auto in_time = MakeRequest(2);
  in_time->deadline = clock_.Now() + milliseconds(500);
  ASSERT_TRUE(batcher_->Enqueue(in_time).ok());
  clock_.Advance(milliseconds(60));  // Request 1 would end at 160 ms.
  BatcherPoll poll = Poll();
  EXPECT_EQ(Ids(poll.expired), (std::vector<RequestId>{1}));
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{2}));

  auto hopeless = MakeRequest(3);
  hopeless->deadline = clock_.Now() + milliseconds(50);  // Less than a run, from the start.
  ASSERT_TRUE(batcher_->Enqueue(hopeless).ok());
  clock_.Advance(milliseconds(10));
  poll = Poll();
  EXPECT_TRUE(poll.expired.empty());
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{3}));
}

// A batch whose runs vary (a CPU shared with other tenants) must end by the deadline even when
// it runs slow: run on its average, half the batches started near the deadline would end after it.
TEST_F(BatcherTest, RequestThatASlowRunWouldFinishPastItsDeadlineExpires) {
  // Runs of one sample that vary between 50 and 150 ms.
  auto learn = [](BatchCostModel& costs) {
    costs.Seed(1, 0.100);
    for (double seconds : {0.150, 0.060, 0.140, 0.050}) costs.Observe(1, seconds);
  };
  auto span = [](double seconds) {
    return std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
  };
  Make(Options(1, Micros(0)));
  learn(batcher_->cost_model());
  const double mean = batcher_->cost_model().Estimate(1);
  const double slow = batcher_->cost_model().EstimateSlow(1);
  ASSERT_GT(slow, mean + 0.020);
  auto late = MakeRequest(1);
  late->deadline = clock_.Now() + milliseconds(300);
  ASSERT_TRUE(batcher_->Enqueue(late).ok());
  auto in_time = MakeRequest(2);
  in_time->deadline = clock_.Now() + milliseconds(400);
  ASSERT_TRUE(batcher_->Enqueue(in_time).ok());
  // Request 1 has time for an average run, not for a slow one.
  clock_.Advance(milliseconds(300) - span((mean + slow) / 2));
  BatcherPoll poll = Poll();
  EXPECT_EQ(Ids(poll.expired), (std::vector<RequestId>{1}));
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{2}));

  // Admission judges the request's own batch the same way: behind one queued request (a wait of
  // an average run), one with time for that and an average run of its own, not a slow one, is
  // refused at once.
  Make(Options(1, Micros(0)));
  learn(batcher_->cost_model());
  Add(3);
  auto refused = MakeRequest(4);
  refused->deadline = clock_.Now() + span(mean + (mean + slow) / 2);
  EXPECT_EQ(batcher_->Enqueue(refused).code(), StatusCode::kUnavailable);
  auto admitted = MakeRequest(5);
  admitted->deadline = clock_.Now() + span(mean + slow + 0.010);
  EXPECT_TRUE(batcher_->Enqueue(admitted).ok());
}

TEST_F(BatcherTest, RequestWhoseDeadlineHasPassedIsRefused) {
  Make(Options(8, Micros(0)));
  auto request = MakeRequest(1);
  request->deadline = clock_.Now();
  EXPECT_EQ(batcher_->Enqueue(request).code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(request, nullptr);
}

TEST_F(BatcherTest, CancelledRequestLeavesAndFreesItsSlot) {
  Make(Options(8, Micros(1000), {}, /*max_queue_size=*/2));
  Add(1);
  Add(2);
  auto cancelled = batcher_->Cancel(1);
  ASSERT_NE(cancelled, nullptr);
  EXPECT_EQ(cancelled->id, 1u);
  EXPECT_EQ(batcher_->queued_samples(), 1);
  EXPECT_EQ(batcher_->Cancel(1), nullptr);   // Already gone.
  EXPECT_EQ(batcher_->Cancel(99), nullptr);  // Unknown.
  Add(3);                                    // The freed slot is usable.
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{2, 3}));
}

TEST_F(BatcherTest, DelayRestartsFromTheNewOldestAfterACancel) {
  Make(Options(8, Micros(2000)));
  const Clock::time_point t0 = clock_.Now();
  Add(1);
  clock_.Advance(milliseconds(1));
  Add(2);
  ASSERT_NE(batcher_->Cancel(1), nullptr);
  EXPECT_EQ(Poll().wake_at, t0 + milliseconds(3));
}

TEST_F(BatcherTest, RequestsOfDifferentShapesDoNotShareABatch) {
  Make(Options(8, Micros(1'000'000)));
  Add(1);
  auto wide = MakeRequest(2, 1, /*width=*/3);
  ASSERT_TRUE(batcher_->Enqueue(wide).ok());
  Add(3);
  // Request 2 cannot join request 1's batch, so that batch cannot grow and goes now.
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{1}));
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{2}));
}

TEST_F(BatcherTest, CloseRejectsNewRequestsAndFlushesQueuedOnesAtOnce) {
  Make(Options(8, Micros(1'000'000)));
  Add(1);
  Add(2);
  batcher_->Close();
  auto late = MakeRequest(3);
  EXPECT_EQ(batcher_->Enqueue(late).code(), StatusCode::kUnavailable);
  EXPECT_EQ(Ids(Poll().batch.requests), (std::vector<RequestId>{1, 2}));
  BatcherPoll done = batcher_->WaitForBatch();  // Closed and empty: returns at once.
  EXPECT_TRUE(done.batch.requests.empty() && done.expired.empty());
}

TEST_F(BatcherTest, TakeAllEmptiesTheQueue) {
  Make(Options(8, Micros(1000)));
  Add(1);
  Add(2, 3);
  EXPECT_EQ(Ids(batcher_->TakeAll()), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(batcher_->queued_samples(), 0);
  EXPECT_EQ(batcher_->queued_requests(), 0);
}

TEST_F(BatcherTest, WaitingInstanceWakesWhenTheDelayPassesOnTheFakeClock) {
  Make(Options(8, Micros(2000)));
  Add(1);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  EXPECT_EQ(waiter.wait_for(milliseconds(20)), std::future_status::timeout);
  clock_.Advance(milliseconds(2));
  BatcherPoll poll = waiter.get();
  EXPECT_EQ(Ids(poll.batch.requests), (std::vector<RequestId>{1}));
}

TEST_F(BatcherTest, WaitingInstanceWakesWhenTheBatchFills) {
  Make(Options(2, Micros(1'000'000)));
  Add(1);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  Add(2);
  EXPECT_EQ(waiter.get().batch.samples, 2);
}

// Each time a waiting instance is woken counts: the hand-offs a request's path costs at the model.
TEST_F(BatcherTest, CountsTheWakeUpsOfWaitingInstances) {
  Make(Options(2, Micros(1'000'000)));
  EXPECT_EQ(batcher_->instance_wakeups(), 0);
  Add(1);
  Add(2);
  auto full = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  EXPECT_EQ(full.get().batch.samples, 2);
  EXPECT_EQ(batcher_->instance_wakeups(), 0) << "a full batch is taken without waiting";
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  EXPECT_EQ(waiter.wait_for(milliseconds(20)), std::future_status::timeout);
  Add(3);
  Add(4);
  EXPECT_EQ(waiter.get().batch.samples, 2);
  EXPECT_GE(batcher_->instance_wakeups(), 1);
}

// Blocks until `n` instances wait in WaitForBatch() (spinning or asleep).
void AwaitWaitingInstances(const DynamicBatcher& batcher, int n) {
  while (batcher.waiting_instances() < n) std::this_thread::sleep_for(milliseconds(1));
}

// An idle instance spinning on the empty queue takes an arrival without being woken. The spin is
// far longer than the test, so it cannot run out first.
TEST_F(BatcherTest, ASpinningInstanceTakesAnArrivalWithoutAWakeUp) {
  BatcherOptions o = Options(4, Micros(0));
  o.idle_spin = std::chrono::seconds(1000);
  Make(o);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  AwaitWaitingInstances(*batcher_, 1);
  Add(1);
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(Ids(waiter.get().batch.requests), (std::vector<RequestId>{1}));
  EXPECT_EQ(batcher_->spin_catches(), 1);
  EXPECT_EQ(batcher_->instance_wakeups(), 0);
}

TEST_F(BatcherTest, CloseEndsASpin) {
  BatcherOptions o = Options(4, Micros(0));
  o.idle_spin = std::chrono::seconds(1000);
  Make(o);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  AwaitWaitingInstances(*batcher_, 1);
  batcher_->Close();
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_TRUE(waiter.get().batch.requests.empty());
}

// A spin that runs out ends in the ordinary sleep, and an arrival then wakes the instance.
TEST_F(BatcherTest, AnInstanceWhoseSpinRanOutSleepsAndIsWoken) {
  BatcherOptions o = Options(4, Micros(0));
  o.idle_spin = Micros(100);
  Make(o);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  AwaitWaitingInstances(*batcher_, 1);
  std::this_thread::sleep_for(milliseconds(300));
  Add(1);
  ASSERT_EQ(waiter.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(Ids(waiter.get().batch.requests), (std::vector<RequestId>{1}));
  EXPECT_EQ(batcher_->spin_catches(), 0) << "the spin runs out long before the arrival";
  EXPECT_GE(batcher_->instance_wakeups(), 1);  // The fake clock's waits also end every 200 us.
}

// Instances that spin and sleep in turn, with arrivals, cancellations and a close racing them:
// every request leaves exactly once (in a batch, or cancelled), and every instance stops.
TEST_F(BatcherTest, SpinningInstancesLoseNothingUnderCancellationAndClose) {
  BatcherOptions o = Options(4, Micros(0));
  o.idle_spin = Micros(50);
  Make(o);
  constexpr int kInstances = 3;
  constexpr RequestId kRequests = 4000;
  std::atomic<int64_t> taken{0};
  std::vector<std::thread> instances;
  for (int i = 0; i < kInstances; ++i) {
    instances.emplace_back([&] {
      while (true) {
        BatcherPoll poll = batcher_->WaitForBatch();
        if (poll.batch.requests.empty() && poll.expired.empty()) return;
        taken += static_cast<int64_t>(poll.batch.requests.size());
      }
    });
  }
  int64_t cancelled = 0;
  for (RequestId id = 1; id <= kRequests; ++id) {
    Add(id);
    if (id % 3 == 0 && batcher_->Cancel(id) != nullptr) ++cancelled;
    if (id % 64 == 0) std::this_thread::sleep_for(Micros(id % 128 == 0 ? 200 : 20));
  }
  batcher_->Close();
  for (std::thread& t : instances) t.join();
  EXPECT_EQ(taken.load() + cancelled, kRequests);
  EXPECT_TRUE(batcher_->TakeAll().empty());
}

TEST_F(BatcherTest, ExpiryTimerReturnsExpiredRequestsWithoutAnInstance) {
  Make(Options(8, Micros(1'000'000)));
  auto timer = std::async(std::launch::async, [&] { return batcher_->WaitForExpiry(); });
  auto request = MakeRequest(7);
  request->deadline = clock_.Now() + milliseconds(3);
  ASSERT_TRUE(batcher_->Enqueue(request).ok());
  clock_.Advance(milliseconds(3));
  EXPECT_EQ(Ids(timer.get()), (std::vector<RequestId>{7}));
  auto closed = std::async(std::launch::async, [&] { return batcher_->WaitForExpiry(); });
  batcher_->Close();
  EXPECT_TRUE(closed.get().empty());
}

// --- The adaptive policy. ---

BatcherOptions Adaptive(int max_batch_size, Micros delay) {
  BatcherOptions o = Options(max_batch_size, delay);
  o.policy = BatchingPolicy::kAdaptive;
  return o;
}

// Costs with a fixed part: a batch of 8 costs 2 ms, one of 1 costs 1 ms (8x cheaper per sample
// at 8).
void SeedAmortisingCosts(BatchCostModel& costs) {
  for (int run = 0; run < 2; ++run) {  // Sizes count once measured twice.
    costs.Observe(1, 0.001);
    costs.Observe(8, 0.002);
  }
}

// One request at a time, nobody arriving while it waits: it goes at once, without the delay.
TEST_F(BatcherTest, AdaptiveDispatchesAtOnceAtLightLoad) {
  Make(Adaptive(8, Micros(2000)));
  SeedAmortisingCosts(batcher_->cost_model());
  for (RequestId id = 1; id <= 3; ++id) {
    Add(id);
    BatcherPoll poll = Poll();
    ASSERT_EQ(poll.batch.requests.size(), 1u) << "request " << id;
    EXPECT_EQ(poll.batch.requests[0]->times.dispatch, poll.batch.requests[0]->times.enqueue);
    clock_.Advance(Micros(5000));  // The client's think time: the queue stays empty.
  }
  EXPECT_EQ(batcher_->company_rate(), 0.0);
}

// Requests keep arriving while others wait (every instance busy): the company rate is high, a
// short queue waits for more, and a queue that holds a full batch goes full.
TEST_F(BatcherTest, AdaptiveFillsBatchesUnderHeavyLoad) {
  Make(Adaptive(8, Micros(2000)));
  SeedAmortisingCosts(batcher_->cost_model());
  RequestId id = 1;
  for (int i = 0; i < 20; ++i) {  // One request per 100 us, none taken: 10,000 per second.
    Add(id++);
    clock_.Advance(Micros(100));
  }
  EXPECT_GT(batcher_->company_rate(), 5000.0);
  for (int batch = 0; batch < 2; ++batch) {
    BatcherPoll poll = Poll();
    ASSERT_EQ(poll.batch.samples, 8) << "batch " << batch;
  }
  // Four left: at this rate 8 more come within the delay, and 8 cost half as much per sample as
  // 4 under these costs: it waits, until the oldest has waited the delay.
  BatcherPoll wait = Poll();
  EXPECT_TRUE(wait.batch.requests.empty());
  EXPECT_LT(wait.wake_at, Clock::time_point::max());
  Add(id++);
  Add(id++);
  Add(id++);
  Add(id++);
  EXPECT_EQ(Poll().batch.samples, 8);
}

// The instance idles while it waits, so company that comes slowly does not pay for the wait: at
// 1,000 requests a second, 4 more take 4 ms to come and save 0.6 ms of the 8's compute (2 ms
// against 1.4 ms for 4). Four go at once, where counting the compute alone would have held them.
TEST_F(BatcherTest, AdaptiveDoesNotIdleForCompanySlowerThanWhatItSaves) {
  Make(Adaptive(8, Micros(10'000)));
  SeedAmortisingCosts(batcher_->cost_model());
  RequestId id = 1;
  for (int i = 0; i < 20; ++i) {  // One request per millisecond, none taken.
    Add(id++);
    clock_.Advance(Micros(1000));
  }
  EXPECT_NEAR(batcher_->company_rate(), 1000.0, 100.0);
  ASSERT_EQ(Poll().batch.samples, 8);
  ASSERT_EQ(Poll().batch.samples, 8);
  EXPECT_EQ(Poll().batch.samples, 4);  // 6 ms of the delay left: 6 expected, none waited for.
}

// With another instance idle there is capacity to spare: a batch that would wait for company
// (as in AdaptiveFillsBatchesUnderHeavyLoad) goes at once. The instance waiting in WaitForBatch()
// for that company counts as idle too.
TEST_F(BatcherTest, AdaptiveDoesNotWaitWhileAnotherInstanceIsIdle) {
  BatcherOptions o = Adaptive(8, Micros(2000));
  o.instances = 2;
  Make(o);
  SeedAmortisingCosts(batcher_->cost_model());
  RequestId id = 1;
  for (int i = 0; i < 20; ++i) {  // 10,000 a second, none taken.
    Add(id++);
    clock_.Advance(Micros(100));
  }
  ASSERT_EQ(Poll().batch.samples, 8);
  ASSERT_EQ(Poll().batch.samples, 8);
  // Alone, the last four wait for company.
  ASSERT_TRUE(Poll().batch.requests.empty());
  // One instance waits for that company; the other frees and takes the four at once.
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  while (batcher_->waiting_instances() == 0) std::this_thread::yield();
  EXPECT_EQ(Poll().batch.samples, 4);
  batcher_->Close();
  EXPECT_TRUE(waiter.get().batch.requests.empty());
}

// Waiting does not pay when a batch costs the same per sample at every size, however busy.
TEST_F(BatcherTest, AdaptiveDoesNotWaitWhenCompanyLowersNoCost) {
  Make(Adaptive(8, Micros(2000)));
  for (int run = 0; run < 2; ++run) {
    batcher_->cost_model().Observe(1, 0.001);
    batcher_->cost_model().Observe(8, 0.008);
  }
  for (RequestId id = 1; id <= 12; ++id) {
    Add(id);
    clock_.Advance(Micros(100));
  }
  ASSERT_EQ(Poll().batch.samples, 8);
  EXPECT_EQ(Poll().batch.samples, 4);  // Goes at once: 8 would cost as much per sample.
}

// A partial batch of a size never run would run cold (a new shape's first run builds its plans):
// it goes at the largest size already run, if more than half of it, and the rest follows. Once a
// size has run, it goes whole.
TEST_F(BatcherTest, AdaptivePartialBatchesKeepToSizesAlreadyRun) {
  Make(Adaptive(64, Micros(0)));
  BatchCostModel& costs = batcher_->cost_model();
  for (int size = 1; size <= 64; size *= 2) costs.Seed(size, 0.010 * size);  // The warm-up.
  for (RequestId id = 1; id <= 46; ++id) Add(id);
  std::vector<int64_t> sizes;
  for (BatcherPoll poll = Poll(); !poll.batch.requests.empty(); poll = Poll()) {
    sizes.push_back(poll.batch.samples);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{32, 8, 4, 2}));
  costs.Observe(46, 0.46);
  for (RequestId id = 100; id < 146; ++id) Add(id);
  EXPECT_EQ(Poll().batch.samples, 46);
}

// A batch of 64 runs slower per sample than one of 32: batches stop at 32.
TEST_F(BatcherTest, AdaptiveBatchSizeIsTheCheapestPerSample) {
  Make(Adaptive(64, Micros(2000)));
  BatchCostModel& costs = batcher_->cost_model();
  for (int run = 0; run < 2; ++run) {
    costs.Observe(8, 0.080);   // 10 ms a sample.
    costs.Observe(32, 0.256);  // 8 ms a sample: the cheapest.
    costs.Observe(64, 0.640);  // 10 ms a sample.
  }
  EXPECT_EQ(costs.BestSize(64), 32);
  costs.Observe(16, 0.016);  // 1 ms a sample, but one run: not chosen yet.
  EXPECT_EQ(costs.BestSize(64), 32);
  costs.Observe(16, 0.016);
  EXPECT_EQ(costs.BestSize(64), 16);
  for (int run = 0; run < 8; ++run) costs.Observe(16, 0.256);  // Dearer now: 32 wins again.
  EXPECT_EQ(costs.BestSize(64), 32);
  for (RequestId id = 1; id <= 70; ++id) Add(id);
  EXPECT_EQ(Poll().batch.samples, 32);
  EXPECT_EQ(Poll().batch.samples, 32);
  // A request larger than the chosen size still runs, alone.
  Make(Adaptive(64, Micros(0)));
  for (int run = 0; run < 2; ++run) {
    batcher_->cost_model().Observe(8, 0.080);
    batcher_->cost_model().Observe(32, 0.256);
    batcher_->cost_model().Observe(64, 0.640);
  }
  Add(1, 40);
  EXPECT_EQ(Poll().batch.samples, 40);
}

// A queue holding more than the budget's worth of batches refuses at once, with a retry-after
// from the predicted wait; so does one a request's own deadline cannot wait out.
TEST_F(BatcherTest, AdmissionRefusesARequestWhosePredictedWaitExceedsTheBudget) {
  BatcherOptions o = Options(8, Micros(2000));
  o.max_queue_time = Micros(1'000'000);
  o.instances = 2;
  Make(o);
  batcher_->cost_model().Observe(8, 0.100);  // 100 ms a batch of 8, two instances.
  // 168 samples queued are 21 full batches ahead: 21 x 100 ms / 2 = 1.05 s. With 167 the 168th
  // waits for 20: 1 s, within the budget.
  for (RequestId id = 1; id <= 168; ++id) Add(id);
  auto late = MakeRequest(169, 1);
  Status refused = batcher_->Enqueue(late);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("predicted queue wait 1050 ms exceeds the model's queue-time "
                                   "budget (1000 ms)"),
            std::string::npos)
      << refused.message();
  EXPECT_NEAR(refused.retry_after_seconds(), 0.05, 1e-9);
  ASSERT_NE(late, nullptr);  // Left with the caller, who answers it.
  EXPECT_EQ(batcher_->queued_samples(), 168);
  // Asked before a body is read, the same answer, and nothing is queued.
  Status at_header = batcher_->Admit(1, std::nullopt).status();
  EXPECT_EQ(at_header.code(), StatusCode::kUnavailable);
  EXPECT_EQ(at_header.message(), refused.message());
  EXPECT_NEAR(at_header.retry_after_seconds(), 0.05, 1e-9);
  EXPECT_EQ(batcher_->queued_samples(), 168);
  EXPECT_EQ(batcher_->incoming_samples(), 0);

  // Requests admitted at their header and still being read count as queued ahead of later ones:
  // 160 queued and 8 admitted are 21 batches ahead again; letting the tickets go admits anew.
  Make(o);
  batcher_->cost_model().Observe(8, 0.100);
  batcher_->cost_model().Observe(8, 0.100);
  for (RequestId id = 1; id <= 160; ++id) Add(id);
  std::vector<std::shared_ptr<const void>> tickets = AdmitAll(8);
  EXPECT_EQ(batcher_->incoming_samples(), 8);
  EXPECT_EQ(batcher_->Admit(1, std::nullopt).status().code(), StatusCode::kUnavailable);
  auto behind = MakeRequest(161, 1);
  EXPECT_EQ(batcher_->Enqueue(behind).code(), StatusCode::kUnavailable);
  tickets.pop_back();
  EXPECT_EQ(batcher_->incoming_samples(), 7);
  EXPECT_TRUE(batcher_->Admit(1, std::nullopt).ok());
  tickets.clear();
  EXPECT_EQ(batcher_->incoming_samples(), 0);

  // A deadline 300 ms away with 450 ms of work ahead: refused, naming the deadline.
  Make(o);
  batcher_->cost_model().Observe(8, 0.100);
  for (RequestId id = 1; id <= 72; ++id) Add(id);  // 9 full batches ahead: 450 ms.
  auto hurried = MakeRequest(73, 1);
  hurried->deadline = clock_.Now() + Micros(300'000);
  Status missed = batcher_->Enqueue(hurried);
  EXPECT_EQ(missed.code(), StatusCode::kUnavailable);
  EXPECT_NE(missed.message().find("predicted queue wait 450 ms and run 100 ms exceed the request's "
                                  "deadline (300 ms)"),
            std::string::npos)
      << missed.message();
  // A batch slower than the budget still admits what it can start at once: an empty queue waits
  // for nothing.
  Make(o);
  batcher_->cost_model().Observe(8, 5.0);
  Add(1);
  // Without a known cost nothing is predicted and nothing refused.
  Make(o);
  for (RequestId id = 1; id <= 500; ++id) Add(id);
  EXPECT_TRUE(batcher_->Admit(1, std::nullopt).ok());
  // A queue with no room refuses at the header too; so does a closed batcher.
  o.max_queue_size = 500;
  Make(o);
  for (RequestId id = 1; id <= 500; ++id) Add(id);
  EXPECT_NE(batcher_->Admit(1, std::nullopt).status().message().find("queue full"),
            std::string::npos);
  batcher_->Close();
  EXPECT_NE(batcher_->Admit(1, std::nullopt).status().message().find("stopping"),
            std::string::npos);
}

// Requests that wait three times what was predicted (the batch running when they came, cores
// shared with other work) raise the factor predictions are scaled by, so the queue that was
// admitted before is refused now; waits as predicted bring it back towards 1.
TEST_F(BatcherTest, AdmissionLearnsFromObservedWaits) {
  BatcherOptions o = Options(8, Micros(0));
  o.max_queue_time = Micros(1'000'000);
  Make(o);
  batcher_->cost_model().Seed(8, 0.100);
  EXPECT_EQ(batcher_->wait_calibration(), 1.0);
  // 72 queued: the 73rd waits for 9 batches, 900 ms: admitted.
  for (RequestId id = 1; id <= 72; ++id) Add(id);
  auto admitted = MakeRequest(73, 1);
  ASSERT_TRUE(batcher_->Enqueue(admitted).ok());
  // The queue drains three times slower than predicted: a batch of 8 leaves every 300 ms.
  for (int batch = 0; batch < 9; ++batch) {
    clock_.Advance(Micros(300'000));
    ASSERT_EQ(Poll().batch.samples, 8) << batch;
  }
  const double factor = batcher_->wait_calibration();
  EXPECT_GT(factor, 2.5);  // Each batch waited 3i/(i - 1) times its prediction.
  EXPECT_LT(factor, 6.0);
  // The same budget now takes a queue of at most 1 s / (factor x 100 ms) batches: before, 80
  // samples (a 73rd was admitted after 72); now the first refusal comes after far fewer.
  Poll();  // The 73rd leaves.
  // After a quiet spell the rate the queue drained at is forgotten; the factor is not, and it
  // scales the cost model's predictions, which stand alone until the queue is seen draining again.
  clock_.Advance(Micros(10'000'000));
  EXPECT_EQ(batcher_->drain_rate(), 0.0);
  Status refusal;
  RequestId next = 100;
  const int taken = EnqueueUntilRefused(next, 100, refusal);
  EXPECT_EQ(refusal.code(), StatusCode::kUnavailable);
  EXPECT_NE(refusal.message().find("exceeds the model's queue-time budget"), std::string::npos);
  EXPECT_GE(taken, 8 * static_cast<int>(1.0 / (0.1 * factor)));
  EXPECT_LE(taken, 8 * (static_cast<int>(1.0 / (0.1 * factor)) + 1));
  while (!Poll().batch.requests.empty()) {
  }
  // Waits as predicted pull the factor back towards 1: two batches queued, the second leaves
  // after the first's 100 ms.
  for (int round = 0; round < 30; ++round) {
    for (RequestId id = 0; id < 16; ++id) Add(1000 + round * 16 + id);
    Poll();
    clock_.Advance(Micros(100'000));
    Poll();
  }
  EXPECT_LT(batcher_->wait_calibration(), 1.2);
}

// The cost model says a batch of 8 takes 4 ms, but the queue hands out only 8 samples every
// 200 ms (the cores busy with other work): the samples ahead over that drain rate predict the
// wait, and the queue is refused at about a second of it, not at the cost model's 250 batches.
TEST_F(BatcherTest, AdmissionPredictsFromTheRateTheQueueDrains) {
  BatcherOptions o = Options(8, Micros(0));
  o.max_queue_time = Micros(1'000'000);
  Make(o);
  batcher_->cost_model().Seed(8, 0.004);
  EXPECT_EQ(batcher_->drain_rate(), 0.0);  // Nothing seen yet.
  RequestId id = 1;
  for (; id <= 16; ++id) Add(id);
  for (int batch = 0; batch < 10; ++batch) {
    clock_.Advance(Micros(200'000));
    ASSERT_EQ(Poll().batch.samples, 8) << batch;
    for (int i = 0; i < 8; ++i) Add(id++);
  }
  // Predictions stayed under the calibration floor (one batch ahead: 4 ms): nothing to learn
  // there, and the cost model alone would admit 2,000 samples.
  EXPECT_EQ(batcher_->wait_calibration(), 1.0);
  const double rate = batcher_->drain_rate();
  EXPECT_NEAR(rate, 40.0, 4.0);  // 8 samples a 200 ms; the latest batch weighs the most.
  Status refusal;
  const int taken = EnqueueUntilRefused(id, 100, refusal);
  EXPECT_EQ(refusal.code(), StatusCode::kUnavailable);
  EXPECT_NE(refusal.message().find("exceeds the model's queue-time budget (1000 ms)"),
            std::string::npos)
      << refusal.message();
  // Refused once the samples ahead (16 queued, then those taken) exceed a second's drain.
  const int ahead = 16 + taken;
  EXPECT_LE((ahead - 1) / rate, 1.0);
  EXPECT_GT(ahead / rate, 1.0);
  EXPECT_NEAR(refusal.retry_after_seconds(), ahead / rate - 1.0, 1e-6);
  // The rate is the queue's: drained as fast as the cost model says (8 every 4 ms), the queue
  // more than doubles it, and as many samples as were refused are admitted again.
  while (batcher_->queued_samples() > 0) {
    clock_.Advance(Micros(4'000));
    Poll();
  }
  EXPECT_GT(batcher_->drain_rate(), 2 * rate);
  for (int i = 0; i <= ahead; ++i) Add(id++);
}

// A request an idle instance holds back for company (the fixed policy's delay) has not waited
// for capacity: that time is no drain, so a quiet server's delays do not make the queue look slow
// (and refuse the burst that follows). Time a backlog waits with no instance free is.
TEST_F(BatcherTest, WaitingForCompanyIsNotDrainTime) {
  BatcherOptions o = Options(8, Micros(200'000));
  o.max_queue_time = Micros(1'000'000);
  Make(o);
  batcher_->cost_model().Seed(8, 0.004);
  Add(1);
  auto waiter = std::async(std::launch::async, [&] { return batcher_->WaitForBatch(); });
  EXPECT_EQ(waiter.wait_for(milliseconds(20)), std::future_status::timeout);
  clock_.Advance(Micros(200'000));
  EXPECT_EQ(waiter.get().batch.samples, 1);
  EXPECT_EQ(batcher_->drain_rate(), 0.0);
  for (RequestId id = 2; id <= 9; ++id) Add(id);  // A burst: admitted.
  clock_.Advance(Micros(100'000));                // No instance comes for 100 ms.
  EXPECT_EQ(Poll().batch.samples, 8);
  EXPECT_NEAR(batcher_->drain_rate(), (std::exp(-0.1) + 8) / 0.1, 1e-6);  // The first decayed.
}

// The time a request admitted at its header takes to be queued (its body read and decoded) is
// learned from the tickets and counts towards the next header's predicted wait: when bodies take
// seconds to arrive, an empty queue no longer admits everyone.
TEST_F(BatcherTest, HeaderAdmissionCountsTheTimeBodiesTakeToArrive) {
  BatcherOptions o = Options(8, Micros(0));
  o.max_queue_time = Micros(2'000'000);
  Make(o);
  batcher_->cost_model().Seed(8, 0.010);
  EXPECT_EQ(batcher_->intake_seconds(), 0.0);
  {  // One slow upload (60 s) counts for the budget's 2 s at most.
    auto slow = batcher_->Admit(1, std::nullopt);
    ASSERT_TRUE(slow.ok());
    clock_.Advance(Micros(60'000'000));
  }
  EXPECT_NEAR(batcher_->intake_seconds(), 0.2, 1e-9);
  clock_.Advance(Micros(100'000'000));  // Faded away.
  EXPECT_LT(batcher_->intake_seconds(), 1e-9);
  {
    // Ten headers admitted together, their bodies 3 s in coming.
    std::vector<std::shared_ptr<const void>> tickets = AdmitAll(10);
    EXPECT_EQ(batcher_->incoming_samples(), 10);
    clock_.Advance(Micros(3'000'000));
  }
  EXPECT_EQ(batcher_->incoming_samples(), 0);
  // Each report capped at 2 s; the estimate starts from what was left of the slow one (~0).
  const double learned = 2.0 * (1.0 - std::pow(0.9, 10));  // 1.30 s.
  EXPECT_NEAR(batcher_->intake_seconds(), learned, 1e-6);
  // A header whose own deadline is 1 s away is refused: its intake and its own batch (10 ms)
  // would end past it.
  const Status refused = batcher_->Admit(1, clock_.Now() + Micros(1'000'000)).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NEAR(refused.retry_after_seconds(), learned + 0.010 - 1.0, 1e-6);
  // A request already read is not charged the intake again.
  auto queued = MakeRequest(1, 1);
  EXPECT_TRUE(batcher_->Enqueue(queued).ok());
  // With every header refused no ticket reports: the estimate fades, by e a second, and headers
  // are admitted again; bodies that then arrive at once bring it down for good.
  clock_.Advance(Micros(1'000'000));
  EXPECT_NEAR(batcher_->intake_seconds(), learned / std::exp(1.0), 1e-6);
  EXPECT_TRUE(batcher_->Admit(1, std::nullopt).ok());
  for (int round = 0; round < 30; ++round) (void)batcher_->Admit(1, std::nullopt);
  EXPECT_LT(batcher_->intake_seconds(), 0.05);
}

// With a latency objective, a request whose queue wait plus its own batch would pass it is
// refused (Retry-After the excess), and batches keep to sizes that run in half of it.
TEST_F(BatcherTest, LatencyObjectiveBoundsAdmissionAndTheBatchSize) {
  BatcherOptions o = Adaptive(64, Micros(0));
  o.latency_target = Micros(210'000);  // 210 ms.
  Make(o);
  BatchCostModel& costs = batcher_->cost_model();
  for (int size = 1; size <= 64; size *= 2) costs.Seed(size, 0.004 * size);  // 4 ms a sample.
  // Every size costs the same per sample: the largest within 105 ms, 26 samples (104 ms), is the
  // target; 64 would run 256 ms, past the whole objective.
  EXPECT_EQ(costs.LargestWithin(0.105, 64), 26);
  EXPECT_EQ(batcher_->target_batch_size(), 26);
  // 26 queued: one batch ahead (104 ms) plus the request's own (104 ms) fits 210 ms; 52 queued:
  // 312 ms does not.
  for (RequestId id = 1; id <= 26; ++id) Add(id);
  EXPECT_TRUE(batcher_->Admit(1, std::nullopt).ok());
  for (RequestId id = 27; id <= 52; ++id) Add(id);
  auto late = MakeRequest(53, 1);
  const Status refused = batcher_->Enqueue(late);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("predicted latency 312 ms (queue 208 ms, batch 104 ms) exceeds "
                                   "the model's SLO p99 of 210 ms"),
            std::string::npos)
      << refused.message();
  EXPECT_NEAR(refused.retry_after_seconds(), 0.102, 1e-9);
  EXPECT_EQ(Poll().batch.samples, 26);
}

// Full batches now and then go at a size the cost model has not measured, so that it learns
// whether a smaller size is cheaper per sample.
TEST_F(BatcherTest, AdaptiveMeasuresSmallerSizesNowAndThen) {
  Make(Adaptive(8, Micros(0)));
  BatchCostModel& costs = batcher_->cost_model();
  for (int i = 0; i < 2; ++i) {
    costs.Observe(1, 0.004);
    costs.Observe(2, 0.004);
    costs.Observe(8, 0.008);
  }
  for (RequestId id = 1; id <= 8 * DynamicBatcher::kExploreEvery; ++id) Add(id);
  std::vector<int64_t> sizes;
  for (int64_t b = 0; b < DynamicBatcher::kExploreEvery; ++b) sizes.push_back(Poll().batch.samples);
  std::vector<int64_t> want(static_cast<size_t>(DynamicBatcher::kExploreEvery), 8);
  want.back() = 4;  // 4 has never run: the eighth full batch measures it.
  EXPECT_EQ(sizes, want);
}

TEST(BatchCostModelTest, SmoothsEachSizeAndEstimatesTheOthers) {
  BatchCostModel costs;
  EXPECT_EQ(costs.Estimate(4), 0.0);
  EXPECT_EQ(costs.BestSize(16), 16);  // Nothing known: the limit.
  costs.Observe(4, 0.100);            // Cold: a first run at a new shape.
  EXPECT_DOUBLE_EQ(costs.Estimate(4), 0.100);
  costs.Observe(4, 0.004);  // Replaces the cold run.
  EXPECT_DOUBLE_EQ(costs.Estimate(4), 0.004);
  costs.Observe(4, 0.014);  // 0.004 + 0.2 x (0.014 - 0.004)
  EXPECT_DOUBLE_EQ(costs.Estimate(4), 0.006);
  costs.Observe(0, 1.0);     // Ignored.
  costs.Observe(2, -1.0);    // Ignored.
  costs.Observe(12, 0.500);  // Cold, and alone: not trusted while 4 is known warm...
  EXPECT_DOUBLE_EQ(costs.Estimate(12), 0.006 * 12 / 4);  // ...so 4's time per sample.
  EXPECT_EQ(costs.BestSize(12), 12);  // The limit, estimated, ties with 4: the larger wins.
  costs.Observe(12, 0.010);
  EXPECT_DOUBLE_EQ(costs.Estimate(8), 0.008);   // Halfway between 4 and 12.
  EXPECT_DOUBLE_EQ(costs.Estimate(2), 0.006);   // Below the smallest: its time.
  EXPECT_DOUBLE_EQ(costs.Estimate(24), 0.020);  // Above the largest: its time per sample.
  EXPECT_DOUBLE_EQ(costs.PerSample(12), 0.010 / 12);
  EXPECT_EQ(costs.BestSize(12), 12);
  EXPECT_EQ(costs.BestSize(16), 16);  // Never run: its estimate ties with 12's, the larger wins.
  EXPECT_EQ(costs.BestSize(8), 8);    // Interpolated: cheaper per sample than 4.
  costs.Seed(16, 0.032);              // Warmed up, and dearer per sample than 12.
  EXPECT_EQ(costs.BestSize(16), 12);
  // Powers of two below 16 with no warm figure, the largest first.
  EXPECT_EQ(costs.SizeToExplore(16), 8);
  costs.Observe(8, 0.008);
  EXPECT_EQ(costs.SizeToExplore(16), 8);  // One cold run is not a figure.
  costs.Observe(8, 0.008);
  EXPECT_EQ(costs.SizeToExplore(16), 2);  // 4 is known; 2 and 1 never ran.
  const auto entries = costs.Snapshot();
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[0].samples, 4);
  EXPECT_EQ(entries[0].batches, 3);
}

TEST(BatchCostModelTest, ASlowRunIsTheMeanPlusTwiceTheRunsSpread) {
  BatchCostModel costs;
  costs.Observe(1, 0.500);  // Cold.
  costs.Observe(1, 0.050);  // Replaces it; no spread yet.
  EXPECT_DOUBLE_EQ(costs.EstimateSlow(1), 0.050);
  costs.Observe(1, 0.100);  // Spread 0.2 x 0.050; mean 0.060.
  EXPECT_DOUBLE_EQ(costs.Estimate(1), 0.060);
  EXPECT_DOUBLE_EQ(costs.EstimateSlow(1), 0.060 + 2 * 0.010);
  EXPECT_DOUBLE_EQ(costs.Snapshot()[0].spread, 0.010);
  // Sizes not known are estimated from their neighbours' slow runs: above the largest, its
  // slow time per sample.
  EXPECT_DOUBLE_EQ(costs.EstimateSlow(4), 4 * 0.080);
  // Steady runs bring the slow run back to the mean.
  for (int i = 0; i < 200; ++i) costs.Observe(1, 0.060);
  EXPECT_NEAR(costs.EstimateSlow(1), costs.Estimate(1), 1e-9);
  // A seed (a warm-up) says nothing of the spread.
  costs.Seed(2, 0.070);
  EXPECT_DOUBLE_EQ(costs.EstimateSlow(2), 0.070);
}

// A cold first run at a new size (seen serving resnet18: 55 ms a sample at 18, against 16 ms at
// batch 1) must not keep the batcher at batch 1: it is not chosen on, not used to estimate the
// others, and the limit stays a candidate until it has run warm.
TEST(BatchCostModelTest, AColdFirstRunDoesNotDecideTheBatchSize) {
  BatchCostModel costs;
  costs.Seed(1, 0.016);
  costs.Observe(18, 0.99);
  costs.Observe(19, 1.57);
  EXPECT_EQ(costs.BestSize(64), 64);
  EXPECT_DOUBLE_EQ(costs.Estimate(64), 0.016 * 64);
  costs.Observe(18, 0.234);  // Warm: 13 ms a sample.
  EXPECT_EQ(costs.BestSize(18), 18);
  EXPECT_EQ(costs.BestSize(64), 64);  // 19's cold run says nothing; 64 is estimated from 18.
  costs.Observe(64, 3.0);             // Cold at the limit: still estimated from 18.
  EXPECT_EQ(costs.BestSize(64), 64);
  costs.Observe(64, 1.6);  // Warm: 25 ms a sample, dearer than 18.
  EXPECT_EQ(costs.BestSize(64), 18);
}

TEST(SameSampleShapeTest, ComparesEverythingButTheBatchDimension) {
  auto a = MakeRequest(1, 1, 2);
  auto b = MakeRequest(2, 5, 2);
  auto c = MakeRequest(3, 1, 3);
  EXPECT_TRUE(SameSampleShape(*a, *b));
  EXPECT_FALSE(SameSampleShape(*a, *c));
  b->inputs[0] = Tensor::Zeros(DataType::kInt64, {5, 2});
  EXPECT_FALSE(SameSampleShape(*a, *b));
}

}  // namespace
}  // namespace sluice
