// Model scheduler and registry: instance pool, per-request retry, deadlines and cancellation
// while instances are busy, drain on stop, statistics. Instances are echo fakes; where time
// matters the clock is a FakeClock, and no test sleeps.
#include "engine/model_scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>

#include "common/handoff_batch.h"
#include "engine/engine.h"
#include "engine/fake_backends.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using testing::EchoBackend;
using testing::EchoInstance;
using testing::EchoLog;
using testing::kFailMarker;

ModelConfig EchoConfig(int max_batch_size, Micros delay, int instances = 1) {
  ModelConfig c;
  c.name = "echo";
  c.max_batch_size = max_batch_size;
  // The fixed policy: these tests hold requests for a known delay; the adaptive policy's rules
  // have their own tests beside the batcher.
  c.dynamic_batching.adaptive = false;
  c.dynamic_batching.max_queue_delay = delay;
  c.instances.count = instances;
  c.instances.threads = 1;
  c.inputs = {{"x", DataType::kFp32, {2}}};
  c.outputs = {{"y", DataType::kFp32, {2}}};
  return c;
}

// Collects every completion; thread-safe.
class Responses {
 public:
  InferCallback Callback(int tag) {
    return [this, tag](InferResponse&& response) {
      std::lock_guard lock(mu_);
      ++calls_[tag];
      responses_[tag] = std::move(response);
      cv_.notify_all();
    };
  }
  // Waits for `tag`'s response.
  InferResponse Get(int tag) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return responses_.count(tag) > 0; });
    return responses_[tag];
  }
  bool Has(int tag) {
    std::lock_guard lock(mu_);
    return responses_.count(tag) > 0;
  }
  int Calls(int tag) {
    std::lock_guard lock(mu_);
    return calls_[tag];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, InferResponse> responses_;
  std::map<int, int> calls_;
};

// `samples` rows whose values are tag*100 + row*2 + column, so outputs identify their request.
std::unique_ptr<InferRequest> Request(Responses& responses, int tag, int64_t samples = 1) {
  auto request = std::make_unique<InferRequest>();
  Tensor x = Tensor::Zeros(DataType::kFp32, {samples, 2});
  auto values = x.mutable_values<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(tag * 100 + i);
  request->inputs.push_back(std::move(x));
  request->done = responses.Callback(tag);
  return request;
}

void ExpectEchoed(const InferResponse& response, int tag, int64_t samples = 1) {
  ASSERT_TRUE(response.status.ok()) << response.status.message();
  ASSERT_EQ(response.outputs.size(), 1u);
  ASSERT_EQ(response.outputs[0].shape(), (Shape{samples, 2}));
  auto values = response.outputs[0].values<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(values[i], static_cast<float>(tag * 100 + i)) << "request " << tag << " value " << i;
  }
}

// An echo instance compiled for batches of 1, 2, 4, 8 (as a bucketed package is) that keeps a
// copy of the last batch it ran.
class BucketedEchoInstance : public EchoInstance {
 public:
  explicit BucketedEchoInstance(EchoLog* log) : EchoInstance(log) {}
  int64_t BatchRows(int64_t samples) const override {
    int64_t rows = 1;
    while (rows < samples) rows *= 2;
    return rows;
  }
  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    const Tensor& x = inputs[0];
    if (x.shape()[0] != BatchRows(x.shape()[0])) {
      return Status::Internal("batch not laid out at a bucket's size");
    }
    last_input_ = std::vector<float>(x.values<float>().begin(), x.values<float>().end());
    return EchoInstance::Run(inputs);
  }
  std::vector<float> last_input_;  // Read by the test once the instance is idle.
};

class SchedulerTest : public ::testing::Test {
 protected:
  void Start(ModelConfig config, Clock& clock = Clock::Real(), bool bucketed = false) {
    std::vector<std::shared_ptr<BackendInstance>> instances;
    for (int i = 0; i < config.instances.count; ++i) {
      if (bucketed) {
        bucketed_ = std::make_shared<BucketedEchoInstance>(&log_);
        instances.push_back(bucketed_);
      } else {
        instances.push_back(std::make_shared<EchoInstance>(&log_));
      }
    }
    auto scheduler = ModelScheduler::Start(std::move(config), std::move(instances), clock);
    ASSERT_TRUE(scheduler.ok()) << scheduler.status().message();
    scheduler_ = std::move(*scheduler);
  }
  RequestId Submit(int tag, int64_t samples = 1) {
    auto id = scheduler_->Submit(Request(responses_, tag, samples));
    EXPECT_TRUE(id.ok()) << id.status().message();
    return id.ok() ? *id : 0;
  }
  // Holds the single instance busy with request `tag`.
  void Occupy(int tag, int64_t samples = 1) {
    log_.CloseGate();
    Submit(tag, samples);
    log_.WaitForBatchesStarted(1);
  }

  // On one instance (max batch 8, no delay): request 1 runs alone while requests 2-4 queue, then
  // they run as one batch. `submit` submits the request of a tag.
  void OneAloneThenThreeTogether(const std::function<void(int)>& submit) {
    Start(EchoConfig(8, Micros(0)));
    log_.CloseGate();
    submit(1);
    log_.WaitForBatchesStarted(1);
    for (int tag = 2; tag <= 4; ++tag) submit(tag);
    log_.OpenGate();
  }

  // Declared before the scheduler, which must stop before they go.
  FakeClock fake_clock_;
  EchoLog log_;
  Responses responses_;
  std::shared_ptr<BucketedEchoInstance> bucketed_;
  std::unique_ptr<ModelScheduler> scheduler_;
};

TEST_F(SchedulerTest, EachRequestGetsItsOwnRowsBackFromASharedBatch) {
  Start(EchoConfig(8, Micros(0)));
  Occupy(1);
  Submit(2, 3);
  Submit(3, 1);
  Submit(4, 2);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(1), 1);
  InferResponse r2 = responses_.Get(2);
  ExpectEchoed(r2, 2, 3);
  ExpectEchoed(responses_.Get(3), 3);
  ExpectEchoed(responses_.Get(4), 4, 2);
  EXPECT_EQ(r2.batch_size, 6);
  EXPECT_EQ(r2.batch_id, responses_.Get(4).batch_id);
  EXPECT_NE(r2.batch_id, responses_.Get(1).batch_id);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 6}));
}

// A batch is laid out at the instance's bucket size in one copy: the requests' rows, then zero
// rows; each request gets only its own rows back. A single request smaller than its bucket is
// padded the same way.
TEST_F(SchedulerTest, BatchesArePaddedToTheInstancesBucketOnce) {
  Start(EchoConfig(8, Micros(0)), Clock::Real(), /*bucketed=*/true);
  Occupy(1, 3);
  Submit(2, 2);
  Submit(3, 1);
  Submit(4, 2);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(1), 1, 3);
  ExpectEchoed(responses_.Get(2), 2, 2);
  ExpectEchoed(responses_.Get(3), 3);
  InferResponse r4 = responses_.Get(4);
  ExpectEchoed(r4, 4, 2);
  EXPECT_EQ(r4.batch_size, 5);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{4, 8}));
  // Rows 5..7 of the last batch (two floats a row) are the padding.
  const std::vector<float>& last = bucketed_->last_input_;
  ASSERT_EQ(last.size(), 16u);
  EXPECT_EQ(last[0], 200.0f);
  EXPECT_EQ(last[9], 403.0f);
  for (size_t i = 10; i < last.size(); ++i) EXPECT_EQ(last[i], 0.0f) << "value " << i;
}

// The answers of one batch that hand work to another thread (as the HTTP server's do, to the
// connection's I/O thread) reach it in one delivery, in the batch's order.
TEST_F(SchedulerTest, ABatchsAnswersAreHandedOffTogether) {
  struct Sink : HandOffBatch::Sink {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<int>> deliveries;
    void Deliver(std::vector<std::function<void()>> works) override {
      std::lock_guard lock(mu);
      deliveries.emplace_back();
      for (auto& work : works) work();
      cv.notify_all();
    }
  } sink;
  auto submit = [&](int tag) {
    auto request = Request(responses_, tag);
    request->done = [&sink, tag](InferResponse&&) {
      std::function<void()> work = [&sink, tag] { sink.deliveries.back().push_back(tag); };
      // Not gathered: a delivery of its own, as a plain hand-off would be.
      if (!HandOffBatch::Gather(sink, work)) sink.Deliver({std::move(work)});
    };
    ASSERT_TRUE(scheduler_->Submit(std::move(request)).ok());
  };
  OneAloneThenThreeTogether(submit);
  std::unique_lock lock(sink.mu);
  ASSERT_TRUE(sink.cv.wait_for(lock, std::chrono::seconds(10), [&] {
    return sink.deliveries.size() == 2 && sink.deliveries[1].size() == 3;
  }));
  EXPECT_EQ(sink.deliveries, (std::vector<std::vector<int>>{{1}, {2, 3, 4}}));
}

// A batch of one completes in place (its answer may be sent from the instance's thread); the
// answers of a larger batch are handed off together instead.
TEST_F(SchedulerTest, OnlyABatchOfOneCompletesInPlace) {
  std::mutex mu;
  std::map<int, bool> in_place;
  auto submit = [&](int tag) {
    auto request = Request(responses_, tag);
    InferCallback echo = std::move(request->done);
    request->done = [&, tag, echo = std::move(echo)](InferResponse&& response) mutable {
      {
        std::lock_guard lock(mu);
        in_place[tag] = HandOffBatch::InPlace();
      }
      echo(std::move(response));
    };
    ASSERT_TRUE(scheduler_->Submit(std::move(request)).ok());
  };
  OneAloneThenThreeTogether(submit);
  for (int tag = 1; tag <= 4; ++tag) ExpectEchoed(responses_.Get(tag), tag);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 3}));
  std::lock_guard lock(mu);
  EXPECT_EQ(in_place, (std::map<int, bool>{{1, true}, {2, false}, {3, false}, {4, false}}));
}

TEST_F(SchedulerTest, NoDispatchWhileEveryInstanceIsBusy) {
  // With no delay at all, requests would go one by one if anything dispatched them early; the
  // second batch holding all three proves they waited for the instance.
  Start(EchoConfig(8, Micros(0)));
  Occupy(1);
  for (int tag = 2; tag <= 4; ++tag) Submit(tag);
  EXPECT_EQ(scheduler_->stats().queued_requests, 3);
  log_.OpenGate();
  for (int tag = 1; tag <= 4; ++tag) ExpectEchoed(responses_.Get(tag), tag);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 3}));
}

TEST_F(SchedulerTest, EveryInstanceRunsOnItsOwnAttachedThread) {
  Start(EchoConfig(1, Micros(0), /*instances=*/3));
  EXPECT_EQ(log_.attached(), 3);
  for (int tag = 1; tag <= 30; ++tag) Submit(tag);
  // EchoInstance fails any call from a thread it is not attached to.
  for (int tag = 1; tag <= 30; ++tag) ExpectEchoed(responses_.Get(tag), tag);
}

TEST_F(SchedulerTest, FailingBatchIsRetriedRequestByRequest) {
  Start(EchoConfig(8, Micros(0)));
  Occupy(1);
  Submit(2);
  auto bad = Request(responses_, 3);
  bad->inputs[0].mutable_values<float>()[1] = kFailMarker;
  ASSERT_TRUE(scheduler_->Submit(std::move(bad)).ok());
  Submit(4);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(2), 2);
  ExpectEchoed(responses_.Get(4), 4);
  InferResponse failed = responses_.Get(3);
  EXPECT_EQ(failed.status.code(), StatusCode::kInternal);
  EXPECT_EQ(failed.status.message(), "marker input");
  // The batch of three, then each request alone.
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 3, 1, 1, 1}));
  ModelStatsSnapshot stats = scheduler_->stats();
  EXPECT_EQ(stats.failed_batches, 1);
  EXPECT_EQ(stats.requests(StatusCode::kOk), 3);
  EXPECT_EQ(stats.requests(StatusCode::kInternal), 1);
}

TEST_F(SchedulerTest, SingleRequestFailureIsNotRetried) {
  Start(EchoConfig(8, Micros(0)));
  auto bad = Request(responses_, 1);
  bad->inputs[0].mutable_values<float>()[0] = kFailMarker;
  ASSERT_TRUE(scheduler_->Submit(std::move(bad)).ok());
  EXPECT_EQ(responses_.Get(1).status.code(), StatusCode::kInternal);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1}));
}

TEST_F(SchedulerTest, DeadlinePassesWhileTheInstanceIsBusy) {
  FakeClock& clock = fake_clock_;
  Start(EchoConfig(8, Micros(0)), clock);
  Occupy(1);
  auto request = Request(responses_, 2);
  request->deadline = clock.Now() + milliseconds(5);
  ASSERT_TRUE(scheduler_->Submit(std::move(request)).ok());
  Submit(3);
  clock.Advance(milliseconds(5));
  // Answered by the timer while the only instance is still held at the gate.
  InferResponse expired = responses_.Get(2);
  EXPECT_EQ(expired.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(expired.batch_id, 0u);
  EXPECT_EQ(scheduler_->stats().queued_requests, 1);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(3), 3);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 1}));  // Request 2 never ran.
}

TEST_F(SchedulerTest, DefaultTimeoutFromTheConfigApplies) {
  FakeClock& clock = fake_clock_;
  ModelConfig config = EchoConfig(8, Micros(0));
  config.dynamic_batching.default_timeout = Micros(3000);
  Start(config, clock);
  Occupy(1);
  Submit(2);
  clock.Advance(milliseconds(3));
  EXPECT_EQ(responses_.Get(2).status.code(), StatusCode::kDeadlineExceeded);
  log_.OpenGate();
}

// The default timeout counts from when the request reached the server, not from Submit(): time
// spent reading and decoding it is inside its deadline.
TEST_F(SchedulerTest, DefaultTimeoutCountsFromArrival) {
  FakeClock& clock = fake_clock_;
  ModelConfig config = EchoConfig(8, Micros(0));
  config.dynamic_batching.default_timeout = Micros(3000);
  Start(config, clock);
  Occupy(1);
  auto late = Request(responses_, 2);
  late->arrived = clock.Now() - milliseconds(2);  // 1 ms of its 3 left.
  ASSERT_TRUE(scheduler_->Submit(std::move(late)).ok());
  Submit(3);  // Arrived now: all 3 ms left.
  clock.Advance(milliseconds(1));
  EXPECT_EQ(responses_.Get(2).status.code(), StatusCode::kDeadlineExceeded);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(3), 3);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 1}));  // Request 2 never ran.
}

// A request that arrived longer ago than the default timeout is refused at Submit() (the front
// answers 504 at once) and never queued.
TEST_F(SchedulerTest, ARequestWhoseDeadlinePassedBeforeSubmitIsRefused) {
  FakeClock& clock = fake_clock_;
  ModelConfig config = EchoConfig(8, Micros(0));
  config.dynamic_batching.default_timeout = Micros(3000);
  Start(config, clock);
  auto stale = Request(responses_, 1);
  stale->arrived = clock.Now() - milliseconds(4);
  EXPECT_EQ(scheduler_->Submit(std::move(stale)).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(responses_.Calls(1), 0);
  EXPECT_EQ(scheduler_->stats().queued_requests, 0);
  Submit(2);
  ExpectEchoed(responses_.Get(2), 2);
}

TEST_F(SchedulerTest, CancelWhileQueuedDropsTheRequestAndFreesItsSlot) {
  ModelConfig config = EchoConfig(8, Micros(0));
  config.dynamic_batching.max_queue_size = 1;
  Start(config);
  Occupy(1);
  RequestId queued = Submit(2);
  EXPECT_EQ(scheduler_->Submit(Request(responses_, 3)).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(scheduler_->Cancel(queued));
  EXPECT_EQ(responses_.Get(2).status.code(), StatusCode::kCancelled);
  EXPECT_FALSE(scheduler_->Cancel(queued));  // Already completed: nothing happens twice.
  EXPECT_EQ(scheduler_->stats().queued_samples, 0);
  Submit(4);  // The slot is free again.
  log_.OpenGate();
  ExpectEchoed(responses_.Get(4), 4);
  EXPECT_EQ(responses_.Calls(2), 1);
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 1}));
}

TEST_F(SchedulerTest, RunningRequestCannotBeCancelled) {
  Start(EchoConfig(8, Micros(0)));
  log_.CloseGate();
  RequestId running = Submit(1);
  log_.WaitForBatchesStarted(1);
  EXPECT_FALSE(scheduler_->Cancel(running));
  log_.OpenGate();
  ExpectEchoed(responses_.Get(1), 1);
}

TEST_F(SchedulerTest, StopDrainsQueuedRequests) {
  Start(EchoConfig(2, Micros(1'000'000)));
  Occupy(1, 2);  // A full batch goes at once.
  for (int tag = 2; tag <= 6; ++tag) Submit(tag);
  auto stopping = std::async(std::launch::async, [&] { scheduler_->Stop(StopMode::kDrain); });
  EXPECT_EQ(stopping.wait_for(milliseconds(20)), std::future_status::timeout);
  log_.OpenGate();
  stopping.get();
  ExpectEchoed(responses_.Get(1), 1, 2);
  for (int tag = 2; tag <= 6; ++tag) ExpectEchoed(responses_.Get(tag), tag);
  // The last request went alone at once: a stopping batcher does not wait for company.
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(scheduler_->Submit(Request(responses_, 7)).status().code(), StatusCode::kUnavailable);
}

// Instances spinning on an empty queue (instances.idle_spin_us) take requests as they come, a
// cancellation between them leaves nothing behind, and a stop ends the spins at once.
TEST_F(SchedulerTest, SpinningInstancesServeCancelAndStop) {
  ModelConfig config = EchoConfig(4, Micros(0), 2);
  config.instances.idle_spin = std::chrono::seconds(1000);
  Start(std::move(config));
  for (int tag = 1; tag <= 20; ++tag) {
    Submit(tag);
    ExpectEchoed(responses_.Get(tag), tag);
  }
  // A request cancelled before it runs is answered once, as cancelled; one that ran is not.
  log_.CloseGate();
  Submit(21);
  log_.WaitForBatchesStarted(21);
  Submit(22);
  const RequestId third = Submit(23);
  const bool cancelled = scheduler_->Cancel(third);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(21), 21);
  ExpectEchoed(responses_.Get(22), 22);
  if (cancelled) {
    EXPECT_EQ(responses_.Get(23).status.code(), StatusCode::kCancelled);
  } else {
    ExpectEchoed(responses_.Get(23), 23);
  }
  EXPECT_GE(scheduler_->stats().spin_catches, 1);
  auto stopping = std::async(std::launch::async, [&] { scheduler_->Stop(StopMode::kDrain); });
  EXPECT_EQ(stopping.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "a stop must end the instances' spins";
  for (int tag = 1; tag <= 23; ++tag) EXPECT_EQ(responses_.Calls(tag), 1) << tag;
}

TEST_F(SchedulerTest, StopWithRejectFailsQueuedRequestsWithUnavailable) {
  Start(EchoConfig(8, Micros(0)));
  Occupy(1);
  Submit(2);
  Submit(3);
  auto stopping = std::async(std::launch::async, [&] { scheduler_->Stop(StopMode::kReject); });
  EXPECT_EQ(responses_.Get(2).status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(responses_.Get(3).status.code(), StatusCode::kUnavailable);
  log_.OpenGate();
  stopping.get();
  ExpectEchoed(responses_.Get(1), 1);  // The running batch finishes.
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1}));
}

TEST_F(SchedulerTest, RefusesInputsThatDoNotMatchTheModel) {
  Start(EchoConfig(4, Micros(0)));
  auto check = [&](std::vector<Tensor> inputs, std::string_view expected) {
    auto request = std::make_unique<InferRequest>();
    request->inputs = std::move(inputs);
    request->done = responses_.Callback(99);
    auto id = scheduler_->Submit(std::move(request));
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find(expected), std::string::npos) << id.status().message();
  };
  check({}, "takes 1 input(s), got 0");
  check({Tensor::Zeros(DataType::kInt64, {1, 2})}, "datatype FP32 expected, got INT64");
  check({Tensor::Zeros(DataType::kFp32, {1, 3})}, "shape [1, 3] does not match [-1, 2]");
  check({Tensor::Zeros(DataType::kFp32, {2})}, "does not match");
  check({Tensor::Zeros(DataType::kFp32, {5, 2})}, "takes 1 to 4 (max_batch_size)");
  check({Tensor::Zeros(DataType::kFp32, {0, 2})}, "request has 0 samples");
  EXPECT_FALSE(responses_.Has(99));  // A refused request's callback never runs.
  ModelStatsSnapshot stats = scheduler_->stats();
  EXPECT_EQ(stats.rejected_requests, 6);
  EXPECT_EQ(stats.requests(StatusCode::kInvalidArgument), 6);
  EXPECT_EQ(stats.inflight_requests, 0);
}

TEST_F(SchedulerTest, StatisticsCountOutcomesBatchesAndTimes) {
  Start(EchoConfig(4, Micros(0)));
  Occupy(1);
  for (int tag = 2; tag <= 5; ++tag) Submit(tag);
  log_.OpenGate();
  for (int tag = 1; tag <= 5; ++tag) responses_.Get(tag);
  ModelStatsSnapshot s = scheduler_->stats();
  EXPECT_EQ(s.requests(StatusCode::kOk), 5);
  EXPECT_EQ(s.answered_requests(), 5);
  EXPECT_EQ(s.inflight_requests, 0);
  EXPECT_EQ(s.batches, 2);
  EXPECT_EQ(s.batch_size.count, 2u);
  EXPECT_DOUBLE_EQ(s.batch_size.sum, 5.0);
  // Buckets 1, 2, 4: one batch of 1, one of 4.
  EXPECT_EQ(s.batch_size.counts, (std::vector<uint64_t>{1, 0, 1, 0}));
  EXPECT_EQ(s.queue_seconds.count, 5u);
  EXPECT_EQ(s.request_seconds.count, 5u);
  EXPECT_EQ(s.compute_seconds.count, 2u);
  EXPECT_GT(s.busy_seconds, 0);
  EXPECT_EQ(s.instances, 1);
}

TEST_F(SchedulerTest, ThrowingCallbackDoesNotStopTheWorker) {
  Start(EchoConfig(1, Micros(0)));
  auto request = Request(responses_, 1);
  request->done = [](InferResponse&&) { throw std::runtime_error("caller bug"); };
  ASSERT_TRUE(scheduler_->Submit(std::move(request)).ok());
  Submit(2);
  ExpectEchoed(responses_.Get(2), 2);
}

class FailingAttachInstance : public EchoInstance {
 public:
  Status AttachToCurrentThread() override { return Status::Internal("no threads left"); }
};

TEST_F(SchedulerTest, ADeviceFailureStopsTheModelAndIsReportedOnce) {
  std::vector<std::shared_ptr<BackendInstance>> instances{std::make_shared<EchoInstance>(&log_)};
  std::atomic<int> reported{0};
  std::string why;
  auto started = ModelScheduler::Start(EchoConfig(8, Micros(0)), std::move(instances),
                                       Clock::Real(), [&](const Status& status) {
                                         why = status.message();
                                         ++reported;
                                       });
  ASSERT_TRUE(started.ok());
  scheduler_ = std::move(*started);
  Occupy(1);
  auto lost = Request(responses_, 2);
  lost->inputs[0].mutable_values<float>()[0] = testing::kDeviceLossMarker;
  ASSERT_TRUE(scheduler_->Submit(std::move(lost)).ok());
  Submit(3);
  Submit(4);
  log_.OpenGate();
  ExpectEchoed(responses_.Get(1), 1);
  // The batch of three fails on the device: each request gets its error, none is retried alone
  // (the device can run nothing more).
  for (int tag : {2, 3, 4}) {
    InferResponse response = responses_.Get(tag);
    EXPECT_EQ(response.status.code(), StatusCode::kUnavailable) << tag;
    EXPECT_NE(response.status.message().find("illegal memory access"), std::string::npos);
    EXPECT_EQ(responses_.Calls(tag), 1);
  }
  EXPECT_EQ(log_.batch_sizes(), (std::vector<int64_t>{1, 3}));
  // From now on the model takes nothing, saying why.
  Status failure = scheduler_->failure();
  EXPECT_EQ(failure.code(), StatusCode::kUnavailable);
  EXPECT_NE(failure.message().find("model 'echo' is not ready: GPU 0 failed"), std::string::npos)
      << failure.message();
  auto refused = scheduler_->Submit(Request(responses_, 5));
  EXPECT_EQ(refused.status().message(), failure.message());
  EXPECT_FALSE(responses_.Has(5));
  EXPECT_EQ(scheduler_->Admit().status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(reported.load(), 1);
  EXPECT_NE(why.find("illegal memory access"), std::string::npos);
}

TEST(SchedulerStartTest, InstanceThatCannotAttachFailsTheStart) {
  std::vector<std::shared_ptr<BackendInstance>> instances{
      std::make_shared<EchoInstance>(), std::make_shared<FailingAttachInstance>()};
  auto scheduler = ModelScheduler::Start(EchoConfig(4, Micros(0), 2), std::move(instances));
  ASSERT_FALSE(scheduler.ok());
  EXPECT_NE(scheduler.status().message().find("no threads left"), std::string::npos);
}

// Triton's instance_group without `gpus` runs on every GPU: the backend resolves them at load,
// and the engine starts count x GPUs x copy_slots workers and watches those GPUs.
TEST(EngineTest, AGpuGroupThatNamesNoGpusRunsOnThoseTheBackendLoadedOn) {
  EchoLog log;
  Engine engine([&](const ModelConfig&) -> Result<std::shared_ptr<Backend>> {
    return std::shared_ptr<Backend>(std::make_shared<EchoBackend>(&log, std::vector<int>{0, 1}));
  });
  ModelConfig config = EchoConfig(4, Micros(0));
  config.instances.device = "cuda";
  config.instances.gpu_source_key = "instance_group[0].kind";
  config.instances.copy_slots = 2;
  ASSERT_EQ(config.instances.workers(), 2) << "one GPU counted before the load";
  ASSERT_TRUE(engine.AddModel(config).ok());
  EXPECT_EQ(log.attached(), 4);
  EXPECT_EQ(engine.Find("echo")->config().instances.gpus, (std::vector<int>{0, 1}));
  // GPUs the config names are kept as they are.
  EchoBackend backend(&log, {0, 1});
  config.instances.gpus = {1};
  EXPECT_EQ(LoadedConfig(config, backend).instances.gpus, (std::vector<int>{1}));
}

TEST(EngineTest, RegistryFindsSubmitsAndRemovesModels) {
  EchoLog log;
  int loads = 0;
  Engine engine([&](const ModelConfig& config) -> Result<std::shared_ptr<Backend>> {
    ++loads;
    if (config.name == "broken") return Status::Internal("cannot read model.pt");
    return std::shared_ptr<Backend>(std::make_shared<EchoBackend>(&log));
  });
  ModelConfig config = EchoConfig(4, Micros(0), 2);
  ASSERT_TRUE(engine.AddModel(config).ok());
  EXPECT_EQ(log.attached(), 2);
  EXPECT_EQ(engine.AddModel(config).code(), StatusCode::kInvalidArgument);
  ModelConfig broken = config;
  broken.name = "broken";
  EXPECT_EQ(engine.AddModel(broken).message(), "cannot read model.pt");
  EXPECT_EQ(engine.ModelNames(), (std::vector<std::string>{"echo"}));

  Responses responses;
  EXPECT_TRUE(engine.Submit("echo", Request(responses, 1)).ok());
  ExpectEchoed(responses.Get(1), 1);
  EXPECT_EQ(engine.Submit("nope", Request(responses, 2)).status().code(), StatusCode::kNotFound);

  std::shared_ptr<ModelScheduler> held = engine.Find("echo");
  ASSERT_TRUE(engine.RemoveModel("echo").ok());
  EXPECT_EQ(engine.Find("echo"), nullptr);
  EXPECT_EQ(engine.RemoveModel("echo").code(), StatusCode::kNotFound);
  // A holder of the removed model gets a clean refusal, not a crash.
  EXPECT_EQ(held->Submit(Request(responses, 3)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(loads, 2);  // The duplicate was refused before loading.
}

}  // namespace
}  // namespace sluice
