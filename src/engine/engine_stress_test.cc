// Randomised multi-threaded stress of the scheduler: thousands of requests from several producer
// threads, random sizes, deadlines, cancellations, failing inputs, a small queue that overflows,
// and a stop in either mode at the end. Every accepted request must complete exactly once, with
// its own rows when it succeeds; nothing refused, cancelled or expired may ever run. Also built in
// the tsan preset (make test-tsan) to check the locking.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "engine/fake_backends.h"
#include "engine/model_scheduler.h"

namespace sluice {
namespace {

constexpr int kProducers = 4;
constexpr int kRequestsPerProducer = 2000;
constexpr int kTotal = kProducers * kRequestsPerProducer;

// Echo that records which requests it ran (the first value of each row holds the request's tag).
class RecordingInstance : public testing::EchoInstance {
 public:
  explicit RecordingInstance(std::mutex* mu, std::multiset<int>* ran) : mu_(mu), ran_(ran) {}
  Result<std::vector<Tensor>> Run(const std::vector<Tensor>& inputs) override {
    auto outputs = EchoInstance::Run(inputs);
    if (outputs.ok()) {
      std::lock_guard lock(*mu_);
      const Tensor& x = inputs[0];
      for (int64_t row = 0; row < x.shape()[0]; ++row) {
        int tag = static_cast<int>(x.values<float>()[static_cast<size_t>(row * x.shape()[1])]);
        if (row == 0 ||
            tag != static_cast<int>(
                       x.values<float>()[static_cast<size_t>((row - 1) * x.shape()[1])])) {
          ran_->insert(tag);
        }
      }
    }
    return outputs;
  }

 private:
  std::mutex* mu_;
  std::multiset<int>* ran_;
};

struct Outcome {
  std::atomic<int> calls{0};
  std::atomic<bool> accepted{false};
  StatusCode code = StatusCode::kOk;  // Written by the single callback call.
  bool rows_ok = false;
  bool poisoned = false;
  uint64_t batch_id = 0;
};

void RunStress(StopMode stop_mode, uint32_t seed) {
  ModelConfig config;
  config.name = "stress";
  config.max_batch_size = 8;
  config.dynamic_batching.max_queue_delay = Micros(200);
  config.dynamic_batching.preferred_batch_sizes = {4};
  config.dynamic_batching.max_queue_size = 48;
  config.instances.count = 3;
  config.instances.threads = 1;
  config.inputs = {{"x", DataType::kFp32, {2}}};
  config.outputs = {{"y", DataType::kFp32, {2}}};

  std::mutex ran_mu;
  std::multiset<int> ran;
  std::vector<std::shared_ptr<BackendInstance>> instances;
  for (int i = 0; i < config.instances.count; ++i) {
    instances.push_back(std::make_shared<RecordingInstance>(&ran_mu, &ran));
  }
  auto started = ModelScheduler::Start(config, std::move(instances));
  ASSERT_TRUE(started.ok()) << started.status().message();
  std::unique_ptr<ModelScheduler> scheduler = std::move(*started);

  std::vector<Outcome> outcomes(kTotal);
  std::mutex ids_mu;
  std::vector<RequestId> recent_ids;
  std::atomic<bool> producing{true};

  auto produce = [&](int producer) {
    std::mt19937 rng(seed * 31 + static_cast<uint32_t>(producer));
    std::uniform_int_distribution<int> samples_dist(1, 3), percent(0, 99), delay_us(0, 1500);
    for (int i = 0; i < kRequestsPerProducer; ++i) {
      const int tag = producer * kRequestsPerProducer + i;
      Outcome& outcome = outcomes[static_cast<size_t>(tag)];
      const int64_t samples = samples_dist(rng);
      auto request = std::make_unique<InferRequest>();
      Tensor x = Tensor::Zeros(DataType::kFp32, {samples, 2});
      auto values = x.mutable_values<float>();
      for (int64_t row = 0; row < samples; ++row) {
        values[static_cast<size_t>(row * 2)] = static_cast<float>(tag);
        values[static_cast<size_t>(row * 2 + 1)] = static_cast<float>(row);
      }
      if (percent(rng) < 2) {
        values[1] = testing::kFailMarker;
        outcome.poisoned = true;
      }
      request->inputs.push_back(x);
      if (percent(rng) < 30) {
        request->deadline = Clock::Real().Now() + Micros(delay_us(rng));
      }
      request->done = [&outcome, x, samples](InferResponse&& response) {
        outcome.code = response.status.code();
        outcome.batch_id = response.batch_id;
        if (response.status.ok() && response.outputs.size() == 1) {
          const Tensor& y = response.outputs[0];
          outcome.rows_ok = y.shape() == Shape{samples, 2} &&
                            std::equal(y.values<float>().begin(), y.values<float>().end(),
                                       x.values<float>().begin());
        }
        outcome.calls.fetch_add(1);
      };
      const bool cancel_at_once = percent(rng) < 10;
      auto id = scheduler->Submit(std::move(request));
      if (id.ok()) {
        outcome.accepted = true;
        // Usually still queued, waiting for company: the producer changes its mind at once.
        if (cancel_at_once) {
          scheduler->Cancel(*id);
          continue;
        }
        std::lock_guard lock(ids_mu);
        recent_ids.push_back(*id);
      } else if (id.status().code() == StatusCode::kUnavailable) {
        std::this_thread::yield();  // Back off, as a client told to retry later would.
      }
    }
  };

  // Cancels random recently submitted requests while the producers run.
  std::thread canceller([&] {
    std::mt19937 rng(seed);
    while (producing.load()) {
      RequestId id = 0;
      {
        std::lock_guard lock(ids_mu);
        if (!recent_ids.empty()) {
          size_t index = std::uniform_int_distribution<size_t>(0, recent_ids.size() - 1)(rng);
          id = recent_ids[index];
          recent_ids[index] = recent_ids.back();
          recent_ids.pop_back();
        }
      }
      if (id != 0) scheduler->Cancel(id);
      std::this_thread::yield();
    }
  });

  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) producers.emplace_back(produce, p);
  for (std::thread& t : producers) t.join();
  producing = false;
  canceller.join();
  scheduler->Stop(stop_mode);

  int accepted = 0;
  std::map<StatusCode, int> by_code;
  for (int tag = 0; tag < kTotal; ++tag) {
    const Outcome& o = outcomes[static_cast<size_t>(tag)];
    if (!o.accepted) {
      EXPECT_EQ(o.calls.load(), 0) << "refused request " << tag << " was completed";
      EXPECT_EQ(ran.count(tag), 0u) << "refused request " << tag << " ran";
      continue;
    }
    ++accepted;
    ASSERT_EQ(o.calls.load(), 1) << "request " << tag;
    ++by_code[o.code];
    switch (o.code) {
      case StatusCode::kOk:
        EXPECT_TRUE(o.rows_ok) << "request " << tag << " got someone else's rows";
        EXPECT_FALSE(o.poisoned);
        break;
      case StatusCode::kInternal:
        EXPECT_TRUE(o.poisoned) << "request " << tag << " failed with its neighbour";
        break;
      case StatusCode::kCancelled:
      case StatusCode::kDeadlineExceeded:
      case StatusCode::kUnavailable:
        EXPECT_EQ(o.batch_id, 0u);
        EXPECT_EQ(ran.count(tag), 0u) << "request " << tag << " ran after leaving the queue";
        break;
      default:
        ADD_FAILURE() << "request " << tag << ": unexpected " << StatusCodeName(o.code);
    }
  }
  if (stop_mode == StopMode::kDrain) {
    EXPECT_EQ(by_code[StatusCode::kUnavailable], 0);
  }
  // Paths that do not depend on the machine's timing; the overflow and failure paths are
  // checked above request by request whenever they happen.
  EXPECT_GT(by_code[StatusCode::kOk], 0);
  EXPECT_GT(by_code[StatusCode::kCancelled], 0);

  ModelStatsSnapshot stats = scheduler->stats();
  EXPECT_EQ(stats.answered_requests(), kTotal);
  EXPECT_EQ(stats.rejected_requests, kTotal - accepted);
  EXPECT_EQ(stats.inflight_requests, 0);
  EXPECT_EQ(stats.queued_requests, 0);
  EXPECT_EQ(stats.requests(StatusCode::kOk), by_code[StatusCode::kOk]);
  EXPECT_EQ(stats.requests(StatusCode::kCancelled), by_code[StatusCode::kCancelled]);
}

TEST(EngineStressTest, ExactlyOnceCompletionWithDrainingStop) { RunStress(StopMode::kDrain, 1); }

TEST(EngineStressTest, ExactlyOnceCompletionWithRejectingStop) { RunStress(StopMode::kReject, 2); }

}  // namespace
}  // namespace sluice
